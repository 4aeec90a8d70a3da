"""The reference numerics against FP64 exact attention, and the invariant each δ does or does not keep."""

import pytest
import torch

from deltamatch.kernels.measures import relative_error, rowsum_residual
from deltamatch.kernels.reference import attention_exact, attention_reference, probe_backward, quantization_disabled
from deltamatch.methods import METHODS, get_method, implemented_by
from numerics import rne_e4m3_fp64

ALL_METHODS = implemented_by("reference")
FP8_METHODS = tuple(m for m in ALL_METHODS if METHODS[m].fp8)


def make(b=1, n=130, h=4, hk=2, d=32, spread=2.0, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, h, d, generator=gen) * spread**0.5
    k = torch.randn(b, n, hk, d, generator=gen) * spread**0.5
    v = torch.randn(b, n, hk, d, generator=gen)
    do = torch.randn(b, n, h, d, generator=gen)
    return [t.to(dtype) for t in (q, k, v, do)]


def run(method, q, k, v, do, causal=True):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = attention_reference(q, k, v, causal, method)
    o.backward(do)
    return o, q.grad, k.grad, v.grad


def exact(q, k, v, do, causal=True):
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    o = attention_exact(q, k, v, causal)
    o.backward(do.double())
    return o, q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_forward_and_gradients_against_fp64(method, causal):
    q, k, v, do = make()
    ours, ref = run(method, q, k, v, do, causal), exact(q, k, v, do, causal)
    low, high = (1e-4, 2e-2) if method == "bf16" else (1e-2, 0.2)  # BF16 vs FP8 (3 mantissa bits) bands
    for name, x, r in zip(("o", "dq", "dk", "dv"), ours, ref):
        assert torch.isfinite(x).all(), name
        assert low < relative_error(x, r) < high, (name, relative_error(x, r))


def test_bf16_inputs_and_output_dtype():
    q, k, v, do = make(dtype=torch.bfloat16)
    o, dq, dk, dv = run("matched", q, k, v, do)
    assert o.dtype == dq.dtype == dk.dtype == dv.dtype == torch.bfloat16
    assert relative_error(o, exact(q, k, v, do)[0]) < 0.2


def test_matched_rowsums_at_fp32_roundoff_stale_and_consistent_well_above():
    q, k, v, do = make(n=256, spread=4.0)
    probes = probe_backward(q, k, v, do, causal=True)
    before = {kind: rowsum_residual(p.ds_before_cast) for kind, p in probes.items()}
    assert before["matched"] < 1e-6
    assert before["stale"] > 1e-3 and before["consistent"] > 1e-4
    assert before["stale"] > 100 * before["matched"] and before["consistent"] > 100 * before["matched"]
    # the cast itself leaves a residual for every δ, and matched's is the smallest
    after = {kind: rowsum_residual(p.ds_after_cast) for kind, p in probes.items()}
    assert after["matched"] > 1e-4 and after["matched"] < after["stale"]


def test_matched_delta_is_rowsum_of_p_times_dp_in_fp64():
    q, k, v, do = make(n=70)
    p = probe_backward(q, k, v, do)["matched"]
    ds = p.ds_before_cast.double()
    # dS = P (dP - δ) with δ = Σ_j P dP  ⇔  Σ_j dS = 0: check δ reproduces it in FP64
    assert ds.sum(-1).abs().max() < 1e-5 * ds.abs().sum(-1).max()


