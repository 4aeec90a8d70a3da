"""The pure-torch Gated DeltaNet against fla's naive references: outputs and every gradient, odd lengths."""

import pytest
import torch
import torch.nn.functional as F

from numerics import assert_close

from deltamatch.models.layers.gdn import (GatedDeltaNet, chunk_gated_delta_rule, l2_normalize, unit_lower_inverse,
                                          use_gdn_backend)

naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")


@pytest.mark.parametrize("C", [1, 2, 17, 64])
def test_unit_lower_inverse_matches_linalg_inv(C):
    strict = (torch.randn(3, C, C, dtype=torch.float64, generator=torch.Generator().manual_seed(C)) * 0.3).tril(-1)
    expected = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + strict)
    torch.testing.assert_close(unit_lower_inverse(strict), expected, rtol=1e-12, atol=1e-12)


def correlated_keys(n, T, K, sim, gen, dtype=torch.float64):
    """Unit keys ``sim * u + (1 - sim) * noise`` around one shared direction u: what training makes of a head's keys
    (cosines near ``sim``-dependent values up to 1), unlike random keys (cosines ~ K^-1/2)."""
    u = torch.randn(n, 1, K, generator=gen, dtype=dtype)
    return l2_normalize(sim * u + (1 - sim) * torch.randn(n, T, K, generator=gen, dtype=dtype))


@pytest.mark.parametrize("decay", [0.0, 0.02, 1.0])
@pytest.mark.parametrize("beta", [0.5, 0.9, 1.0])
@pytest.mark.parametrize("sim", [0.0, 0.5, 0.9, 1.0])
def test_unit_lower_inverse_is_fp32_accurate_on_correlated_keys(sim, beta, decay):
    """The WY inverse of one chunk (C = 64, K = 128) in FP32 against an FP64 triangular solve. The true inverse's
    entries stay <= 1 here, so FP32 round-off (~1e-7) is the bar; a power series in A misses it by up to 1e9."""
    C, gen = 64, torch.Generator().manual_seed(0)
    k = correlated_keys(8, C, 128, sim, gen)
    b = beta * (0.9 + 0.1 * torch.rand(8, C, generator=gen, dtype=torch.float64))
    g = (-decay * torch.rand(8, C, generator=gen, dtype=torch.float64)).cumsum(-1)
    gamma = (g[:, :, None] - g[:, None, :]).tril().exp().tril()
    strict = ((k * b[..., None]) @ k.transpose(-1, -2) * gamma).tril(-1)
    eye = torch.eye(C, dtype=torch.float64).expand_as(strict)
    expected = torch.linalg.solve_triangular(eye + strict, eye, upper=False, unitriangular=True)
    assert_close(unit_lower_inverse(strict.float()), expected, 1e-6)


def test_unit_lower_inverse_gradient_matches_finite_differences():
    """C = 19 in blocks of 8: three block rows, the last one padded."""
    strict = (torch.randn(19, 19, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 0.3).tril(-1)
    strict.requires_grad_()
    assert torch.autograd.gradcheck(lambda a: unit_lower_inverse(a.tril(-1), block=8), (strict,), fast_mode=True)


def recurrent_reference(q, k, v, g, beta, h0, scale=None):
    """The gated delta rule token by token in FP64, straight from the module docstring's recurrence."""
    q, k, v, g, beta, h0 = (t.double() for t in (q, k, v, g, beta, h0))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    state, outputs = h0, []
    for t in range(q.shape[1]):
        decayed = state * g[:, t, :, None, None].exp()  # (B, H, K, V)
        k_t, v_t = k[:, t], v[:, t]  # (B, H, K), (B, H, V)
        correction = v_t - torch.einsum("bhk,bhkv->bhv", k_t, decayed)
        state = decayed + beta[:, t, :, None, None] * k_t[..., :, None] * correction[..., None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state))
    return torch.stack(outputs, 1), state


