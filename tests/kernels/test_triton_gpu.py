"""The Triton FP8 kernels on an sm90 GPU: against the reference simulation, against FP64, and the matched invariant."""

import os

import pytest
import torch

from deltamatch.kernels import dm_attn_func
from deltamatch.kernels.backends import select_backend, use_backend
from deltamatch.kernels.measures import relative_error
from deltamatch.kernels.reference import attention_exact, attention_reference
from numerics import assert_near_reference

pytestmark = pytest.mark.gpu
MODES = ("stale", "consistent", "matched")
ALL_MODES = (*MODES, "matched_factored")  # matched_factored: every kernel in the factored scale layout


def make(b=2, n=1000, h=4, hk=2, d=128, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, n, h, d, device="cuda", generator=gen) * 1.5
    k = torch.randn(b, n, hk, d, device="cuda", generator=gen) * 1.5 + 0.3
    v = torch.randn(b, n, hk, d, device="cuda", generator=gen)
    do = torch.randn(b, n, h, d, device="cuda", generator=gen)
    return [t.to(torch.bfloat16) for t in (q, k, v)] + [do.to(torch.bfloat16)]


def run(fn, q, k, v, do, dtype=None):
    ins = [(t if dtype is None else t.to(dtype)).detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*ins)
    o.backward(do.to(o.dtype))
    return [o.detach(), *(t.grad for t in ins)]


def triton_fn(causal, mode):
    def fn(q, k, v):
        with use_backend("triton"):
            return dm_attn_func(q, k, v, causal=causal, mode=mode)

    return fn


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_against_reference_and_fp64(mode, causal, d):
    q, k, v, do = make(d=d, n=1000 if d < 256 else 333)
    ours = run(triton_fn(causal, mode), q, k, v, do)
    ref = run(lambda a, b, c: attention_reference(a, b, c, causal, mode), q, k, v, do)
    exact = run(lambda a, b, c: attention_exact(a, b, c, causal), q, k, v, do, dtype=torch.float64)
    for part, ref_to_exact in zip(("o", "dq", "dk", "dv"), assert_near_reference(ours, ref, exact)):
        assert ref_to_exact < 0.12, f"{part}: ref-fp64 {ref_to_exact:.2e}"


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode", ["stale", "matched"])
def test_atomic_dq_against_reference_and_fp64(mode, causal, d, monkeypatch):
    """dQ by atomic adds in the dK launch (DELTAMATCH_KERNEL_DQ_ATOMIC=1) meets the bar of every kernel, and O, dK, dV
    are the deterministic path's bits."""
    from deltamatch.kernels.triton_bwd import DQ_ATOMIC_SWITCH

    q, k, v, do = make(d=d, n=1000 if d < 256 else 333)
    plain = run(triton_fn(causal, mode), q, k, v, do)
    monkeypatch.setenv(DQ_ATOMIC_SWITCH, "1")
    ours = run(triton_fn(causal, mode), q, k, v, do)
    ref = run(lambda a, b, c: attention_reference(a, b, c, causal, mode), q, k, v, do)[1]
    exact = run(lambda a, b, c: attention_exact(a, b, c, causal), q, k, v, do, dtype=torch.float64)[1]
    assert torch.isfinite(ours[1]).all()
    to_ref, ref_to_exact = relative_error(ours[1], ref), relative_error(ref, exact)
    assert to_ref < 0.25 * ref_to_exact, f"dq: atomic-ref {to_ref:.2e} ref-fp64 {ref_to_exact:.2e}"
    for part, a, b in zip(("o", "dk", "dv"), (plain[0], *plain[2:]), (ours[0], *ours[2:])):
        assert torch.equal(a, b), part