@pytest.mark.parametrize("method", ["matched", "matched_factored"])
def test_the_forward_pv_delta_reassociates_matched_and_keeps_its_row_sums_to_the_operands_rounding(method):
    """δ = rowsum(dÔ ⊙ P V̂) (``FORWARD_PV_KINDS``, a proposal to drop the δ pass) is matched's Σ_j P dP̂ reassociated:
    with P exact it is matched's δ to FP32 round-off, and P rounded as a TF32 or BF16 operand leaves a row-sum residual
    of dS below that operand's unit roundoff (2^-11, 2^-8) yet well above matched's, so the rounding is applied. After
    dS's FP8 cast, TF32 is within 5% of matched's residual and BF16 within 15%, where consistent's is above both."""
    q, k, v, do = make(n=256, spread=4.0)
    probes = probe_backward(q, k, v, do, method=method,
                            kinds=("consistent", "matched", "pv_fp32", "pv_tf32", "pv_bf16"))
    matched = probes["matched"].delta.double()
    assert relative_error(probes["pv_fp32"].delta, matched) < 1e-5
    before = {kind: rowsum_residual(p.ds_before_cast) for kind, p in probes.items()}
    assert before["pv_fp32"] < 1e-6
    assert 10 * before["matched"] < before["pv_tf32"] < 2.0**-11
    assert before["pv_tf32"] < before["pv_bf16"] < 2.0**-8
    after = {kind: rowsum_residual(p.ds_after_cast) for kind, p in probes.items()}
    assert after["pv_tf32"] < 1.05 * after["matched"] and after["pv_bf16"] < 1.15 * after["matched"]
    assert after["consistent"] > after["pv_bf16"]


def test_delta_kinds_asked_for_are_checked_by_name():
    q, k, v, do = make(n=40)
    with pytest.raises(ValueError, match=r"unknown delta kinds \['pv_fp16'\]"):
        probe_backward(q, k, v, do, kinds=("matched", "pv_fp16"))
    with pytest.raises(ValueError, match="method 'bf16' does not form dP from FP8 dÔ and V̂"):
        probe_backward(q, k, v, do, method="bf16", kinds=("pv_tf32",))


def test_probe_gradients_equal_autograd():
    q, k, v, do = make(n=100)
    probes = probe_backward(q, k, v, do, method="matched")
    for method in ("stale", "consistent", "matched"):
        _, dq, dk, dv = run(method, q, k, v, do)
        p = probes[method]
        assert torch.equal(p.dq, dq) and torch.equal(p.dk, dk) and torch.equal(p.dv, dv)


def test_cudnn_sim_delta_is_fp8_do_against_fp8_o_and_the_probe_has_no_duplicate():
    q, k, v, do = make(n=90)
    probes = probe_backward(q, k, v, do, method="cudnn_fp8_sim")
    assert set(probes) == {"stale", "matched"}  # its consistent δ would be the stale one again
    # cuDNN's stale δ: per-tensor FP8 dO (amax / 448) against the E4M3-stored O the forward returns
    s_do = do.abs().amax() / 448
    do_hat = (do / s_do).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s_do
    o_hat = attention_reference(q, k, v, True, "cudnn_fp8_sim")
    torch.testing.assert_close(probes["stale"].delta, (do_hat * o_hat).sum(-1).transpose(1, 2), rtol=1e-6, atol=1e-6)
    _, dq, dk, dv = run("cudnn_fp8_sim", q, k, v, do)  # and it is the δ the method's backward subtracts
    p = probes["stale"]
    assert torch.equal(p.dq, dq) and torch.equal(p.dk, dk) and torch.equal(p.dv, dv)


@pytest.mark.parametrize("method, kinds", [("matched", {"stale", "consistent", "matched"}),
                                           ("bf16", {"stale", "matched"})])
def test_probe_reports_each_distinct_delta_once(method, kinds):
    q, k, v, do = make(n=70)
    probes = probe_backward(q, k, v, do, method=method)
    assert set(probes) == kinds
    deltas = [p.delta for p in probes.values()]
    assert all(not torch.equal(a, b) for i, a in enumerate(deltas) for b in deltas[i + 1 :])


def test_stale_consistent_matched_share_the_forward():
    q, k, v, _ = make()
    outs = [attention_reference(q, k, v, True, m) for m in ("stale", "consistent", "matched")]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("method", ALL_METHODS)
def test_without_quantisation_every_method_is_exact(method):
    q, k, v, do = make(n=97)
    ref = exact(q, k, v, do)
    with quantization_disabled():
        ours = run(method, q, k, v, do)
    for x, r in zip(ours, ref):
        assert relative_error(x, r) < 1e-5


