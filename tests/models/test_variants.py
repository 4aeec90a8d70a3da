"""The paper's variants on the tiny model: KDA, MLA and Mamba-2 hybrids, pure GQA, head dim 256, NoPE, no QK-norm."""

import pytest
import torch

from deltamatch.models import HybridForCausalLM, get_config
from deltamatch.models.layers.kda import KimiDeltaAttention

VOCAB = 128
VARIANTS = {
    "kda": dict(linear_mixer="kda"),
    "mla": dict(attn_mixer="mla"),
    "mamba2": dict(linear_mixer="mamba2"),
    "pure_gqa": dict(attn_every=1, num_hidden_layers=2),
    "head_dim_256": dict(head_dim=256),
    "nope": dict(rope=False),
    "no_qk_norm": dict(qk_norm=False),
}


def build(**overrides) -> HybridForCausalLM:
    torch.manual_seed(0)
    return HybridForCausalLM(get_config("tiny", vocab_size=VOCAB, **overrides))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_trains_round_trips_and_generates_with_cache(name, tmp_path):
    model = build(attn_method="matched", **VARIANTS[name])
    x = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(1))
    loss = model(x, labels=x).loss
    loss.backward()
    for param_name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), param_name

    model.save_pretrained(tmp_path)
    loaded = HybridForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_pattern == model.config.layer_pattern
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))

    cached = loaded.generate(x, max_new_tokens=2, do_sample=False, use_cache=True, pad_token_id=0)
    uncached = loaded.generate(x, max_new_tokens=2, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(cached, uncached)


def test_variant_layer_patterns():
    assert get_config("tiny", linear_mixer="kda").layer_pattern == ["kda", "kda", "kda", "gqa"]
    assert get_config("tiny", attn_mixer="mla").layer_pattern == ["gdn", "gdn", "gdn", "mla"]
    assert get_config("2.58B-gqa").layer_pattern == ["gqa"] * 32
    assert build(attn_mixer="mla").attention_layers()[0][1].q_norm.weight.shape == (32,)


def test_nope_ignores_positions_and_rope_does_not():
    x = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    scrambled = torch.randperm(20, generator=torch.Generator().manual_seed(3))[None]
    for rope, changes in ((False, False), (True, True)):
        model = build(rope=rope, attn_every=1, num_hidden_layers=1).eval()
        with torch.no_grad():
            a, b = model(x).logits, model(x, position_ids=scrambled).logits
        assert (not torch.allclose(a, b, atol=1e-5)) == changes


def test_kda_parameters_match_fla_layer():
    from fla.layers import KimiDeltaAttention as FlaKimiDeltaAttention

    ours = KimiDeltaAttention(64, 2, 16, expand_v=2)
    theirs = FlaKimiDeltaAttention(hidden_size=64, num_heads=2, head_dim=16, expand_v=2)
    assert {n: t.shape for n, t in ours.state_dict().items()} == {n: t.shape for n, t in theirs.state_dict().items()}
    theirs.load_state_dict(ours.state_dict())