def test_dispatch_picks_triton_on_hopper():
    q, k, v, _ = make(n=64)
    assert select_backend(q, k, v, True, "matched").name == "triton"


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_forward_without_a_backward_gives_the_training_forwards_bits(mode, d):
    """Under torch.no_grad (evaluation) the forward skips the copies only the backward reads (matched_factored's V̂
    token-major and K̂ᶜ); O is the training forward's, bit for bit (at D = 128 the CUDA forward where it loads)."""
    q, k, v, _ = make(d=d, n=1000 if d < 256 else 333)
    trained = triton_fn(True, mode)(*(t.detach().clone().requires_grad_() for t in (q, k, v)))
    with torch.no_grad():
        alone = triton_fn(True, mode)(q, k, v)
    assert not alone.requires_grad and torch.equal(alone, trained.detach())


def test_stale_and_matched_share_the_forward_bit_for_bit():
    q, k, v, _ = make(n=777)
    outs = [dm_attn_func(q, k, v, causal=True, mode=m) for m in MODES]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("mode", ALL_MODES)
def test_deterministic(mode, monkeypatch):
    from deltamatch.kernels.triton_bwd import DQ_ATOMIC_SWITCH

    monkeypatch.delenv(DQ_ATOMIC_SWITCH, raising=False)  # the default path: atomic dQ is the one that is not
    q, k, v, do = make(n=1500, h=8, hk=2)
    first = run(triton_fn(True, mode), q, k, v, do)
    second = run(triton_fn(True, mode), q, k, v, do)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def _kernel_rowsum_residuals(mode, causal=True, n=1000, d=128):
    """Median over rows of |Σ_j dS_ij| / Σ_j |dS_ij| of the dS each backward kernel forms before its cast (the
    kernels' DS_STATS diagnostics): ``{"dq": r, "dkdv": r}``."""
    from deltamatch.kernels.triton_attention import fp8_backward, fp8_forward

    q, k, v, do = make(b=1, n=n, h=2, hk=2, d=d)
    scale = d**-0.5
    o, saved, factored = fp8_forward(q, k, v, causal, mode, scale)
    stats = {name: torch.zeros((1, 2, 2, saved["q8"].shape[2]), device="cuda") for name in ("dq", "dkdv")}
    fp8_backward(saved, factored, o, do, causal, mode, scale, (q.shape, k.shape), (q.dtype, k.dtype), ds_stats=stats)
    out = {}
    for name, t in stats.items():
        rowsum, rowabs = t[:, :, 0, :n], t[:, :, 1, :n]
        keep = rowabs > 0
        out[name] = (rowsum.abs()[keep] / rowabs[keep]).median().item()
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_matched_row_sums_at_fp32_roundoff(causal):
    res = {mode: _kernel_rowsum_residuals(mode, causal) for mode in ALL_MODES}
    print(res)
    for kernel in ("dq", "dkdv"):
        assert res["matched"][kernel] < 1e-5 and res["matched_factored"][kernel] < 1e-5, res
        assert res["stale"][kernel] > 30 * res["matched"][kernel], res
        assert res["consistent"][kernel] > 30 * res["matched"][kernel], res


@pytest.mark.parametrize("mode,switch", [("matched", None), ("matched_factored", None),
                                         ("matched_factored", "DELTAMATCH_KERNEL_FWD_PAIRED"),
                                         ("matched_factored", "DELTAMATCH_KERNEL_FWD_WIDE")])
