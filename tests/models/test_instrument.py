"""Gain concentration on known gains; captured attention I/O checked against a finite difference of the loss."""

import pytest
import torch

from deltamatch.kernels.measures import residual_summary
from deltamatch.models import HybridForCausalLM, get_config
from deltamatch.models.instrument import attention_gains, capture_attention_io, gain_concentration


def test_gain_concentration_known_cases():
    share, top = gain_concentration(torch.ones(8), torch.ones(8))
    assert share == pytest.approx(1 / 8)
    q = torch.ones(8)
    q[5] = 3.0
    share, top = gain_concentration(q, torch.ones(8), top_k=3)
    assert share == pytest.approx(9 / (9 + 7)) and top[0] == 5
    per_head = torch.stack([q, q])  # (H, D): averaged over heads first
    assert gain_concentration(per_head, torch.ones(2, 8))[0] == pytest.approx(9 / 16)
    with pytest.raises(ValueError, match="gains"):
        gain_concentration(torch.ones(8), torch.ones(4))


def test_capture_attention_io_gives_the_loss_gradient_of_the_core_output():
    torch.manual_seed(0)
    model = HybridForCausalLM(get_config("tiny", vocab_size=128, attn_method="bf16", num_hidden_layers=8))
    x = torch.randint(0, 128, (1, 24))
    io = capture_attention_io(model, x, x)
    assert sorted(io) == sorted(attention_gains(model)) == [3, 7]
    q, k, v, do = io[7]
    assert q.shape == (1, 24, 4, 32) and k.shape == v.shape == (1, 24, 2, 32) and do.shape == q.shape
    assert all(p.grad is None for p in model.parameters())

    # d loss along a random direction r added to layer 7's core output == <dO, r>
    direction = torch.randn_like(do)

    def loss_with(eps):
        core = dict(model.attention_layers())[7].core
        handle = core.register_forward_hook(lambda m, a, out: out + eps * direction.to(out.dtype))
        try:
            with torch.no_grad(), torch.enable_grad():  # grad mode on: the same core as training
                return model(x, labels=x, use_cache=False).loss.item()
        finally:
            handle.remove()

    eps = 1e-2
    slope = (loss_with(eps) - loss_with(-eps)) / (2 * eps)
    assert slope == pytest.approx(float((do * direction).sum()), rel=2e-2)

    summary = residual_summary(q, k, v, do)
    assert summary["matched"]["before_cast"] < summary["stale"]["before_cast"]