@pytest.mark.parametrize("w", [0.0, 0.3, 0.5, 0.9, 1.0])
def test_chunk_rule_matches_fp64_recurrence_on_correlated_keys(w):
    """The whole chunked rule (FP32) and every gradient against the FP64 recurrence: B 1, T 256, H 2, K = V = 64,
    beta ~ 0.9, mild decay, keys pulled toward one direction by w (the old power-series inverse gave 1.8e5 relative
    error at w = 0.5 and 3e34 at 0.9 here)."""
    B, T, H, K, gen = 1, 256, 2, 64, torch.Generator().manual_seed(2)
    k = correlated_keys(B * H, T, K, w, gen).reshape(B, H, T, K).transpose(1, 2).float()
    q = l2_normalize(torch.randn(B, T, H, K, generator=gen))
    v = torch.randn(B, T, H, K, generator=gen)
    g = -0.02 * torch.rand(B, T, H, generator=gen)
    beta = 0.85 + 0.1 * torch.rand(B, T, H, generator=gen)
    h0 = 0.1 * torch.randn(B, H, K, K, generator=gen)
    inputs = [t.requires_grad_() for t in (q, k, v, g, beta, h0)]
    o, hT = chunk_gated_delta_rule(*inputs[:5], initial_state=inputs[5])
    o_ref, hT_ref = recurrent_reference(*inputs)
    assert_close(o, o_ref, 1e-5, "o")
    assert_close(hT, hT_ref, 1e-5, "final state")
    do, dh = torch.randn_like(o), torch.randn_like(hT)
    grads = torch.autograd.grad((o * do).sum() + (hT * dh).sum(), inputs)
    grads_ref = torch.autograd.grad((o_ref * do).sum() + (hT_ref * dh).sum(), inputs)
    for name, a, b in zip("q k v g beta h0".split(), grads, grads_ref):
        assert_close(a, b, 1e-4, name)


def _inputs(B, T, H, K, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(B, T, H, K, generator=g))
    k = l2_normalize(torch.randn(B, T, H, K, generator=g))
    v = torch.randn(B, T, H, V, generator=g)
    gate = -torch.rand(B, T, H, generator=g) * 0.5  # log decay
    beta = torch.rand(B, T, H, generator=g)
    h0 = torch.randn(B, H, K, V, generator=g) * 0.1
    return [t.requires_grad_() for t in (q, k, v, gate, beta, h0)]


@pytest.mark.parametrize("T,chunk", [(63, 16), (1, 64), (130, 64)])
def test_chunk_rule_matches_naive_recurrent(T, chunk):
    q, k, v, g, beta, h0 = _inputs(2, T, 3, 16, 24)
    o, hT = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, chunk_size=chunk)
    o_ref, hT_ref = naive.naive_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True)
    assert_close(o, o_ref, 1e-5, "o")
    assert_close(hT, hT_ref, 1e-5, "final state")

    do, dh = torch.randn_like(o), torch.randn_like(hT)
    grads = torch.autograd.grad((o * do).sum() + (hT * dh).sum(), (q, k, v, g, beta, h0))
    grads_ref = torch.autograd.grad((o_ref * do).sum() + (hT_ref * dh).sum(), (q, k, v, g, beta, h0))
    for name, a, b in zip("q k v g beta h0".split(), grads, grads_ref):
        assert_close(a, b, 1e-4, name)