def test_8k_tokens_match_the_reference_simulation(mode, switch, monkeypatch):
    """At N = 8192 the factored layout's dots accumulate over 8K keys (PV, dQ) or queries (dK, dV) in place; Hopper's
    FP8 wgmma adds products at reduced precision, so the kernels promote every 64-deep tile into FP32
    (``triton_fwd.FACTORED_ACC_PROMOTE``), or every 128 keys in the forward's key-tile pairs
    (``DELTAMATCH_KERNEL_FWD_PAIRED=1``); the forward's 128-key tiles (``DELTAMATCH_KERNEL_FWD_WIDE=1``) still
    promote every 64. Kernel and reference must stay as close as at N = 1000."""
    from deltamatch.kernels.triton_fwd import FACTORED_PAIRED_SWITCH, FACTORED_WIDE_SWITCH

    for name in (FACTORED_PAIRED_SWITCH, FACTORED_WIDE_SWITCH):
        monkeypatch.setenv(name, "1" if name == switch else "0")
    if switch:  # Triton's forward, whose key tiles the switch groups (unset: the default forward, CUDA's on sm90)
        monkeypatch.setenv("DELTAMATCH_KERNEL_CUDA_FWD", "0")
    q, k, v, do = make(b=1, n=8192, h=2, hk=1, d=128, seed=5)
    ours = run(triton_fn(True, mode), q, k, v, do)
    ref = run(lambda a, b, c: attention_reference(a, b, c, True, mode), q, k, v, do)
    exact = run(lambda a, b, c: attention_exact(a, b, c, True), q, k, v, do, dtype=torch.float64)
    for part, x, r, e in zip(("o", "dq", "dk", "dv"), ours, ref, exact):
        to_ref, ref_to_exact = relative_error(x, r), relative_error(r, e)
        assert to_ref < 0.25 * ref_to_exact, f"{part}: kernel-ref {to_ref:.2e} ref-fp64 {ref_to_exact:.2e}"


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
def test_wide_key_tiles_against_reference_and_fp64(causal, d, monkeypatch):
    """The factored forward's 128-key tiles (``DELTAMATCH_KERNEL_FWD_WIDE=1``) at every head dim, GQA, ragged N: as
    close to the reference simulation as the 64-key tiles, and not their bits (the switch took effect)."""
    from deltamatch.kernels.triton_fwd import FACTORED_WIDE_SWITCH

    q, k, v, do = make(d=d, n=1000 if d < 256 else 333)
    monkeypatch.setenv("DELTAMATCH_KERNEL_CUDA_FWD", "0")  # Triton's forward at D = 128 too
    monkeypatch.setenv(FACTORED_WIDE_SWITCH, "0")
    narrow = run(triton_fn(causal, "matched_factored"), q, k, v, do)
    monkeypatch.setenv(FACTORED_WIDE_SWITCH, "1")
    ours = run(triton_fn(causal, "matched_factored"), q, k, v, do)
    ref = run(lambda a, b, c: attention_reference(a, b, c, causal, "matched_factored"), q, k, v, do)
    exact = run(lambda a, b, c: attention_exact(a, b, c, causal), q, k, v, do, dtype=torch.float64)
    assert not torch.equal(ours[0], narrow[0])
    for part, x, r, e in zip(("o", "dq", "dk", "dv"), ours, ref, exact):
        assert torch.isfinite(x).all(), part
        to_ref, ref_to_exact = relative_error(x, r), relative_error(r, e)
        assert to_ref < 0.25 * ref_to_exact, f"{part}: kernel-ref {to_ref:.2e} ref-fp64 {ref_to_exact:.2e}"


@pytest.mark.parametrize("n", [130, 1000])
@pytest.mark.parametrize("causal", [True, False])
def test_factored_dk_dv_in_one_launch_give_the_bits_of_two(causal, n, monkeypatch):
    """matched_factored's dK and dV in one launch (S, P and dŜ formed once, two accumulators:
    ``DELTAMATCH_KERNEL_FACTORED_SEPARATE=0``) against the two launches, at D = 64 where the two accumulators fit:
    the same O, dQ, dK, dV bits (GQA, ragged N)."""
    from deltamatch.kernels.triton_bwd import FACTORED_SEPARATE_SWITCH

    q, k, v, do = make(n=n, d=64)
    results = []
    for separate in ("1", "0"):
        monkeypatch.setenv(FACTORED_SEPARATE_SWITCH, separate)
        results.append(run(triton_fn(causal, "matched_factored"), q, k, v, do))
    for part, a, b in zip(("o", "dq", "dk", "dv"), *results):
        assert torch.isfinite(a).all() and torch.equal(a, b), part


