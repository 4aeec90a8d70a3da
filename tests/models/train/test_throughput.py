"""Model FLOPs per token (the MFU numerator) against a count by hand, and the CPU keeping the plain twins."""

import torch

from deltamatch.models import HybridForCausalLM, get_config
from deltamatch.models.layers.fused import fused_enabled, use_fused
from deltamatch.models.train.throughput import flops_per_token, peak_tflops


def test_flops_per_token_counts_matmul_params_and_causal_attention():
    config = get_config("tiny", vocab_size=512)
    model = HybridForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    embedding = 512 * config.hidden_size
    attention_layers = sum(1 for kind in config.layer_pattern if kind == "gqa")
    expected = 6 * (params - embedding) + attention_layers * 6 * 256 * config.num_attention_heads * config.head_dim
    assert flops_per_token(model, 256) == expected


def test_peak_is_unknown_on_the_cpu_unless_given(monkeypatch):
    monkeypatch.delenv("DELTAMATCH_PEAK_TFLOPS", raising=False)
    assert peak_tflops(torch.device("cpu")) is None
    monkeypatch.setenv("DELTAMATCH_PEAK_TFLOPS", "123.5")
    assert peak_tflops(torch.device("cpu")) == 123.5


def test_the_cpu_runs_the_plain_twins_even_when_fused_is_asked_for():
    x = torch.zeros(2, 3)
    assert not fused_enabled(x)
    with use_fused(True):
        assert not fused_enabled(x)
    model = HybridForCausalLM(get_config("tiny", vocab_size=512)).eval()
    ids = torch.randint(0, 512, (1, 33))
    out = model(input_ids=ids, labels=ids)
    assert out.logits is not None and out.logits.shape == (1, 33, 512)  # the logits path, as before