def _reference_layer(layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
    """The GDN layer written out from fla's naive pieces (gate, recurrence) and its documented structure."""
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate

    B, T, _ = x.shape

    def conv(proj, conv1d):
        padded = F.pad(proj(x).transpose(1, 2), (conv1d.weight.shape[-1] - 1, 0))
        y = F.conv1d(padded, conv1d.weight, groups=proj.out_features)
        return F.silu(y).transpose(1, 2)

    H, K, V = layer.num_heads, layer.head_k_dim, layer.head_v_dim
    q = F.normalize(conv(layer.q_proj, layer.q_conv1d).reshape(B, T, H, K), dim=-1, eps=1e-12)
    k = F.normalize(conv(layer.k_proj, layer.k_conv1d).reshape(B, T, H, K), dim=-1, eps=1e-12)
    v = conv(layer.v_proj, layer.v_conv1d).reshape(B, T, H, V)
    g = naive_gdn_gate(layer.a_proj(x), layer.A_log, layer.dt_bias)
    o, _ = naive.naive_recurrent_gated_delta_rule(q, k, v, layer.b_proj(x).sigmoid(), g)
    gate = layer.g_proj(x).reshape(B, T, H, V)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + layer.o_norm.eps) * layer.o_norm.weight * F.silu(gate)
    return layer.o_proj(o.reshape(B, T, H * V))


def test_layer_matches_naive_composition_with_all_parameter_gradients():
    torch.manual_seed(0)
    layer = GatedDeltaNet(hidden_size=64, num_heads=2, head_dim=16, expand_v=2)
    with torch.no_grad():
        layer.o_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 63, 64, requires_grad=True)
    with use_gdn_backend("torch"):
        y = layer(x)
    y_ref = _reference_layer(layer, x)
    assert_close(y, y_ref, 1e-4)
    dy = torch.randn_like(y)
    params = [x, *layer.parameters()]
    names = ["x", *(n for n, _ in layer.named_parameters())]
    for name, a, b in zip(names, torch.autograd.grad(y, params, dy), torch.autograd.grad(y_ref, params, dy)):
        assert_close(a, b, 1e-3, name)


def test_parameter_names_and_shapes_match_fla_layer():
    from fla.layers import GatedDeltaNet as FlaGatedDeltaNet

    ours = GatedDeltaNet(hidden_size=64, num_heads=2, head_dim=16, expand_v=2)
    theirs = FlaGatedDeltaNet(hidden_size=64, num_heads=2, head_dim=16, expand_v=2)
    shapes = {n: tuple(t.shape) for n, t in ours.state_dict().items()}
    assert shapes == {n: tuple(t.shape) for n, t in theirs.state_dict().items()}
    theirs.load_state_dict(ours.state_dict())  # and back: a checkpoint moves both ways
    ours.load_state_dict(theirs.state_dict())


def test_cached_decoding_equals_full_sequence():
    from transformers.cache_utils import DynamicCache

    from deltamatch.models import HybridConfig

    torch.manual_seed(0)
    config = HybridConfig(num_hidden_layers=1, layer_pattern=["gdn"], hidden_size=64, gdn_num_heads=2, gdn_head_dim=16)
    layer = GatedDeltaNet(hidden_size=64, num_heads=2, head_dim=16, layer_idx=0)
    x = torch.randn(2, 21, 64)
    with torch.no_grad():
        full = layer(x)
        cache = DynamicCache(config=config)
        parts = [layer(x[:, :6], cache=cache)]  # prefill, then one token at a time
        parts += [layer(x[:, t : t + 1], cache=cache) for t in range(6, 21)]
    assert_close(torch.cat(parts, 1), full, 1e-5)


def test_chunk_rule_stays_fp32_under_bf16_autocast():
    """The trainer runs the twin under bf16 autocast on GPUs where fla refuses its backward; it must not drop to BF16."""
    gen = torch.Generator().manual_seed(0)
    q, k = (l2_normalize(torch.randn(1, 150, 2, 32, generator=gen)) for _ in range(2))
    v = torch.randn(1, 150, 2, 48, generator=gen)
    g, beta = -torch.rand(1, 150, 2, generator=gen) * 0.1, torch.rand(1, 150, 2, generator=gen)
    ref, ref_state = chunk_gated_delta_rule(q, k, v, g, beta)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = chunk_gated_delta_rule(q, k, v, g, beta)
    assert out.dtype == torch.float32 and torch.equal(out, ref) and torch.equal(state, ref_state)