@pytest.mark.parametrize("mode", ["stale", "matched_factored"])
def test_a_step_captured_in_a_cuda_graph_replays_eagers_bits(mode):
    """fwd + bwd captured whole into one CUDA graph (what a training step does to shed the host's launch cost, the
    limit at short N) and replayed on new inputs copied into its static tensors gives the eager step's bits there:
    no launch reads a host value, a pointer or a scratch buffer fixed at capture."""
    q, k, v, do = make(n=1000)
    static = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    static_do = do.clone()
    fn = triton_fn(True, mode)

    def step():
        o = fn(*static)
        return (o, *torch.autograd.grad(o, static, static_do))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream: Triton compiles, the allocator settles
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    q2, k2, v2, do2 = make(n=1000, seed=7)
    for dst, src in zip((*static, static_do), (q2, k2, v2, do2)):
        with torch.no_grad():
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    for part, x, e in zip(("o", "dq", "dk", "dv"), outs, eager):
        assert torch.equal(x, e), part


def test_long_sequence_against_fp64():
    q, k, v, do = make(b=1, n=4099, h=2, hk=1, d=128, seed=3)
    ours = run(triton_fn(True, "matched"), q, k, v, do)
    exact = run(lambda a, b, c: attention_exact(a, b, c, True), q, k, v, do, dtype=torch.float64)
    for part, x, e in zip(("o", "dq", "dk", "dv"), ours, exact):
        assert relative_error(x, e) < 0.12, (part, relative_error(x, e))


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
def test_tma_loads_give_the_bits_of_pointer_loads(causal, d, monkeypatch):
    """Every kernel with its tiles through TMA descriptors (DELTAMATCH_KERNEL_TMA=1) against the launched pointer
    kernels: the same bits for O, dQ, dK, dV (matched, so the δ pass too), ragged N, GQA, on the hardware whose
    loads it changes. The deterministic dQ only: atomic adds (DELTAMATCH_KERNEL_DQ_ATOMIC=1) land in any order."""
    from deltamatch.kernels.triton_bwd import DQ_ATOMIC_SWITCH
    from deltamatch.kernels.triton_fwd import TMA_SWITCH

    monkeypatch.delenv(DQ_ATOMIC_SWITCH, raising=False)
    q, k, v, do = make(n=1000, d=d)
    results = []
    for tma in ("0", "1"):
        monkeypatch.setenv(TMA_SWITCH, tma)
        results.append(run(triton_fn(causal, "matched"), q, k, v, do))
    for name, a, b in zip(("o", "dq", "dk", "dv"), *results):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("n", [1000, 8192])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_every_verified_store_mode_stores_the_bits_of_the_pointer_stores(d, n):
    """Each verified code-store mode of the quantisation passes (``triton_quant.VERIFIED_STORE_MODES``, the launched
    ``STORE_MODE`` among them) against the pointer stores, on the hardware whose stores they change: the Q pass
    (128-row blocks), centred K (64-row blocks), dO with the consistent δ (which reads the codes back) and the
    per-channel pass, ragged N and 8K; and each mode's channel-major codes are its token-major codes transposed
    (δ to FP32 round-off: ``tma_both`` sums it in another order, seen on the H200 in session 10).
    The unverified modes wrote wrong channel-major codes here (session 8); the sweep's ``bit_equal`` column tracks
    them, and ``DELTAMATCH_TEST_STORE_MODES`` (comma-separated names) puts them to this test, e.g. under another ptxas
    (``TRITON_PTXAS_PATH``: kernel_gpu.sh's ``ptxas`` stage). Each pass also asked for one layout alone
    (``layouts``, matched_factored's way) stores that layout's bits."""
    from deltamatch.kernels import triton_quant as tq

    modes = [m for m in os.environ.get("DELTAMATCH_TEST_STORE_MODES", "").split(",") if m] or tq.VERIFIED_STORE_MODES

    q, k, v, do = make(b=1, n=n, h=2, hk=2, d=d)
    passes = {"q": lambda mode, lay="both": tq.quantize_operand(q, tq.BLOCK_Q, store_mode=mode, layouts=lay),
              "k": lambda mode, lay="both": tq.quantize_operand(k, tq.BLOCK_KV, centre=True, store_mode=mode,
                                                                layouts=lay),
              "do": lambda mode, lay="both": tq.quantize_do_and_delta(do, v, "consistent", store_mode=mode,
                                                                      layouts=lay),  # V in O's place
              "per channel": lambda mode, lay="both": tq.quantize_per_channel(q, "q", store_mode=mode, layouts=lay)}
    bits = lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.view(torch.int32)  # noqa: E731
    # δ = Σ_k dÔ_ik O_ik is summed in whatever register layout a mode leaves the block in (tma_both's differs), so it
    # agrees to FP32 round-off of its D terms, not bit for bit; codes and scales agree bit for bit
    terms = (do.float().abs() * v.float().abs()).sum(-1).transpose(1, 2)  # Σ_k |dO_ik| |O_ik|, (B, H, N)

    def same(a, b, i):
        if i == 3:
            return bool(((a[..., :n] - b[..., :n]).abs() <= 1e-5 * terms).all())
        return torch.equal(bits(a), bits(b))

    for name, run in passes.items():
        pointers = run(tq.STORE_MODES["pointers"])
        assert tq.STORE_MODE in (tq.STORE_MODES[m] for m in tq.VERIFIED_STORE_MODES)
        for mode_name in modes:
            out = run(tq.STORE_MODES[mode_name])
            assert len(out) == (4 if name == "do" else 3)
            for i, (a, b) in enumerate(zip(out, pointers)):
                assert same(a, b, i), (name, mode_name, i)
            assert torch.equal(bits(out[0]).transpose(-1, -2), bits(out[1])), (name, mode_name)
        for i, lay in enumerate(("token", "channel")):
            out = run(tq.STORE_MODE, lay)
            assert out[1 - i] is None and torch.equal(bits(out[i]), bits(pointers[i])), (name, lay)
            for j in range(2, len(out)):  # scales (and δ)
                assert same(out[j], pointers[j], j), (name, lay, j)


