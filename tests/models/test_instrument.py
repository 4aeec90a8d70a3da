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


def test_delta_error_effects_sharpen_exactly_the_rows_a_step_sharpens():
    """Independent check: adding a small descent step of the δ error, ε·(δ_X − δ)_i·P_ij, to each row's logits lowers
    the row's entropy exactly where the measure says "sharpened"; the per-channel push equals autograd's gradient of
    <E, S(g)> with respect to a gain g on every QK channel."""
    from deltamatch.kernels.reference import probe_backward
    from deltamatch.models.instrument import delta_error_effects

    torch.manual_seed(0)
    B, N, H, Hkv, D = 1, 48, 2, 1, 16
    q = (torch.randn(B, N, H, D) * 3).to(torch.bfloat16)  # a wide logit spread, as in trained layers
    k = (torch.randn(B, N, Hkv, D) * 3 + torch.randn(1, 1, 1, D)).to(torch.bfloat16)  # correlated keys
    v, do = torch.randn(B, N, Hkv, D).to(torch.bfloat16), torch.randn(B, N, H, D).to(torch.bfloat16)
    effects = delta_error_effects(q, k, v, do)
    assert set(effects) == {"stale", "consistent"}
    probes = probe_backward(q, k, v, do)
    scale = D**-0.5
    qf, kf = q.double(), k.double().repeat_interleave(H // Hkv, dim=2)
    logits = scale * torch.einsum("bihc,bjhc->bhij", qf, kf)
    logits = logits.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
    p = logits.softmax(-1)

    def entropy(s):
        lp = s.log_softmax(-1)
        return -(lp.exp() * lp.nan_to_num(neginf=0.0)).sum(-1)

    for kind in ("stale", "consistent"):
        shift = (probes[kind].delta - probes["matched"].delta).double()
        eps = 1e-3 / shift.abs().max()
        stepped = logits + eps * shift[..., None] * p
        lower = (entropy(stepped) < entropy(logits))[..., 1:]
        moved = shift[..., 1:] != 0
        assert float((lower & moved).double().mean()) == pytest.approx(effects[kind]["sharpened"])
        assert effects[kind]["sharpened"] + effects[kind]["flattened"] == pytest.approx(float(moved.double().mean()))

        error = (probes[kind].ds_before_cast - probes["matched"].ds_before_cast).double()
        gain = torch.ones(D, dtype=torch.float64, requires_grad=True)
        s_of_gain = scale * torch.einsum("bihc,bjhc->bhij", qf * gain, kf)
        (grad,) = torch.autograd.grad((error * s_of_gain).sum(), gain)
        expected = grad / grad.abs().sum()
        assert torch.allclose(torch.tensor(effects[kind]["push"], dtype=torch.float64), expected, atol=1e-5)
        consistency = torch.tensor(effects[kind]["push_consistency_per_channel"])
        assert ((consistency >= 0) & (consistency <= 1 + 1e-9)).all()