@pytest.mark.parametrize("method", ALL_METHODS)
def test_gqa_equals_explicitly_repeated_kv(method):
    q, k, v, do = make(h=6, hk=2)
    o, dq, dk, dv = run(method, q, k, v, do)
    rep = [t.repeat_interleave(3, dim=2) for t in (k, v)]
    o_r, dq_r, dk_r, dv_r = run(method, q, *rep, do)
    torch.testing.assert_close(o, o_r, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dq, dq_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dk, dk_r.unflatten(2, (2, 3)).sum(3), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dv, dv_r.unflatten(2, (2, 3)).sum(3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_causal_rows_ignore_the_future(method):
    q, k, v, do = make(n=192)
    o, *_ = run(method, q, k, v, do)
    v2 = v.clone()
    v2[:, 128:] += 5 * torch.randn_like(v2[:, 128:])  # future values, in later 64-key blocks
    o2, *_ = run(method, q, k, v2, do)
    # per-tensor scales and the factored layout's per-channel ones see every token: only the masking is exact
    if method == "cudnn_fp8_sim" or get_method(method).scale_layout == "factored":
        assert relative_error(o2[:, :128], o[:, :128]) < 0.2
    else:
        assert torch.equal(o2[:, :128], o[:, :128])
    # no gradient flows from past outputs into future keys and values
    do_past = do.clone()
    do_past[:, 64:] = 0
    _, _, dk, dv = run(method, q, k, v, do_past)
    assert dk[:, 64:].abs().max() == 0 and dv[:, 64:].abs().max() == 0


@pytest.mark.parametrize("n", [1, 17, 63, 65, 129])
@pytest.mark.parametrize("method", ("bf16", "matched"))
def test_ragged_lengths(n, method):
    q, k, v, do = make(n=n, d=16)
    ours, ref = run(method, q, k, v, do), exact(q, k, v, do)
    for x, r in zip(ours, ref):
        assert torch.isfinite(x).all()
        if r.norm() == 0:  # one key: softmax is constant, dQ and dK vanish exactly
            assert x.abs().max() < 1e-6
        else:
            assert relative_error(x, r) < 0.2


@pytest.mark.parametrize("d", [16, 48, 128, 256])
def test_head_dims(d):
    q, k, v, do = make(n=64, h=2, hk=1, d=d)
    ours, ref = run("matched", q, k, v, do), exact(q, k, v, do)
    assert all(relative_error(x, r) < 0.2 for x, r in zip(ours, ref))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda q, k, v: (q.long(), k, v), "dtype"),
        (lambda q, k, v: (q[0], k, v), "rank 4"),
        (lambda q, k, v: (q, k[:, :-1], v[:, :-1]), "must agree"),
        (lambda q, k, v: (q, k, v[..., :16]), "k and v shapes differ"),
        (lambda q, k, v: (q[:, :, :3], k, v), "multiple of key/value heads"),
        (lambda q, k, v: (q[..., :24], k[..., :24], v[..., :24]), "head dim 24"),
        (lambda q, k, v: (q.half(), k, v), "dtypes differ"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_problem(mutate, message):
    q, k, v, _ = make(n=8)
    with pytest.raises(ValueError, match=message):
        attention_reference(*mutate(q, k, v), True, "matched")


def test_oversized_head_dim_and_unknown_method():
    q, k, v, _ = make(n=8, d=32)
    big = torch.randn(1, 8, 2, 272)
    with pytest.raises(ValueError, match="head dim 272"):
        attention_reference(big, big, big, True, "matched")
    with pytest.raises(ValueError, match="unknown attention mode 'fp4'"):
        attention_reference(q, k, v, True, "fp4")


def test_maxshift_casts_p_by_its_row_max_and_multiplies_the_max_back():
    """Appendix C.4's max-shift encoding, rebuilt in FP64: O = max_j P · (E4M3(448 · P / max_j P) / 448) V̂, on the
    operands the block-scaled methods share; the per-64-key block encoding (matched's forward) is measurably another."""
    from deltamatch.kernels.reference import _operands

    q, k, v, _ = make(n=130, h=2, hk=2, spread=4.0)
    qh, kh, vh = (t.double() for t in _operands(*(t.transpose(1, 2) for t in (q, k, v)), get_method("maxshift")))
    s = (qh @ kh.transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(torch.ones(130, 130, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    row_max = p.amax(-1, keepdim=True)
    expected = ((rne_e4m3_fp64(448 * p / row_max) / 448) @ vh * row_max).transpose(1, 2)
    expected = expected.to(torch.bfloat16).double()  # O is stored in BF16
    ours = attention_reference(q, k, v, True, "maxshift").double()
    block = attention_reference(q, k, v, True, "matched").double()
    assert relative_error(ours, expected) < 1e-3 < relative_error(block, expected)


def test_bf16_dp_forms_dp_from_bf16_dO_and_V():
    """Appendix C.4's BF16 dP: the probe's dS = P (dP - δ) gives back dP = dO_bf16 V_bf16ᵀ (checked in FP64 where P
    is not tiny), while the FP8 methods' dP̂ is measurably another."""
    q, k, v, do = make(n=96, h=2, hk=2)
    bf16 = lambda t: t.to(torch.bfloat16).double().transpose(1, 2)  # noqa: E731
    expected = bf16(do) @ bf16(v).transpose(-1, -2)
    for method, close in (("bf16_dp", True), ("stale", False)):
        probe = probe_backward(q, k, v, do, method=method)["stale"]
        p = attention_probabilities(q, k, method)
        keep = p > 1e-2
        dp = probe.ds_before_cast.double() / p + probe.delta.double()[..., None]
        error = ((dp - expected)[keep].norm() / expected[keep].norm()).item()
        assert (error < 1e-5) if close else (error > 1e-3), (method, error)


def attention_probabilities(q, k, method):
    """P as the reference's backward recomputes it (its operands, FP32), for reading dP back out of dS."""
    from deltamatch.kernels.reference import _operands, _probabilities

    qh, kh, _ = _operands(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2), get_method(method))
    p, _ = _probabilities(qh, kh, None, True, 1 / q.shape[-1] ** 0.5)
    return p.double()


def test_the_alternatives_vary_block_scaled_numerics_only():
    from deltamatch.methods import AttentionMethod

    with pytest.raises(ValueError, match="block-scaled FP8 numerics only"):
        AttentionMethod("x", True, "stale", "tensor", "x", "x", ("reference",), dp_operands="bf16")
    with pytest.raises(ValueError, match="p_encoding 'rows' block, row_max or running_max"):
        AttentionMethod("x", True, "stale", "block", "x", "x", ("reference",), p_encoding="rows")
    with pytest.raises(ValueError, match="the factored layout, and only it, encodes P by its running max"):
        AttentionMethod("x", True, "stale", "block", "x", "x", ("reference",), scale_layout="factored")
    with pytest.raises(ValueError, match="scale_layout 'rows' must be tile or factored"):
        AttentionMethod("x", True, "stale", "block", "x", "x", ("reference",), scale_layout="rows")
    with pytest.raises(ValueError, match="block-scaled FP8 numerics only"):
        AttentionMethod("x", True, "stale", "tensor", "x", "x", ("reference",), p_encoding="running_max",
                        scale_layout="factored")


def _per_channel_fp64(x):
    """Independent FP64 rebuild of the factored layout's per-channel cast over the token dim (-2)."""
    s = x.abs().amax(-2, keepdim=True) / 448
    s = torch.where(s > 0, s, torch.ones_like(s))
    return rne_e4m3_fp64(x / s) * s


def test_factored_forward_scales_once_per_row_and_per_channel():
    """O = P̂V̂ under the factored layout, rebuilt in FP64: P relative to the running max of its row at the end of
    each 64-key tile (what a one-pass kernel's online softmax holds) at the fixed scale 1 ↦ 448, V with one scale per
    channel over every token; both factor out of the sum over keys. The paper's tile layout is measurably another."""
    from deltamatch.kernels.reference import _operands

    q, k, v, _ = make(n=130, h=2, hk=2, spread=4.0)
    qh, kh, _ = (t.double() for t in _operands(*(t.transpose(1, 2) for t in (q, k, v)), get_method("matched")))
    s = (qh @ kh.transpose(-1, -2)) / q.shape[-1] ** 0.5
    p = torch.softmax(s.masked_fill(torch.ones(130, 130, dtype=torch.bool).triu(1), float("-inf")), dim=-1)
    running = torch.stack([p[..., : min(130, 64 * (j // 64 + 1))].amax(-1) for j in range(130)], dim=-1)
    v_hat = _per_channel_fp64(v.double().transpose(1, 2))
    expected = ((rne_e4m3_fp64(448 * p / running) / 448 * running) @ v_hat).transpose(1, 2)
    expected = expected.to(torch.bfloat16).double()
    ours = attention_reference(q, k, v, True, "matched_factored").double()
    tile = attention_reference(q, k, v, True, "matched").double()
    assert relative_error(ours, expected) < 1e-3 < relative_error(tile, expected)


def test_factored_backward_folds_the_row_scales_of_ds_into_q():
    """dQ, dK, dV under the factored layout, rebuilt in FP64 from the probe's dS: dŜ with one scale per query row,
    s_i = (max_j P_ij |dP_ij| + |δ_i| max_j P_ij) / 448 (a bound on the row's max |dS_ij| a δ pass can form),
    constant along dQ's sum over keys, against per-channel K̂ of the centred K; for dK the s_i fold into Q before
    its per-channel cast (Σ_i code_ij · (s_i Q_id)); dV from P at the fixed scale and per-channel dÔ."""
    q, k, v, do = make(n=96, h=2, hk=2)
    probe = probe_backward(q, k, v, do, method="matched_factored")["matched"]
    p = attention_probabilities(q, k, "matched_factored").double()
    ds, delta = probe.ds_before_cast.double(), probe.delta.double()[..., None]
    dp = torch.where(p > 0, ds / p, torch.zeros_like(p)) + delta  # dP read back where P > 0, as the bound uses it
    row_scale = ((p * dp.abs()).amax(-1, keepdim=True) + delta.abs() * p.amax(-1, keepdim=True)) / 448
    assert (ds.abs().amax(-1, keepdim=True) <= 448 * row_scale * (1 + 1e-6)).all()  # a bound: no code saturates
    codes = rne_e4m3_fp64(ds / row_scale)
    qd, kd, dod = (t.double().transpose(1, 2) for t in (q, k, do))
    scale = q.shape[-1] ** -0.5
    dq = (codes * row_scale) @ _per_channel_fp64(kd - kd.mean(2, keepdim=True)) * scale
    dk = codes.transpose(-1, -2) @ _per_channel_fp64(row_scale * qd) * scale
    dv = (rne_e4m3_fp64(448 * p) / 448).transpose(-1, -2) @ _per_channel_fp64(dod)
    for ours, expected in ((probe.dq, dq), (probe.dk, dk), (probe.dv, dv)):
        assert relative_error(ours.double(), expected.transpose(1, 2)) < 1e-5
    assert relative_error(probe.ds_after_cast.double(), codes * row_scale) < 1e-6


def test_factored_layout_keeps_delta_matchings_zero_row_sum():
    """The factored layout moves scales, not δ: matched's dS still sums to zero per row before its cast, and its
    cast (one bounded scale per row) leaves about the residual of the paper's 64 × 64 tiles; consistent-dO loses the
    partial cancellation it has under the paper's layout (O is formed from per-channel V̂, dP from the 64-key V̂: two
    roundings of V)."""
    q, k, v, do = make(n=256, h=2, hk=2)
    tile, factored = (probe_backward(q, k, v, do, method=m) for m in ("matched", "matched_factored"))
    assert rowsum_residual(factored["matched"].ds_before_cast) < 1e-5
    after = rowsum_residual(factored["matched"].ds_after_cast) / rowsum_residual(tile["matched"].ds_after_cast)
    assert 0.8 < after < 1.25
    assert rowsum_residual(factored["consistent"].ds_before_cast) > rowsum_residual(tile["consistent"].ds_before_cast)