@pytest.mark.parametrize("n", [1000, 8192])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_one_read_gives_both_factored_copies_of_the_two_passes(d, n):
    """matched_factored's K, V and dO quantisation on the hardware's cast and layout conversions: K's mean and centred
    amax from one read (``centring_stats``; the amax exactly max |fl(k − mean)|, the mean deterministic and within
    FP32 summation order of PyTorch's), and ``quantize_block_and_channel``'s four outputs the bits of the block pass
    and the per-channel pass it replaces, in natural and fragment token order, 64- and 128-row blocks."""
    from deltamatch.kernels import triton_quant as tq

    q, k, v, do = make(b=2, n=n, h=2, hk=2, d=d)
    bits = lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.view(torch.int32)  # noqa: E731
    mean, amax = tq.centring_stats(k)
    again = tq.centring_stats(k)
    assert torch.equal(bits(mean), bits(again[0])) and torch.equal(bits(amax), bits(again[1]))
    assert torch.allclose(mean, k.mean(dim=1, dtype=torch.float32), rtol=1e-5, atol=1e-6)
    centred = k.float().transpose(1, 2) - mean[:, :, None]
    assert torch.equal(bits(amax), bits(centred.abs().amax(dim=2)))
    for name, x, rows, m, a in (("k", k, tq.BLOCK_KV, mean, amax), ("v", v, tq.BLOCK_KV, None, None),
                                ("do", do, tq.BLOCK_Q, None, None)):
        for fragment in (False, True):
            both = tq.quantize_block_and_channel(x, rows, name, mean=m, amax=a, fragment_order=fragment)
            x8, _, sx = tq.quantize_operand(x, rows, centre=m is not None, mean=m, layouts="token")
            _, x8t, sxc = tq.quantize_per_channel(x, name, mean=m, layouts="channel", fragment_order=fragment)
            for i, (got, want) in enumerate(zip(both, (x8, sx, x8t, sxc))):
                assert torch.equal(bits(got), bits(want)), (name, fragment, i)
