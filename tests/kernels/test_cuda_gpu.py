"""The CUDA primitives on an sm90 GPU (kernels/CUDA_BACKWARD.md, M1): FP8 wgmma tiles against torch, the e4m3
quantiser bit for bit against torch's cast, and launches on torch's current stream.

Tile products. On integer-valued codes (|v| <= 16, all exact in E4M3) every product and partial sum of a 128-long
row is an integer below 2^15, exact in FP32 and inside the tensor core's alignment window, so the wgmma result must
EQUAL torch's FP32 matmul: any register-layout, descriptor or swizzle mistake moves whole products and shows. On codes
over the whole E4M3 range the products span 2^-18 .. 2^17.6 and Hopper's FP8 MMA adds them with a limited-width
aligned accumulator (about 14 bits, DeepSeek-V3 report section 3.3.2), so there the bound is relative to Σ|a||b|.

The quantiser promises the spec's clamp-then-round (``cvt.rn.satfinite``): bit-equal to
``x.clamp(-448, 448).to(torch.float8_e4m3fn)``, and so to ``x.to(torch.float8_e4m3fn)`` wherever |x| <= 464 (464 is
the tie between 448 and 480, which would be NaN; it rounds to even, 448). Above 464 the kernel saturates to ±448;
torch's unclamped cast is not relied on there (c10's scalar conversion gives NaN, the CPU cast of torch 2.13
saturates). NaN stays NaN.

The swapped dP̂ᵀ tile (V̂ dÔᵀ, keys as wgmma's M) must equal, bit for bit, the dP̂ tile Triton's δ pass forms unswapped
(dÔ V̂ᵀ over 128 queries), transposed: the dS row-sum property rests on it (CUDA_BACKWARD.md 3.5).

The factored dV kernel (M2) follows Triton's factored dV launch operation for operation (the same wgmma shapes and
operand roles, the same FMA, ex2.approx.ftz, clamp and cvt, the same query-tile order and FP32 adds), so on the
operands Triton's own passes produce it is expected to give Triton's bits; the tolerance test beside the exact one
says how far apart they are if not (10^-3 in norm: any rounding-order effect is an FP32 or one-code change far below
that, while a layout or masking mistake moves whole P̂ entries, tens of percent). Against the reference simulation
and FP64 it must meet the bar of test_triton_gpu.py.
"""

import math

import pytest
import torch
import triton
import triton.language as tl

from deltamatch.kernels import cuda_lib
from deltamatch.kernels.measures import relative_error
from numerics import assert_near_reference

pytestmark = pytest.mark.gpu
E4M3 = torch.float8_e4m3fn


@pytest.fixture(scope="module", autouse=True)
def library():
    lib, reason = cuda_lib.load()
    if lib is None:
        if not cuda_lib.library_path().exists():
            pytest.skip(reason)
        pytest.fail(reason)  # built but unusable on this GPU: a real failure
    return lib


def assert_same_bits(ours, theirs, name=""):
    """``ours`` finite and ``theirs`` bit for bit, or a message: how many elements differ, by how much, and the first
    indices (which tiles to look at)."""
    prefix = f"{name}: " if name else ""
    assert torch.isfinite(ours).all(), f"{prefix}not finite"
    diff = (ours.float() - theirs.float()).abs()
    where = [tuple(i.tolist()) for i in (diff > 0).nonzero()[:4]]
    assert torch.equal(ours, theirs), (
        f"{prefix}{int((diff > 0).sum())} of {diff.numel()} differ, max {diff.max().item():.3e}, relative "
        f"{relative_error(ours, theirs):.2e}, first at {where}")


def integer_codes(rows, gen):
    return torch.randint(-16, 17, (rows, 128), device="cuda", generator=gen).float().to(E4M3)


def full_range_codes(rows, gen):
    codes = torch.randint(0, 256, (rows, 128), device="cuda", generator=gen, dtype=torch.uint8)
    return torch.where((codes & 0x7F) == 0x7F, codes & 0x80, codes).view(E4M3)  # NaN codes -> ±0


TILES = [("ss", 64, dict(swizzle=True)), ("ss", 64, dict(swizzle=False)), ("ss", 128, dict(swizzle=True)),
         ("rs", 64, dict(from_accumulator=False)), ("rs", 64, dict(from_accumulator=True)),
         ("rs", 128, dict(from_accumulator=False)), ("rs", 128, dict(from_accumulator=True))]


def tile(kind, a, b, options):
    return (cuda_lib.wgmma_ss_tile if kind == "ss" else cuda_lib.wgmma_rs_tile)(a, b, **options)


@pytest.mark.parametrize("kind, n, options", TILES)
def test_tile_on_integer_codes_equals_torch(kind, n, options):
    gen = torch.Generator(device="cuda").manual_seed(n)
    a, b = integer_codes(64, gen), integer_codes(n, gen)
    ours = tile(kind, a, b, options)
    torch.cuda.synchronize()
    assert torch.equal(ours, a.float() @ b.float().T)
    assert torch.equal(tile(kind, a.view(torch.uint8), b.view(torch.uint8), options), ours)  # codes as uint8


@pytest.mark.parametrize("kind, n, options", TILES)
def test_tile_on_full_range_codes_within_fp8_accumulation(kind, n, options):
    gen = torch.Generator(device="cuda").manual_seed(1 + n)
    a, b = full_range_codes(64, gen), full_range_codes(n, gen)
    ours = tile(kind, a, b, options).double()
    exact = a.double() @ b.double().T
    scale = a.double().abs() @ b.double().abs().T
    worst = ((ours - exact).abs() / scale.clamp_min(1e-30)).max().item()
    assert worst < 2.0**-10, f"max |wgmma - exact| / Σ|a||b| = {worst:.3e}"


def e4m3_test_values() -> torch.Tensor:
    """Every finite E4M3 value, every midpoint between neighbours (the ties) and the FP32 numbers either side of it,
    FP32 subnormals, log-uniform values up to 464, and the negatives of all."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(E4M3).float()
    grid = codes[torch.isfinite(codes) & (codes >= 0)].unique()  # 0 .. 448, subnormals from 2^-9
    mids = (grid[:-1] + grid[1:]) / 2
    tiny = torch.tensor([1e-45, 1e-40, 2.0**-126, 2.0**-11, 2.0**-10, 3 * 2.0**-11, 460.0, 464.0])
    gen = torch.Generator().manual_seed(0)
    spread = torch.exp2(torch.empty(20000).uniform_(-14, 8.85, generator=gen)).clamp_max(464.0)
    x = torch.cat([grid, mids, mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(1e9)), tiny, spread])
    return torch.cat([x, -x]).cuda()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def test_quantiser_is_bit_equal_to_torch_up_to_464():
    x = e4m3_test_values()
    assert x.abs().max().item() == 464.0
    assert torch.equal(bits(cuda_lib.quantize_e4m3(x)), bits(x.to(E4M3)))


def test_quantiser_saturates_beyond_448():
    big = torch.tensor([464.00003, 470.0, 479.9, 480.0, 1e4, 3e38, float("inf")], device="cuda")
    x = torch.cat([big, -big])
    ours = bits(cuda_lib.quantize_e4m3(x))
    assert ours.tolist() == [0x7E] * len(big) + [0xFE] * len(big)
    assert torch.equal(ours, bits(x.clamp(-448, 448).to(E4M3)))


def test_quantiser_keeps_nan():
    ours = bits(cuda_lib.quantize_e4m3(torch.tensor([float("nan"), -float("nan"), 1.0], device="cuda")))
    assert [(c & 0x7F) == 0x7F for c in ours.tolist()] == [True, True, False]  # 0x7F / 0xFF: E4M3's NaN


@pytest.mark.parametrize("n", [1, 2, 1001, 1 << 20])
def test_quantiser_with_a_scale_on_any_length(n):
    gen = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(n, device="cuda", generator=gen) * 3
    mul = 448.0 / max(x.abs().max().item(), 1e-30) * 1.5  # some values saturate
    ours = cuda_lib.quantize_e4m3(x, mul)
    assert ours.shape == x.shape and ours.dtype == E4M3
    assert torch.equal(bits(ours), bits((x * mul).clamp(-448, 448).to(E4M3)))


def test_kernels_run_on_torchs_current_stream():
    """On a side stream the input is written after a sleep; a kernel not ordered after it would read zeros."""
    src = torch.randn(1 << 20, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b = integer_codes(64, gen), integer_codes(128, gen)
    x, a_late = torch.zeros_like(src), torch.zeros(a.shape, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # about 50 ms of spinning on the side stream
        x.copy_(src)
        a_late.copy_(a.view(torch.uint8))
        codes = cuda_lib.quantize_e4m3(x)
        product = cuda_lib.wgmma_rs_tile(a_late, b, from_accumulator=True)
    side.synchronize()
    assert torch.equal(bits(codes), bits(src.to(E4M3)))
    assert torch.equal(product, a.float() @ b.float().T)


# ---- the swapped dP̂ᵀ tile against Triton's unswapped dP̂ ------------------------------------------------------------

@triton.jit
def _dp_tile_kernel(do_ptr, v_ptr, out_ptr, s_do, s_v):
    """dP̂ = dÔ V̂ᵀ · (s_dO · s_V) for 128 queries × 64 keys, as ``triton_bwd._recompute_p_dp`` forms it in the δ pass
    (BLOCK_M = 128, 8 warps)."""
    rows, keys, d = tl.arange(0, 128), tl.arange(0, 64), tl.arange(0, 128)
    do = tl.load(do_ptr + rows[:, None] * 128 + d[None, :])  # [128, D]
    v = tl.load(v_ptr + keys[:, None] * 128 + d[None, :])  # [64, D]
    dp = tl.dot(do, tl.trans(v)) * (s_do * s_v)
    tl.store(out_ptr + rows[:, None] * 64 + keys[None, :], dp)


def quantised_codes(rows, gen):
    """Codes as the quantisation pass makes them: a heavy-tailed row block scaled to amax 448."""
    x = torch.randn(rows, 128, device="cuda", generator=gen) * torch.exp(torch.randn(rows, 1, device="cuda",
                                                                                    generator=gen))
    x[:, 7] *= 20  # an outlier channel
    return (x * (448.0 / x.abs().max())).clamp(-448, 448).to(E4M3)


def test_swapped_dpt_tile_on_integer_codes_equals_torch():
    gen = torch.Generator(device="cuda").manual_seed(7)
    v, do = integer_codes(64, gen), integer_codes(64, gen)
    s_v, s_do = 0.013, 0.0071
    ours = cuda_lib.dpt_tile(v, do, s_v, s_do)
    scale = torch.tensor(s_v, device="cuda") * torch.tensor(s_do, device="cuda")  # FP32 product, as the kernel
    assert torch.equal(ours, (v.float() @ do.float().T) * scale)


@pytest.mark.parametrize("codes", ["full_range", "quantised"])
def test_swapped_dpt_tile_is_bit_equal_to_tritons_delta_pass_tile(codes):
    gen = torch.Generator(device="cuda").manual_seed(11)
    make_codes = full_range_codes if codes == "full_range" else quantised_codes
    do, v = make_codes(128, gen), make_codes(64, gen)
    s_do, s_v = 3.1e-3, 7.7e-4
    dp = torch.empty(128, 64, device="cuda")
    _dp_tile_kernel[(1,)](do, v, dp, s_do, s_v, num_warps=8)
    for half in range(2):  # the fused kernel's query tiles are 64 long: two swapped tiles per δ-pass block
        ours = cuda_lib.dpt_tile(v, do[64 * half: 64 * (half + 1)].contiguous(), s_v, s_do)
        theirs = dp[64 * half: 64 * (half + 1)].T
        diff = (ours - theirs).abs().max().item()
        assert torch.equal(ours, theirs), f"half {half}: max |dP̂ᵀ − dP̂ᵀ_triton| = {diff:.3e}"


# ---- M2: the factored dV against Triton's factored dV, the reference simulation and FP64 --------------------------

def attention_inputs(b, n, h, hk, seed, d=128):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, n, h, d, device="cuda", generator=gen) * 1.5
    k = torch.randn(b, n, hk, d, device="cuda", generator=gen) * 1.5 + 0.3
    v = torch.randn(b, n, hk, d, device="cuda", generator=gen)
    do = torch.randn(b, n, h, d, device="cuda", generator=gen)
    return [t.to(torch.bfloat16) for t in (q, k, v, do)]


def factored_dv_operands(q, k, v, do, causal):
    """What matched_factored's dV launch reads, made by the project's own passes: the factored forward's codes, scales
    and lse2, and dÔ per channel (``triton_quant.quantize_per_channel``)."""
    from deltamatch.kernels.triton_attention import fp8_forward
    from deltamatch.kernels.triton_quant import quantize_do_and_delta, quantize_per_channel, token_mean

    scale = q.shape[-1] ** -0.5
    o, saved, forward_factored = fp8_forward(q, k, v, causal, "matched_factored", scale)
    do8, do8t, sdo, delta = quantize_do_and_delta(do, o, "matched_factored")
    _, do8t_c, sdoc = quantize_per_channel(do, "do")
    _, do8t_f, _ = quantize_per_channel(do, "do", layouts="channel", fragment_order=True)  # the CUDA dK/dV's dÔᶜ
    _, k8t_c, _ = quantize_per_channel(k, "k", mean=token_mean(k), layouts="channel")  # natural, for Triton's dQ
    return dict(saved=saved, do8=do8, do8t=do8t, sdo=sdo, delta=delta, do8t_c=do8t_c, do8t_f=do8t_f, sdoc=sdoc,
                scale=scale, qk_scale=scale * math.log2(math.e), n=q.shape[1], causal=causal, k_shape=k.shape,
                dtype=k.dtype, q_shape=q.shape, k8t_c=k8t_c, k8t_f=forward_factored["k8t"],
                skc=forward_factored["skc"])


def factored_dk_operands(ops, q):
    """What matched_factored's dK launch also reads, made as ``triton_bwd.attention_backward`` makes them: matched's δ
    with dŜ's row scales s (the δ pass), and Q' = s ⊙ Q per channel."""
    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_quant import quantize_per_channel

    delta, rs = ops["delta"].clone(), torch.empty_like(ops["delta"])
    cfg = triton_bwd.factored_config(triton_bwd.backward_config(128), 128)
    # the CUDA δ pass scales each dP̂ element as Triton's did before SCALE_AFTER_SUM (its bits are those)
    irs = triton_bwd._launch_delta_matched(ops["saved"], ops["do8"], ops["sdo"], delta, ops["causal"],
                                           ops["qk_scale"], ops["n"], {**cfg["delta"], "SCALE_AFTER_SUM": False},
                                           row_scales=rs)
    _, q8t_c, sqc = quantize_per_channel(q, "q", row_scales=rs)
    _, q8t_f, _ = quantize_per_channel(q, "q", row_scales=rs, layouts="channel", fragment_order=True)
    return dict(ops, delta_m=delta, rs=rs, irs=irs, q8t_c=q8t_c, q8t_f=q8t_f, sqc=sqc)


def triton_factored_dk(ops, promote=False):
    """Triton's factored dK launch alone (``DK_ONLY``), unpromoted (``ACC_PROMOTE=None``) as the CUDA dK is, or
    promoted per 64-query tile."""
    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_fwd import FACTORED_ACC_PROMOTE

    cfg = {**triton_bwd.factored_config(triton_bwd.backward_config(128), 128)["dkdv"], "DK_ONLY": True,
           "ACC_PROMOTE": FACTORED_ACC_PROMOTE if promote else None}
    dk = torch.empty(ops["k_shape"], device="cuda", dtype=ops["dtype"])
    dv = torch.empty(ops["k_shape"], device="cuda", dtype=ops["dtype"])
    factored = dict(q8t=ops["q8t_c"], sqc=ops["sqc"], do8t=ops["do8t_c"], sdoc=ops["sdoc"], rs=ops["rs"])
    triton_bwd._launch_dkdv(ops["saved"], ops["do8"], ops["do8t"], ops["sdo"], ops["delta_m"], dk, dv, None,
                            ops["causal"], ops["qk_scale"], ops["scale"], ops["n"], cfg, factored=factored)
    return dk


def cuda_factored_dk(ops):
    s = ops["saved"]
    return cuda_lib.dk_factored(s["q8"], s["k8"], s["v8"], ops["do8"], ops["q8t_c"], s["sq"], s["sk"], s["sv"],
                                ops["sdo"], ops["sqc"], ops["rs"], s["lse2"], ops["delta_m"], ops["n"], ops["causal"],
                                ops["qk_scale"], ops["scale"], dtype=ops["dtype"])


def triton_factored_dv(ops, promote):
    """Triton's factored dV launch alone (``DV_ONLY``), promoted per 64-query tile (``ACC_PROMOTE=64``) or not."""
    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_fwd import FACTORED_ACC_PROMOTE

    cfg = {**triton_bwd.factored_config(triton_bwd.backward_config(128), 128)["dkdv"], "DV_ONLY": True,
           "ACC_PROMOTE": FACTORED_ACC_PROMOTE if promote else None}
    s = ops["saved"]
    dk = torch.empty(ops["k_shape"], device="cuda", dtype=ops["dtype"])
    dv = torch.empty(ops["k_shape"], device="cuda", dtype=ops["dtype"])
    factored = dict(q8t=ops["do8t_c"], sqc=ops["sdoc"], do8t=ops["do8t_c"], sdoc=ops["sdoc"], rs=ops["delta"])
    triton_bwd._launch_dkdv(s, ops["do8"], ops["do8t"], ops["sdo"], ops["delta"], dk, dv, None, ops["causal"],
                            ops["qk_scale"], ops["scale"], ops["n"], cfg, factored=factored)
    return dv


def cuda_factored_dv(ops, promote, variant="simple"):
    s = ops["saved"]
    return cuda_lib.dv_factored(s["q8"], s["k8"], ops["do8t_c"], s["sq"], s["sk"], ops["sdoc"], s["lse2"], ops["n"],
                                ops["causal"], ops["qk_scale"], dtype=ops["dtype"], promote=promote, variant=variant)


DV_CASES = [(n, causal, promote) for n in (128, 130, 1024) for causal in (True, False) for promote in (True, False)]
GQA_CASES = [(1000, True, True), (1000, False, False)]  # 8 query heads on 2 kv heads, each with its dÔᶜ scales


def heads(n):
    return (8, 2) if n == 1000 else (2, 2)


@pytest.fixture(scope="module")
def dv_operands():
    cache = {}

    def get(n, causal, h=2, hk=2):
        key = (n, causal, h, hk)
        if key not in cache:
            cache[key] = factored_dv_operands(*attention_inputs(2, n, h, hk, seed=n + h), causal)
        return cache[key]

    return get


# the pipelined loops on fewer cases: one tile per key block (N = 130: the loop body never runs for the last block),
# ragged N, many tiles, both masks, GQA
PIPELINED_CASES = [(v, *case) for v in cuda_lib.DV_VARIANTS[1:] for case in
                   [(130, True, True), (130, False, False), (1024, True, True), (1024, True, False), (1024, False, True),
                    *GQA_CASES] if not (case[2] and v in cuda_lib.DV_UNPROMOTED_ONLY)]


@pytest.mark.parametrize("variant, n, causal, promote", [("simple", *c) for c in DV_CASES + GQA_CASES]
                         + PIPELINED_CASES)
def test_factored_dv_is_tritons_bit_for_bit(dv_operands, variant, n, causal, promote):
    ops = dv_operands(n, causal, *heads(n))
    ours, theirs = cuda_factored_dv(ops, promote, variant), triton_factored_dv(ops, promote)
    torch.cuda.synchronize()
    assert_same_bits(ours, theirs)  # first at (b, key, kv head, d)


@pytest.mark.parametrize("n, causal, promote", DV_CASES + GQA_CASES)
def test_factored_dv_within_fp8_order_of_triton(dv_operands, n, causal, promote):
    """The fallback bound if the bits differ: 10^-3 in norm (both are ≈ 5% from FP64)."""
    ops = dv_operands(n, causal, *heads(n))
    ours, theirs = cuda_factored_dv(ops, promote), triton_factored_dv(ops, promote)
    assert relative_error(ours, theirs) < 1e-3


@pytest.fixture(scope="module")
def dk_operands():
    cache = {}

    def get(n, causal, h=2, hk=2):
        key = (n, causal, h, hk)
        if key not in cache:
            q, k, v, do = attention_inputs(2, n, h, hk, seed=n + h + 1)
            cache[key] = factored_dk_operands(factored_dv_operands(q, k, v, do, causal), q)
        return cache[key]

    return get


DK_CASES = [(130, True), (130, False), (1024, True), (1024, False), (1000, True), (1000, False)]  # 1000: GQA 8 on 2


@pytest.mark.parametrize("n, causal", DK_CASES)
def test_factored_dk_is_tritons_bit_for_bit(dk_operands, n, causal):
    ops = dk_operands(n, causal, *heads(n))
    ours, theirs = cuda_factored_dk(ops), triton_factored_dk(ops)
    torch.cuda.synchronize()
    assert_same_bits(ours, theirs)


@pytest.mark.parametrize("n, causal", DK_CASES)
def test_factored_dk_within_fp8_order_of_triton(dk_operands, n, causal):
    """The fallback bound if the bits differ: 10^-3 in norm."""
    ops = dk_operands(n, causal, *heads(n))
    assert relative_error(cuda_factored_dk(ops), triton_factored_dk(ops)) < 1e-3


# ---- the fused, warp-specialised dK/dV against Triton's two factored launches --------------------------------------

def cuda_factored_dkdv(ops, promote, variant="ws3"):
    s = ops["saved"]
    return cuda_lib.dkdv_factored(s["q8"], s["k8"], s["v8"], ops["do8"], ops["q8t_f"], ops["do8t_f"], s["sq"], s["sk"],
                                  s["sv"], ops["sdo"], ops["sqc"], ops["sdoc"], ops["rs"], s["lse2"], ops["delta_m"],
                                  ops["n"], ops["causal"], ops["qk_scale"], ops["scale"], dtype=ops["dtype"],
                                  promote=promote, variant=variant)


# N = 130: the second CTA has one ragged 64-key half and no second half; 1024: many tiles, the two halves' orders
# merged; 1000: GQA 8 on 2 with a ragged second half; 256: one CTA whose halves share every tile but the diagonals
DKDV_CASES = [(n, causal, promote, "ws3") for n in (130, 256, 1024, 1000) for causal in (True, False)
              for promote in (True, False)] + [(1024, True, promote, "ws4") for promote in (True, False)] \
    + [(n, True, False, "ws3s") for n in (130, 1024, 1000)]


@pytest.mark.parametrize("n, causal, promote, variant", DKDV_CASES)
def test_fused_factored_dkdv_is_tritons_bit_for_bit(dk_operands, n, causal, promote, variant):
    ops = dk_operands(n, causal, *heads(n))
    dk, dv = cuda_factored_dkdv(ops, promote, variant)
    theirs = {"dK": triton_factored_dk(ops, promote), "dV": triton_factored_dv(ops, promote)}
    torch.cuda.synchronize()
    for name, ours in (("dK", dk), ("dV", dv)):
        assert_same_bits(ours, theirs[name], name)


@pytest.fixture(scope="module")
def d64_dkdv_operands():
    """What the dK/dV kernel's D = 64 build and Triton's factored dK/dV launch at D = 64 read, made as the backward
    makes them (the D = 64 forward and δ pass of this tree's defaults; Q' = s ⊙ Q per channel from the δ pass's row
    scales), cached by (n, causal, h, h_kv) (heads: ``heads(n)`` unless given)."""
    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_quant import quantize_per_channel, token_mean

    cache = {}

    def get(n, causal, h=None, h_kv=None):
        h, h_kv = (h, h_kv) if h else heads(n)
        if (n, causal, h, h_kv) not in cache:
            q, k, v, do = attention_inputs(2, n, h, h_kv, seed=n + 640, d=64)
            ops = factored_dv_operands(q, k, v, do, causal)
            delta, rs = ops["delta"].clone(), torch.empty_like(ops["delta"])
            cfg = triton_bwd.factored_config(triton_bwd.backward_config(64), 64)
            triton_bwd._launch_delta_matched(ops["saved"], ops["do8"], ops["sdo"], delta, causal, ops["qk_scale"], n,
                                             cfg["delta"], row_scales=rs)
            _, q8t_c, sqc = quantize_per_channel(q, "q", row_scales=rs)
            _, q8t_f, _ = quantize_per_channel(q, "q", row_scales=rs, layouts="channel", fragment_order=True)
            # K̂ᶜ for dQ: natural for Triton's launch, in fragment order for the CUDA kernel
            _, k8t_n, skc = quantize_per_channel(k, "k", mean=token_mean(k), layouts="channel")
            _, k8t_o, _ = quantize_per_channel(k, "k", mean=token_mean(k), layouts="channel", fragment_order=True)
            cache[n, causal, h, h_kv] = dict(ops, delta_m=delta, rs=rs, q8t_c=q8t_c, q8t_f=q8t_f, sqc=sqc,
                                             cfg=cfg["dkdv"], dq_cfg=cfg["dq"], k8t_n=k8t_n, k8t_o=k8t_o, skc64=skc)
        return cache[n, causal, h, h_kv]

    return get


def d64_cuda_dkdv(ops, **options):
    """dK, dV of the dK/dV kernel's D = 64 build without dQ on ``d64_dkdv_operands``."""
    s = ops["saved"]
    return cuda_lib.dkdv_factored(s["q8"], s["k8"], s["v8"], ops["do8"], ops["q8t_f"], ops["do8t_f"], s["sq"], s["sk"],
                                  s["sv"], ops["sdo"], ops["sqc"], ops["sdoc"], ops["rs"], s["lse2"], ops["delta_m"],
                                  ops["n"], ops["causal"], ops["qk_scale"], ops["scale"], dtype=ops["dtype"], **options)


def d64_cuda_dq(ops, **options):
    """dQ of the dQ kernel's D = 64 build on ``d64_dkdv_operands`` (K̂ᶜ in fragment order)."""
    s = ops["saved"]
    return cuda_lib.dq_factored(s["q8"], s["k8"], s["v8"], ops["do8"], ops["k8t_o"], s["sq"], s["sk"], s["sv"],
                                ops["sdo"], ops["skc64"], ops["rs"], s["lse2"], ops["delta_m"], ops["n"],
                                ops["causal"], ops["qk_scale"], ops["scale"], dtype=ops["dtype"], **options)


def d64_dqdkdv(ops, variant="ws3xfd", **options):
    """dQ, dK, dV of the D = 64 dK/dV launch with dQ (``variant``, ``ws3xfd`` or ``ws3xfdt``) on
    ``d64_dkdv_operands``."""
    s = ops["saved"]
    return cuda_lib.dqdkdv_factored(
        s["q8"], s["k8"], s["v8"], ops["do8"], ops["q8t_f"], ops["do8t_f"], ops["k8t_o"], s["sq"], s["sk"], s["sv"],
        ops["sdo"], ops["sqc"], ops["sdoc"], ops["skc64"], ops["rs"], s["lse2"], ops["delta_m"], ops["n"],
        ops["causal"], ops["qk_scale"], ops["scale"], dtype=ops["dtype"], variant=variant, **options)


# a ragged second CTA with no second half (130), GQA 8 on 2 with a ragged second half (1000), many tiles (1024)
@pytest.mark.parametrize("n, causal, promote, variant",
                         [(n, causal, promote, "ws3") for n in (130, 1000, 1024) for causal in (True, False)
                          for promote in (True, False)] + [(1024, True, promote, "ws4") for promote in (True, False)])
def test_the_d64_dkdv_is_tritons_bit_for_bit(d64_dkdv_operands, n, causal, promote, variant):
    """The dK/dV kernel's D = 64 build (``dm_dkdv_factored_d64``: rows of 64 codes, dV and dK by m64n64k32) against
    Triton's factored dK/dV launch at D = 64 on the same operands, promoted per 64-query tile or not: dK and dV bit for
    bit, as the D = 128 build gives Triton's at D = 128."""
    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_fwd import FACTORED_ACC_PROMOTE

    ops = d64_dkdv_operands(n, causal)
    s = ops["saved"]
    dk, dv = d64_cuda_dkdv(ops, promote=promote, variant=variant)
    cfg = {**ops["cfg"], "ACC_PROMOTE": FACTORED_ACC_PROMOTE if promote else None}
    theirs = {"dK": torch.empty_like(dk), "dV": torch.empty_like(dv)}
    factored = dict(q8t=ops["q8t_c"], sqc=ops["sqc"], do8t=ops["do8t_c"], sdoc=ops["sdoc"], rs=ops["rs"])
    triton_bwd._launch_dkdv(s, ops["do8"], ops["do8t"], ops["sdo"], ops["delta_m"], theirs["dK"], theirs["dV"], None,
                            causal, ops["qk_scale"], ops["scale"], n, cfg, factored=factored)
    torch.cuda.synchronize()
    for name, ours in (("dK", dk), ("dV", dv)):
        assert_same_bits(ours, theirs[name], name)
    with pytest.raises(ValueError, match="at D = 64 the dK/dV kernel is built as"):
        d64_cuda_dkdv(ops, variant="ws3s")


@pytest.mark.parametrize("n, causal, promote", [(n, causal, promote) for n in (130, 1000, 1024)
                                                 for causal in (True, False) for promote in (True, False)])
def test_the_d64_dq_is_tritons_bit_for_bit(d64_dkdv_operands, n, causal, promote):
    """The dQ kernel's D = 64 build (``dm_dq_factored_d64``: rows of 64 codes, dQ by m64n64k32) against Triton's
    factored dQ launch at D = 64 on the same operands (K̂ᶜ in fragment order for it, natural for Triton's), promoted per
    64-key tile or not: dQ bit for bit, as the D = 128 build gives Triton's at D = 128."""
    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_fwd import FACTORED_ACC_PROMOTE

    ops = d64_dkdv_operands(n, causal)
    s = ops["saved"]
    ours = d64_cuda_dq(ops, promote=promote)
    theirs = torch.empty(ops["q_shape"], device="cuda", dtype=ops["dtype"])
    cfg = {**ops["dq_cfg"], "ACC_PROMOTE": FACTORED_ACC_PROMOTE if promote else None}
    triton_bwd._launch_dq(s, ops["do8"], ops["sdo"], ops["delta_m"], theirs, None, causal, ops["qk_scale"],
                          ops["scale"], n, cfg, factored=dict(k8t=ops["k8t_n"], skc=ops["skc64"], rs=ops["rs"]))
    torch.cuda.synchronize()
    assert_same_bits(ours, theirs, "dQ")


@pytest.mark.parametrize("n, causal, h, h_kv, promote", [(130, True, 2, 2, True), (1000, False, 8, 2, False)])
def test_the_d64_backward_with_the_cuda_dq_gives_tritons_bits(n, causal, h, h_kv, promote, monkeypatch):
    """matched_factored at D = 64 with ``DELTAMATCH_KERNEL_CUDA_DQ64=ws3`` (the dQ kernel's D = 64 build; the forward
    then writes K̂ᶜ in fragment order): the bits of O, dQ, dK, dV without it (Triton's dQ launch), the dK/dV kernel
    without dQ (``DELTAMATCH_KERNEL_CUDA_DKDV64=ws3``) in both."""
    from deltamatch.kernels import triton_fwd
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DQ64_SWITCH

    q, k, v, do = attention_inputs(2, n, h, h_kv, seed=37, d=64)
    calls = []
    dq = cuda_lib.dq_factored
    monkeypatch.setattr(cuda_lib, "dq_factored", lambda *a, **kw: calls.append(kw["variant"]) or dq(*a, **kw))
    monkeypatch.setenv(triton_fwd.ACC_PROMOTE_SWITCH, "1" if promote else "0")
    monkeypatch.setenv("DELTAMATCH_KERNEL_CUDA_DKDV64", "ws3")
    fn = lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored")  # noqa: E731
    monkeypatch.setenv(CUDA_DQ64_SWITCH, "ws3")
    ours = _fwd_bwd(fn, q, k, v, do)
    assert calls == ["ws3"]  # the switch took effect
    monkeypatch.delenv(CUDA_DQ64_SWITCH)
    theirs = _fwd_bwd(fn, q, k, v, do)
    assert calls == ["ws3"]  # unset: Triton's dQ launch
    for name, a, b in zip(("O", "dQ", "dK", "dV"), ours, theirs):
        assert torch.equal(a, b), f"{name}: relative {relative_error(a, b):.2e} from Triton's dQ launch's"


# a ragged second CTA (130), GQA 8 on 2 with a ragged second half (1000), causal or not, promoted or not
@pytest.mark.parametrize("n, causal, h, h_kv, promote", [(130, True, 2, 2, True), (1000, True, 8, 2, True),
                                                         (1000, False, 8, 2, False), (1000, True, 8, 2, False)])
def test_the_d64_backward_takes_the_cuda_dkdv_with_tritons_bits(n, causal, h, h_kv, promote, monkeypatch):
    """matched_factored's backward at D = 64 with the CUDA dK/dV kernel's D = 64 build without dQ
    (``DELTAMATCH_KERNEL_CUDA_DKDV64=ws3``; unset, its form with dQ, the test below) gives the bits of O, dQ, dK, dV
    that Triton's dK/dV launch gives (``=0``), twice."""
    from deltamatch.kernels import triton_fwd
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DKDV64_SWITCH

    q, k, v, do = attention_inputs(2, n, h, h_kv, seed=31, d=64)
    calls = []
    fused = cuda_lib.dkdv_factored
    monkeypatch.setattr(cuda_lib, "dkdv_factored", lambda *a, **kw: calls.append(kw["variant"]) or fused(*a, **kw))
    monkeypatch.setenv(triton_fwd.ACC_PROMOTE_SWITCH, "1" if promote else "0")
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "ws3")
    fn = lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored")  # noqa: E731
    ours, again = _fwd_bwd(fn, q, k, v, do), _fwd_bwd(fn, q, k, v, do)
    assert calls == ["ws3", "ws3"]  # the switch took effect
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "0")
    theirs = _fwd_bwd(fn, q, k, v, do)
    assert len(calls) == 2
    for name, a, b, c in zip(("O", "dQ", "dK", "dV"), ours, again, theirs):
        assert torch.equal(a, b), name
        assert torch.equal(a, c), f"{name}: relative {relative_error(a, c):.2e} from Triton's dK/dV launch's"


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("n, causal", [(130, True), (130, False), (256, False), (1000, True), (1000, False),
                                       (1024, True)])
def test_the_d64_dkdv_with_dq_against_the_d64_dkdv_and_dq(d64_dkdv_operands, n, causal, ordered):
    """The D = 64 dK/dV launch with dQ (``ws3xfd``: the dQ warpgroup, 448 folded into the row terms) against the D = 64
    dK/dV without dQ and the D = 64 dQ kernel (each Triton's bits, tests above) on the same operands, held as D = 128's
    folded form is held to the unfolded one (``test_the_folded_form_is_ws3x_to_rounding``): with 448 folded P̂ᵀ and
    dŜᵀ lie within a few ulps of the unfolded values before their casts, so an E4M3 code flips where a value lay that
    close to a rounding boundary (the first run: 40 of 256,000 elements of dK beyond one bf16 rounding at N = 1000,
    GQA 8 on 2, not causal; 10^-4 in norm held everywhere). So dQ, dK and dV within 10^-3 in norm, all but 10^-3 of
    the elements within one bf16 rounding, and every row within a quarter of its norm (a layout, channel-chunk,
    swizzle or scale mistake moves whole rows). N = 130: a ragged second CTA without a second half; 1000: GQA 8 on 2;
    256: one CTA."""
    ops = d64_dkdv_operands(n, causal)
    dq, dk, dv = d64_dqdkdv(ops, ordered=ordered)
    dk0, dv0 = d64_cuda_dkdv(ops)
    dq0 = d64_cuda_dq(ops)
    torch.cuda.synchronize()
    assert dq.shape == dq0.shape and dk.shape == dk0.shape and dv.shape == dv0.shape
    for name, ours, theirs in (("dQ", dq, dq0), ("dK", dk, dk0), ("dV", dv, dv0)):
        assert torch.isfinite(ours).all(), name
        assert_within_rounding(name, ours, theirs, 1e-3, rows=True)
    with pytest.raises(ValueError, match=r"at D = 64 the dK/dV kernel is built as .* and \('ws3xfd', 'ws3xfdt'\) "
                                         "with it"):
        d64_dqdkdv(ops, variant="ws3xfdp")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("n, causal, h, h_kv", [(130, True, 2, 2), (1000, False, 8, 2), (1024, True, 2, 2),
                                                (8192, True, 8, 8)])
def test_the_d64_tma_epilogue_gives_the_store_epilogues_bits(d64_dkdv_operands, n, causal, h, h_kv, ordered, dtype):
    """``ws3xfdt`` at D = 64 stages dK and dV in each consumer's freed K̂ and V̂ buffers as two 32-row boxes of the 64
    channels (``stmatrix``, the 128-byte swizzle) and writes them by tensor stores: ``ws3xfd``'s bits for dK and dV in
    bf16 and fp16, and for dQ where its adds are ordered (any order: within rounding), rows past a ragged N left out
    (130: a second CTA with 2 of its 128 keys; 1000: its last box holds 40 rows, its second 32-row box 8)."""
    ops = dict(d64_dkdv_operands(n, causal, h, h_kv), dtype=dtype)
    base = d64_dqdkdv(ops, ordered=ordered)
    ours = d64_dqdkdv(ops, variant="ws3xfdt", ordered=ordered)
    torch.cuda.synchronize()
    for name, a, b in zip(("dQ", "dK", "dV"), ours, base):
        assert a.dtype == dtype and a.shape == b.shape and a.shape[1] == n, name
        assert torch.isfinite(a).all(), name
        if ordered or name != "dQ":
            assert torch.equal(a, b), f"{name} differs: relative {relative_error(a, b):.2e}"
        else:
            assert_within_rounding(name, a, b, 1e-3, rows=True)


@pytest.mark.parametrize("n, causal, h, h_kv", [(8192, True, 8, 8), (4096, False, 4, 2), (1000, True, 8, 2)])
def test_the_d64_ordered_dq_is_bit_reproducible_however_sectioned(d64_dkdv_operands, n, causal, h, h_kv):
    """At D = 64 the ordered adds give dQ one set of bits, as at D = 128: run after run, whichever kv heads the launch
    interleaves (``section_heads``; 3 leaves a smaller last section) and whichever count the adds wait on (``sync`` 0
    or 11), and from a scratch of NaN (each tile's first add stores); 8192 queries on 2 × 8 heads make 1,024 CTAs, so
    CTAs wait on ones launched earlier, running or done."""
    ops = d64_dkdv_operands(n, causal, h, h_kv)
    s = ops["saved"]
    nan_acc = torch.full(s["q8"].shape, float("nan"), device=s["q8"].device)
    runs = [d64_dqdkdv(ops, ordered=True, section_heads=sections, sync=sync, dq_acc=acc)
            for sections, sync, acc in ((None, None, None), (1, 11, None), (3, 0, None), (None, 11, nan_acc))]
    torch.cuda.synchronize()
    first = runs[0]
    for dq, dk, dv in runs[1:]:
        assert torch.equal(dk, first[1]) and torch.equal(dv, first[2])
        assert torch.equal(dq, first[0]), f"dQ differs: relative {relative_error(dq, first[0]):.2e}"
    assert_within_rounding("dQ", first[0], d64_cuda_dq(ops), 1e-3, rows=True)


@pytest.mark.parametrize("n, causal, h, h_kv", [(130, True, 2, 2), (1000, True, 8, 2), (1000, False, 8, 2)])
def test_the_d64_backward_with_dq_in_the_dkdv_launch(n, causal, h, h_kv, monkeypatch):
    """matched_factored at D = 64 with ``DELTAMATCH_KERNEL_CUDA_DKDV64`` unset (its default, ``ws3xfd``) runs one launch
    for dQ, dK and dV (the forward writes K̂ᶜ in fragment order for it) and gives O's bits and dQ, dK, dV within
    rounding of ``=ws3``'s (the D = 64 dK/dV without dQ, then Triton's dQ launch: Triton's bits), twice the same bits
    (ordered adds); with ``DELTAMATCH_KERNEL_DQ_ORDERED=0`` the form runs without dQ, beside the dQ launch, and gives
    ``ws3``'s bits."""
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DKDV64_SWITCH, DQ_ORDERED_SWITCH

    q, k, v, do = attention_inputs(2, n, h, h_kv, seed=43, d=64)
    calls = []
    fused, with_dq = cuda_lib.dkdv_factored, cuda_lib.dqdkdv_factored
    monkeypatch.setattr(cuda_lib, "dkdv_factored", lambda *a, **kw: calls.append(kw["variant"]) or fused(*a, **kw))
    monkeypatch.setattr(cuda_lib, "dqdkdv_factored",
                        lambda *a, **kw: calls.append(("dq", kw["variant"], kw["ordered"])) or with_dq(*a, **kw))
    monkeypatch.delenv(DQ_ORDERED_SWITCH, raising=False)
    monkeypatch.delenv(CUDA_DKDV64_SWITCH, raising=False)
    fn = lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored")  # noqa: E731
    ours, again = _fwd_bwd(fn, q, k, v, do), _fwd_bwd(fn, q, k, v, do)
    assert calls == [("dq", "ws3xfd", True)] * 2  # the default took effect
    monkeypatch.setenv(DQ_ORDERED_SWITCH, "0")
    apart = _fwd_bwd(fn, q, k, v, do)
    assert calls[2:] == ["ws3"]
    monkeypatch.delenv(DQ_ORDERED_SWITCH)
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "ws3")
    theirs = _fwd_bwd(fn, q, k, v, do)
    assert calls[3:] == ["ws3"]
    for name, a, b, c, d in zip(("O", "dQ", "dK", "dV"), ours, again, apart, theirs):
        assert torch.equal(a, b), name
        assert torch.equal(c, d), f"{name}: relative {relative_error(c, d):.2e} from the default's"
        if name == "O":
            assert torch.equal(a, d)
        else:
            assert_within_rounding(name, a, d, 1e-3, rows=name == "dQ")


def triton_factored_dq(ops, promote):
    """Triton's factored dQ launch, promoted per 64-key tile or not."""
    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_fwd import FACTORED_ACC_PROMOTE

    cfg = {**triton_bwd.factored_config(triton_bwd.backward_config(128), 128)["dq"],
           "ACC_PROMOTE": FACTORED_ACC_PROMOTE if promote else None}
    dq = torch.empty(ops["q_shape"], device="cuda", dtype=ops["dtype"])
    triton_bwd._launch_dq(ops["saved"], ops["do8"], ops["sdo"], ops["delta_m"], dq, None, ops["causal"],
                          ops["qk_scale"], ops["scale"], ops["n"], cfg,
                          factored=dict(k8t=ops["k8t_c"], skc=ops["skc"], rs=ops["rs"]))
    return dq


def cuda_factored_dq(ops, promote, variant="ws3"):
    s = ops["saved"]
    return cuda_lib.dq_factored(s["q8"], s["k8"], s["v8"], ops["do8"], ops["k8t_f"], s["sq"], s["sk"], s["sv"],
                                ops["sdo"], ops["skc"], ops["rs"], s["lse2"], ops["delta_m"], ops["n"], ops["causal"],
                                ops["qk_scale"], ops["scale"], dtype=ops["dtype"], promote=promote, variant=variant)


# N = 130: a ragged second CTA with no second half; 256: both halves share every key tile but the second half's
# diagonal; 1024: many tiles; 1000: GQA 8 on 2, a ragged second half
DQ_CASES = [(n, causal, promote) for n in (130, 256, 1024, 1000) for causal in (True, False) for promote in (True, False)]


@pytest.mark.parametrize("variant", cuda_lib.DQ_VARIANTS)
@pytest.mark.parametrize("n, causal, promote", DQ_CASES)
def test_factored_dq_is_tritons_bit_for_bit(dk_operands, n, causal, promote, variant):
    ops = dk_operands(n, causal, *heads(n))
    ours, theirs = cuda_factored_dq(ops, promote, variant), triton_factored_dq(ops, promote)
    torch.cuda.synchronize()
    assert_same_bits(ours, theirs)  # first at (b, query, head, d)


def cuda_dqdkdv(ops, **options):
    s = ops["saved"]
    return cuda_lib.dqdkdv_factored(
        s["q8"], s["k8"], s["v8"], ops["do8"], ops["q8t_f"], ops["do8t_f"], ops["k8t_f"], s["sq"], s["sk"], s["sv"],
        ops["sdo"], ops["sqc"], ops["sdoc"], ops["skc"], ops["rs"], s["lse2"], ops["delta_m"], ops["n"],
        ops["causal"], ops["qk_scale"], ops["scale"], dtype=ops["dtype"], irs=ops["irs"], **options)


def runs_from_new_and_nan_scratch(ops, variant, ordered=True, **options):
    """Two runs of ``variant``: with a new FP32 scratch, and (ordered) from one of NaN, where each query tile's first
    add must store and not add (a tile left unstored, or read before its last add, would carry NaN into dQ)."""
    s = ops["saved"]
    scratch = torch.full(s["q8"].shape, float("nan"), device=s["q8"].device) if ordered else None
    return [cuda_dqdkdv(ops, variant=variant, ordered=ordered, dq_acc=acc, **options) for acc in (None, scratch)]


# dQ inside the dK/dV launch (promoted): the dK/dV cases
DQDKDV_CASES = [(n, causal, "ws3") for n in (130, 256, 1024, 1000) for causal in (True, False)]


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("n, causal, variant", DQDKDV_CASES)
def test_dkdv_with_dq_keeps_dk_dv_bits_and_dq_to_roundoff(dk_operands, n, causal, variant, ordered):
    """``dqdkdv_factored``'s dK and dV are the fused dK/dV's bits; ordered, they sum the same per-tile products in FP32
    with the diagonal first instead of last, so a rounding to bf16 can land on the neighbouring value: within 10^-4 in
    norm, and all but 10^-4 of the elements within one bf16 rounding (session 14: 3 of 512,000 elements of dK beyond
    half that, 2^-8, at N = 1000 with GQA; 1.0e-5 in norm at 8K). Its dQ adds the same per-64-key products as
    ``dq_factored`` in another order (FP32 reductions), from dŜ codes formed by the dK/dV kernel's arithmetic (Sᵀ,
    dP̂ᵀ with keys as wgmma's M) rather than the dQ kernel's (S, dP̂): the two can round an element to neighbouring
    E4M3 codes, which moves that query row's dQ by up to one code's share (the first run: a few rows of 1024, 76
    elements of 524,288 beyond one bf16 rounding). So: the whole tensor within 10^-3 in norm, all but 10^-3 of the
    elements within one bf16 rounding, and every query row within a quarter of its norm; a layout, swizzle, masking
    or scale mistake moves whole products, 100% of a row. ``ordered`` (the adds in one order) or in any order."""
    ops = dk_operands(n, causal, *heads(n))
    dq, dk, dv = cuda_dqdkdv(ops, variant=variant, ordered=ordered)
    dk0, dv0 = cuda_factored_dkdv(ops, True, variant)
    dq0 = cuda_factored_dq(ops, True)
    torch.cuda.synchronize()
    if not ordered:
        assert torch.equal(dk, dk0) and torch.equal(dv, dv0)
    for name, ours, theirs in (("dK", dk, dk0), ("dV", dv, dv0)):
        assert_within_rounding(name, ours, theirs, 1e-4)
    assert torch.isfinite(dq).all()
    assert_within_rounding("dQ", dq, dq0, 1e-3, rows=True)


def assert_within_rounding(name, ours, theirs, share, rows=False):
    """``ours`` within ``share`` of ``theirs`` in norm, all but ``share`` of its elements within one bf16 rounding;
    ``rows``: every row (the last dimension) within a quarter of its norm, which a layout, swizzle, masking or scale
    mistake would exceed."""
    ours, theirs = ours.float(), theirs.float()
    assert relative_error(ours, theirs) < share, f"{name}: relative {relative_error(ours, theirs):.2e}"
    beyond = (ours - theirs).abs() > theirs.abs() * 2.0 ** -7 + 1e-6 * theirs.abs().max()
    assert beyond.float().mean() < share, f"{name}: {int(beyond.sum())} of {ours.numel()} beyond one bf16 rounding"
    if rows:
        apart = (ours - theirs).norm(dim=-1) / theirs.norm(dim=-1).clamp_min(1e-30)
        worst = apart.max().item()
        assert worst < 0.25, f"{name}: a row {worst:.1%} apart, at {tuple((apart == worst).nonzero()[0].tolist())}"


@pytest.mark.parametrize("n, causal, h, hk", [(8192, True, 8, 8), (4096, False, 4, 2), (1000, True, 8, 2)])
def test_ordered_dq_is_bit_reproducible_however_the_launch_is_sectioned(dk_operands, n, causal, h, hk):
    """With ordered adds (decreasing key blocks per query tile) dQ has one set of bits: run after run, and whichever
    kv heads the launch interleaves (``section_heads``, 3 leaving a smaller last section: which CTAs run side by side
    and wait on each other), and whichever count the adds wait on (``sync`` 0, once an add's writes have completed;
    11, the default, once its buffer has been read). 8192 queries on 2 × 8 heads make 1,024 CTAs, eight times what the
    H200 holds at once, so a CTA waits on ones launched earlier, running or done (a launch order against the adds'
    order would hang here). Each tile's first add stores rather than adds, so the FP32 scratch is not zeroed: one run
    starts from a scratch of NaN, which any tile left unstored would carry into dQ. The unordered form is not required
    to differ, so only its closeness is checked (the test above)."""
    ops = dk_operands(n, causal, h, hk)
    s = ops["saved"]
    b, h_q, n_pad, d = s["q8"].shape
    nan_acc = torch.full((b, h_q, n_pad, d), float("nan"), device=s["q8"].device)
    runs = [cuda_dqdkdv(ops, ordered=True, section_heads=heads, sync=sync, dq_acc=acc)
            for heads, sync, acc in ((None, None, None), (1, 11, None), (3, 0, None), (1, 0, None), (None, 11, nan_acc))]
    torch.cuda.synchronize()
    first = runs[0]
    for dq, dk, dv in runs[1:]:
        assert torch.equal(dk, first[1]) and torch.equal(dv, first[2])
        assert torch.equal(dq, first[0]), f"dQ differs: relative {relative_error(dq, first[0]):.2e}"
    dq0 = cuda_factored_dq(ops, True)
    assert relative_error(first[0], dq0) < 1e-3


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("n, causal", [(130, True), (256, False), (1000, True), (1000, False), (1024, True)])
def test_the_ds_tile_by_lane_exchange_gives_ws3s_bits(dk_operands, n, causal, ordered):
    """``ws3x`` writes dQ's dŜ tile a 32-bit word at a time after a lane exchange (``to_fragments_exchanged``) where
    ``ws3`` stores its bytes one by one: the same bytes in the same places, so dK and dV are ``ws3``'s bits and, with
    the adds ordered, dQ too; in any order the adds may round differently (FP32 sums), within 10^-3 in norm as the
    unordered form is held."""
    ops = dk_operands(n, causal, *heads(n))
    base = cuda_dqdkdv(ops, variant="ws3", ordered=ordered)
    ours = cuda_dqdkdv(ops, variant="ws3x", ordered=ordered)
    torch.cuda.synchronize()
    assert torch.equal(ours[1], base[1]) and torch.equal(ours[2], base[2])
    if ordered:
        assert torch.equal(ours[0], base[0]), f"dQ differs: relative {relative_error(ours[0], base[0]):.2e}"
    else:
        assert relative_error(ours[0], base[0]) < 1e-3


@pytest.mark.parametrize("n, causal, h, hk", [(130, True, 2, 2), (256, False, 2, 2), (1000, True, 8, 2),
                                              (1024, True, 2, 2), (4096, False, 4, 2), (8192, True, 8, 8)])
def test_the_persistent_form_gives_ws3x_ordered_bits(dk_operands, n, causal, h, hk):
    """``ws3xp`` runs ``ws3x`` ordered in one CTA an SM, each taking key blocks from a counter in the ordered launch's
    order: the same products summed in the same order, so dQ, dK and dV are ``ws3x``'s bits. The ring's stages, the
    dŜ and dQ buffers' turns and the K̂/V̂ barrier's phase run on across a CTA's key blocks, so a block that took an
    odd number of tiles (GQA's heads, the ragged end) shifts every later one's; 8192 queries on 8 heads are 512 key
    blocks, about four a CTA. Each query tile's first add stores, so one run starts from a scratch of NaN: a tile left
    unstored would carry it into dQ."""
    ops = dk_operands(n, causal, h, hk)
    base = cuda_dqdkdv(ops, variant="ws3x", ordered=True)
    runs = runs_from_new_and_nan_scratch(ops, "ws3xp")
    torch.cuda.synchronize()
    for ours in runs:
        for name, a, b in zip(("dQ", "dK", "dV"), ours, base):
            assert torch.equal(a, b), f"{name} differs: relative {relative_error(a, b):.2e}"
    with pytest.raises(ValueError, match="built with its dQ adds ordered only"):
        cuda_dqdkdv(ops, variant="ws3xp", ordered=False)


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("n, causal, h, hk", [(130, True, 2, 2), (1000, True, 8, 2), (1024, False, 2, 2),
                                              (4096, True, 4, 2)])
def test_the_folded_form_is_ws3x_to_rounding(dk_operands, n, causal, h, hk, ordered):
    """``ws3xf`` takes lse2 − log2(448) and (1/s) / 448 (``cuda_lib.DKDV_FOLDED``) so that its exponential gives P · 448
    itself: P̂ᵀ and dŜᵀ within a few ulps of ``ws3x``'s before their casts, so a code flips only where a value lay that
    close to an E4M3 rounding boundary. dQ, dK and dV within 10^-3 of ``ws3x``'s in norm, all but 10^-3 of the elements
    within one bf16 rounding, every row within a quarter of its norm (a mistake in the folding moves whole tiles by
    448×); ordered, the same bits twice."""
    ops = dk_operands(n, causal, h, hk)
    base = cuda_dqdkdv(ops, variant="ws3x", ordered=ordered)
    runs = [cuda_dqdkdv(ops, variant="ws3xf", ordered=ordered) for _ in range(2)]
    torch.cuda.synchronize()
    if ordered:
        assert all(torch.equal(a, b) for a, b in zip(*runs))
    for name, ours, theirs in zip(("dQ", "dK", "dV"), runs[0], base):
        assert torch.isfinite(ours).all(), name
        assert_within_rounding(name, ours, theirs, 1e-3, rows=True)


def _record_dkdv_forms(monkeypatch) -> list:
    """The ``variant`` of every ``cuda_lib.dqdkdv_factored`` call from here on, in order (each call still runs)."""
    calls = []
    fused = cuda_lib.dqdkdv_factored
    monkeypatch.setattr(cuda_lib, "dqdkdv_factored", lambda *a, **kw: calls.append(kw["variant"]) or fused(*a, **kw))
    return calls


@pytest.mark.parametrize("variant", ["ws3xfs", "ws3xfd", "ws3xfdp", "ws3xfdt"])
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("n, causal, h, hk", [(130, True, 2, 2), (1000, True, 8, 2), (1024, False, 2, 2),
                                              (4096, True, 4, 2), (8192, True, 8, 8)])
def test_the_split_promotion_and_the_dq_warpgroup_give_ws3xf_bits(dk_operands, n, causal, h, hk, ordered, variant):
    """``ws3xfs`` promotes dV's and dK's products in 64-channel halves, ``ws3xfd`` also moves dQ's product into a fourth
    warpgroup (m64n32 chunks, each 64-key half from zero and added in FP32 as the consumers did), ``ws3xfdp`` promotes
    in 32-channel quarters, one in flight while the last is added, ``ws3xfdt`` stores dK and dV through shared memory
    and the TMA: every element is the same k = 32 steps' sum, so dK and dV are ``ws3xf``'s bits, and so is dQ where its
    adds are ordered (any order: within rounding); the ordered runs give the same bits twice, one from a scratch of NaN
    (a query tile's first add stores)."""
    ops = dk_operands(n, causal, h, hk)
    base = cuda_dqdkdv(ops, variant="ws3xf", ordered=ordered)
    runs = runs_from_new_and_nan_scratch(ops, variant, ordered)
    torch.cuda.synchronize()
    for ours in runs:
        for name, a, b in zip(("dQ", "dK", "dV"), ours, base):
            assert torch.isfinite(a).all(), name
            if ordered or name != "dQ":
                assert torch.equal(a, b), f"{name} differs: relative {relative_error(a, b):.2e}"
            else:
                assert_within_rounding(name, a, b, 1e-3, rows=True)


@pytest.mark.parametrize("n, h, hk", [(130, 2, 2), (1000, 8, 2)])
def test_the_tma_epilogue_gives_the_store_epilogues_bits_in_fp16(dk_operands, n, h, hk):
    """``ws3xfdt``'s epilogue packs dK and dV to the output dtype in shared memory (``stmatrix``) and writes them by
    tensor stores: in fp16 as in bf16 (the test above), ``ws3xfd``'s bits, rows past a ragged N left out."""
    ops = dict(dk_operands(n, True, h, hk), dtype=torch.float16)
    base = cuda_dqdkdv(ops, variant="ws3xfd", ordered=True)
    ours = cuda_dqdkdv(ops, variant="ws3xfdt", ordered=True)
    for name, a, b in zip(("dQ", "dK", "dV"), ours, base):
        assert a.dtype == torch.float16 and a.shape[1] == n, name
        assert torch.isfinite(a).all() and torch.equal(a, b), name


def test_the_dq_warpgroup_in_the_backward_gives_ws3xf_bits(monkeypatch):
    """matched_factored with ``DELTAMATCH_KERNEL_CUDA_DKDV=ws3xfdt`` (the default), ``ws3xfd``, ``ws3xfdp`` and
    ``ws3xfs``: O, dQ, dK and dV are ``ws3xf``'s (ordered adds) bit for bit, GQA 4 on 2 at a ragged N."""
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DKDV_SWITCH

    q, k, v, do = attention_inputs(2, 1000, 4, 2, seed=23)
    calls = _record_dkdv_forms(monkeypatch)
    run = lambda: _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, True, "matched_factored"), q, k, v, do)
    monkeypatch.setenv(CUDA_DKDV_SWITCH, "ws3xf")
    base = run()
    for variant in ("", "ws3xfd", "ws3xfdp", "ws3xfs"):  # "": unset, the default (ws3xfdt)
        monkeypatch.setenv(CUDA_DKDV_SWITCH, variant)
        ours = run()
        for name, a, b in zip(("o", "dq", "dk", "dv"), ours, base):
            assert torch.equal(a, b), (variant, name)
    assert calls == ["ws3xf", "ws3xfdt", "ws3xfd", "ws3xfdp", "ws3xfs"]


def test_the_folded_form_in_the_backward_against_reference_and_fp64(monkeypatch):
    """matched_factored with ``DELTAMATCH_KERNEL_CUDA_DKDV=ws3xf``: dQ, dK, dV within a quarter of the reference
    simulation's own distance to FP64 from the reference, and no further from FP64 than the reference (+15%)."""
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DKDV_SWITCH

    q, k, v, do = attention_inputs(2, 1000, 4, 2, seed=19)
    calls = _record_dkdv_forms(monkeypatch)
    monkeypatch.setenv(CUDA_DKDV_SWITCH, "ws3xf")
    ours = _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, True, "matched_factored"), q, k, v, do)
    assert calls == ["ws3xf"]
    ref = _fwd_bwd(lambda a, b, c: attention_reference(a, b, c, True, "matched_factored"), q, k, v, do)
    exact = _fwd_bwd(lambda a, b, c: attention_exact(a, b, c, True), q, k, v, do, dtype=torch.float64)
    assert_near_reference(ours, ref, exact)


def test_the_dkdv_switch_picks_the_form_in_the_backward(monkeypatch):
    """matched_factored's backward runs its dQ-in-dK/dV launch as ``ws3xfdt`` (dŜ's tile by lane exchange, 448 folded
    into the row terms, dQ's product in a warpgroup of its own, dK and dV by tensor stores) unless
    ``DELTAMATCH_KERNEL_CUDA_DKDV`` asks for ``ws3x`` or ``ws3`` (the byte stores); those two give the same gradients
    bit for bit (ordered adds), and the default gives them to rounding (as
    ``test_the_folded_form_is_ws3x_to_rounding``)."""
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DKDV_SWITCH

    q, k, v, do = attention_inputs(1, 1000, 4, 2, seed=17)
    calls = _record_dkdv_forms(monkeypatch)
    run = lambda: _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, True, "matched_factored"), q, k, v, do)
    monkeypatch.delenv(CUDA_DKDV_SWITCH, raising=False)
    ours = run()
    monkeypatch.setenv(CUDA_DKDV_SWITCH, "ws3x")
    exchanged = run()
    monkeypatch.setenv(CUDA_DKDV_SWITCH, "ws3")
    base = run()
    assert calls == ["ws3xfdt", "ws3x", "ws3"]
    assert all(torch.equal(a, b) for a, b in zip(exchanged, base))
    assert torch.equal(ours[0], exchanged[0])  # O: the forward is the same
    for name, a, b in zip(("dq", "dk", "dv"), ours[1:], exchanged[1:]):
        assert torch.isfinite(a).all(), name
        assert_within_rounding(name, a, b, 1e-3, rows=True)


@pytest.mark.parametrize("variant", cuda_lib.DELTA_VARIANTS)
@pytest.mark.parametrize("n, causal", [(n, causal) for n in (130, 256, 1024, 1000) for causal in (True, False)])
def test_delta_pass_is_tritons_bit_for_bit(dk_operands, n, causal, variant):
    """Matched's δ, dŜ's row scales and their inverses of the CUDA δ pass against Triton's (``_launch_delta_matched``
    with row scales, which ``dk_operands`` ran), bit for bit on every row Triton writes (each 128-query block holding one
    below N)."""
    ops = dk_operands(n, causal, *heads(n))
    s = ops["saved"]
    delta, rs, irs = cuda_lib.delta_factored(s["q8"], s["k8"], s["v8"], ops["do8"], s["sq"], s["sk"], s["sv"],
                                             ops["sdo"], s["lse2"], n, causal, ops["qk_scale"], variant=variant)
    torch.cuda.synchronize()
    rows = -(-n // 128) * 128
    for name, ours, theirs in (("delta", delta, ops["delta_m"]), ("rs", rs, ops["rs"]), ("irs", irs, ops["irs"])):
        ours, theirs = ours[..., :rows], theirs[..., :rows]
        assert torch.isfinite(ours).all(), name
        diff = (ours - theirs).abs()
        where = [tuple(i.tolist()) for i in (diff > 0).nonzero()[:4]]
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32)), (
            f"{name}: {int((diff > 0).sum())} of {diff.numel()} differ, max {diff.max().item():.3e}, first at {where}")


def delta_fp64(ops):
    """Matched's δ_i = Σ_j P_ij dP̂_ij, Σ_j |P_ij dP̂_ij| and max_j |P_ij (dP̂_ij − δ_i)| in FP64 from the δ pass's
    operands (codes, block scales, lse2), rows below N: P = 2^(S c − lse2) with S = Q̂ K̂ᵀ and c = s_q s_k qk_scale, dP̂
    = (dÔ V̂ᵀ) s_dO s_V, masked keys (≥ N, causal right of the query) 0."""
    s, n, causal = ops["saved"], ops["n"], ops["causal"]
    q8, k8, v8, do8 = (x.view(torch.float8_e4m3fn).double() for x in (s["q8"], s["k8"], s["v8"], ops["do8"]))
    group = q8.shape[1] // k8.shape[1]
    k8, v8 = (x.repeat_interleave(group, 1) for x in (k8, v8))
    sk, sv = (s[name].double().repeat_interleave(group, 1).repeat_interleave(64, -1) for name in ("sk", "sv"))
    sq, sdo = (x.double().repeat_interleave(128, -1) for x in (s["sq"], ops["sdo"]))
    scores = q8 @ k8.transpose(-1, -2) * (sq[..., :, None] * sk[..., None, :] * ops["qk_scale"])
    p = torch.exp2(scores - s["lse2"].double()[..., :, None])
    keys = torch.arange(p.shape[-1], device=p.device)
    visible = keys[None, :] < n
    if causal:
        visible = visible & (keys[None, :] <= keys[:, None])
    p = torch.where(visible, p, 0.0)
    terms = p * (do8 @ v8.transpose(-1, -2)) * (sdo[..., :, None] * sv[..., None, :])
    delta = terms.sum(-1)
    ds_max = (terms - p * delta[..., None]).abs().amax(-1)
    return delta[..., :n], terms.abs().sum(-1)[..., :n], ds_max[..., :n]


def test_a_row_max_delta_pass_after_a_forward_without_them_names_the_switches(monkeypatch):
    """``DELTAMATCH_KERNEL_CUDA_DELTA=w4pm`` after Triton's forward (``DELTAMATCH_KERNEL_CUDA_FWD=0``), which writes no
    row maxima: the backward stops with an error that names both switches, not a δ pass on garbage."""
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DELTA_SWITCH
    from deltamatch.kernels.triton_fwd import CUDA_FWD_SWITCH

    q, k, v, do = attention_inputs(1, 256, 2, 2, seed=5)
    monkeypatch.setenv(CUDA_FWD_SWITCH, "0")
    monkeypatch.setenv(CUDA_DELTA_SWITCH, "w4pm")
    with pytest.raises(ValueError, match=f"{CUDA_DELTA_SWITCH}=w4pm reads the forward's row maxima.*{CUDA_FWD_SWITCH}"):
        _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, True, "matched_factored"), q, k, v, do)


@pytest.mark.parametrize("n, causal", [(n, causal) for n in (130, 256, 1024, 1000) for causal in (True, False)])
def test_wide_delta_pass_against_tritons_and_fp64(dk_operands, n, causal):
    """The δ pass over 128-key tiles (``delta_wide``), every variant: δ within FP32 summation error of Triton's (10⁻⁵ of
    Σ_j |P_ij dP̂_ij|; both sum the same FP32 terms, in another order) and within 10⁻² of that sum of FP64's from the
    same codes (H200: 3·10⁻³ at worst for every kernel, Triton's included, as Hopper's FP8 wgmma accumulates its
    products at reduced precision); dŜ's row scales within 10⁻³ of Triton's and a bound on max_j |dS_ij|, their inverses
    ``row_scale_inverses``' bits; queries ≥ N δ = 0 and s = 1; each variant's bits twice, and the variants each other's
    (the same products in the same order) but those with emulated exponentials (``cuda_lib.EXP_EMULATED``: a
    polynomial within a few ulps of ex2.approx), whose δ and s lie within FP32 round-off of the others'. Those that
    bound max P from the forward's row maxima (``cuda_lib.DELTA_ROW_MAX``, reading the ``m2`` the 128-key forward
    saved) give the δ bits of the form without it, and s at or above its s (so the forward's S·c is the δ pass's, and
    the bound above the largest P formed) by no more than the bound's stated slack."""
    from deltamatch.kernels.triton_bwd import row_scale_inverses

    ops = dk_operands(n, causal, *heads(n))
    s = ops["saved"]
    assert s["m2"] is not None  # the fixture's forward is the 128-key CUDA one
    args = (s["q8"], s["k8"], s["v8"], ops["do8"], s["sq"], s["sk"], s["sv"], ops["sdo"], s["lse2"], n, causal,
            ops["qk_scale"])
    runs = {variant: [cuda_lib.delta_wide(*args, variant=variant,
                                          row_max=s["m2"] if variant in cuda_lib.DELTA_ROW_MAX else None)
                      for _ in range(2)]
            for variant in cuda_lib.DELTA_WIDE_VARIANTS}
    torch.cuda.synchronize()
    exact, total, ds_max = delta_fp64(ops)
    delta, rs, irs = runs["w4"][0]
    without = {"w4pm": "w4p", "w4pme8": "w4pe8", "w4pme4": "w4pe4"}
    assert set(without) == set(cuda_lib.DELTA_ROW_MAX)
    for variant, (first, again) in runs.items():
        assert all(torch.equal(a, b) for a, b in zip(first, again)), variant
        if variant in cuda_lib.DELTA_ROW_MAX:  # the same δ; s = (|δ| max P + max P|dP̂|) / 448 from a bound on max P
            base = runs[without[variant]][0]
            assert torch.equal(first[0], base[0]), variant
            rows = slice(0, n)
            ours, theirs = first[1][..., rows], base[1][..., rows]
            assert (ours >= theirs).all(), f"{variant}: s below the per-element max's at {(ours < theirs).nonzero()[:4]}"
            # the bound's slack: 2^-20 (|m| + |y| + 16) of max P (factored.cuh p_max_bound), |m| and |y| below 100 here
            assert s["m2"][..., rows].abs().max() < 100
            assert (ours <= theirs * (1 + 2.0**-20 * 216)).all(), f"{variant}: {(ours / theirs - 1).max():.2e}"
            assert torch.equal(first[2], row_scale_inverses(first[1])), variant
            assert (first[1][..., n:] == 1).all() and (first[0][..., n:] == 0).all(), variant
            continue
        if variant not in cuda_lib.EXP_EMULATED:
            assert all(torch.equal(a, b) for a, b in zip(first, (delta, rs, irs))), variant
        else:  # P within a few ulps of ex2.approx's: δ and s within FP32 round-off of the others'
            err = (first[0][..., :n] - delta[..., :n]).abs().double()
            assert (err <= 2e-6 * total).all(), f"{variant}: |δ − δ_w4| / Σ|P dP̂| {(err / total).max():.2e}"
            # s = (|δ| max P + max P|dP̂|) / 448: |δ|'s error over the bound is at most Σ|P dP̂| max P / max P|dP̂|
            # times P's, which a diffuse row can make a few times larger than P's own
            assert ((first[1] - rs).abs() <= 1e-5 * rs).all(), variant
            assert torch.equal(first[2], row_scale_inverses(first[1])), variant
        err = (first[0][..., :n] - ops["delta_m"][..., :n]).abs().double()
        assert (err <= 1e-5 * total).all(), f"{variant}: |δ − δ_triton| / Σ|P dP̂| {(err / total).max():.2e}"
    err = (delta[..., :n].double() - exact).abs()
    assert (err <= 1e-2 * total).all(), f"|δ − δ_fp64| / Σ|P dP̂| = {(err / total).max():.2e}"
    assert torch.equal(irs, row_scale_inverses(rs))
    ours, theirs = rs[..., :n], ops["rs"][..., :n]
    relative = (ours - theirs).abs() / theirs
    assert (relative <= 1e-3).all(), f"rs: max relative {relative.max():.2e}"
    assert (ours.double() * 448 * 1.01 >= ds_max).all()
    pad = slice(n, -(-n // 128) * 128)
    assert (delta[..., pad] == 0).all() and (rs[..., pad] == 1).all() and (irs[..., pad] == 1).all()
    with pytest.raises(ValueError, match=r"variant 'ws4'"):
        cuda_lib.delta_wide(*args, variant="ws4")


@pytest.mark.parametrize("n, causal", [(130, True), (1000, True), (1000, False), (8192, True)])
def test_the_d64_delta_pass_against_tritons_and_fp64(n, causal, monkeypatch):
    """The δ pass's D = 64 build (``dm_delta_wide_d64``: rows of 64 codes, the 64-byte swizzle), each variant built
    there, against Triton's δ pass at D = 64 on the same operands from the D = 64 CUDA forward (GQA 8 on 2 at N = 1000,
    a ragged CTA at 130, the reference length): δ within FP32 summation error of Triton's (10⁻⁵ of Σ_j |P_ij dP̂_ij|)
    and within 10⁻² of that sum of FP64's; dŜ's row scales within 10⁻³ of Triton's and a bound on max_j |dS_ij|, their
    inverses ``row_scale_inverses``' bits; queries ≥ N δ = 0 and s = 1; each variant's bits twice. Those that emulate a
    share of the exponentials lie within FP32 round-off of ``w4p``; those that bound max P from the forward's row
    maxima give the δ bits of their form without them and s at or above its s by no more than the bound's slack."""
    from deltamatch.kernels import triton_bwd, triton_fwd

    monkeypatch.setenv(triton_fwd.CUDA_FWD_SWITCH, "w4p")  # the forward that writes the row maxima
    h, hk = heads(n)
    q, k, v, do = attention_inputs(1 if n == 8192 else 2, n, h, hk, seed=n + 64, d=64)
    ops = factored_dv_operands(q, k, v, do, causal)
    s = ops["saved"]
    assert s["m2"] is not None and s["m2"][..., :n].abs().max() < 100  # |m| within the slack asserted below
    delta_t, rs_t = ops["delta"].clone(), torch.empty_like(ops["delta"])
    cfg = triton_bwd.factored_config(triton_bwd.backward_config(64), 64)
    triton_bwd._launch_delta_matched(s, ops["do8"], ops["sdo"], delta_t, causal, ops["qk_scale"], n, cfg["delta"],
                                     row_scales=rs_t)
    args = (s["q8"], s["k8"], s["v8"], ops["do8"], s["sq"], s["sk"], s["sv"], ops["sdo"], s["lse2"], n, causal,
            ops["qk_scale"])
    runs = {variant: [cuda_lib.delta_wide(*args, variant=variant,
                                          row_max=s["m2"] if variant in cuda_lib.DELTA_ROW_MAX else None)
                      for _ in range(2)]
            for variant in cuda_lib.DELTA_WIDE_D64_VARIANTS}
    torch.cuda.synchronize()
    exact, total, ds_max = delta_fp64(ops)
    rows, pad = slice(0, n), slice(n, -(-n // 128) * 128)
    for variant, (first, again) in runs.items():
        assert all(torch.equal(a, b) for a, b in zip(first, again)), variant
        delta, rs, irs = first
        assert torch.equal(irs, triton_bwd.row_scale_inverses(rs)), variant
        assert (delta[..., pad] == 0).all() and (rs[..., pad] == 1).all() and (irs[..., pad] == 1).all(), variant
        if variant in cuda_lib.DELTA_ROW_MAX:  # the same δ; s = (|δ| max P + max P|dP̂|) / 448 from a bound on max P
            base = runs[cuda_lib.DELTA_ROW_MAX[variant]][0]
            assert torch.equal(delta, base[0]), variant
            ours, theirs = rs[..., rows], base[1][..., rows]
            assert (ours >= theirs).all(), f"{variant}: s below the per-element max's at {(ours < theirs).nonzero()[:4]}"
            assert (ours <= theirs * (1 + 2.0**-20 * 216)).all(), f"{variant}: {(ours / theirs - 1).max():.2e}"
            continue
        if variant in cuda_lib.EXP_EMULATED:  # P within a few ulps of ex2.approx's: within FP32 round-off of w4p's
            err = (delta[..., rows] - runs["w4p"][0][0][..., rows]).abs().double()
            assert (err <= 2e-6 * total).all(), f"{variant}: |δ − δ_w4p| / Σ|P dP̂| {(err / total).max():.2e}"
            assert ((rs - runs["w4p"][0][1]).abs() <= 1e-5 * rs).all(), variant
        err = (delta[..., rows] - delta_t[..., rows]).abs().double()
        assert (err <= 1e-5 * total).all(), f"{variant}: |δ − δ_triton| / Σ|P dP̂| {(err / total).max():.2e}"
        err = (delta[..., rows].double() - exact).abs()
        assert (err <= 1e-2 * total).all(), f"{variant}: |δ − δ_fp64| / Σ|P dP̂| = {(err / total).max():.2e}"
        relative = (rs[..., rows] - rs_t[..., rows]).abs() / rs_t[..., rows]
        assert (relative <= 1e-3).all(), f"{variant}: rs max relative {relative.max():.2e}"
        assert (rs[..., rows].double() * 448 * 1.01 >= ds_max).all(), variant


@pytest.mark.parametrize("n, causal, h, h_kv", [(129, True, 2, 2), (1000, False, 4, 2), (8192, True, 2, 1)])
def test_the_d64_delta_pass_in_the_backward_against_reference_and_fp64(n, causal, h, h_kv, monkeypatch):
    """matched_factored at D = 64 with ``DELTAMATCH_KERNEL_CUDA_DELTA=w4p`` (the D = 64 build) after Triton's forward
    (``DELTAMATCH_KERNEL_CUDA_FWD=0``; Triton's kernels for the rest): dQ, dK, dV held to the reference simulation and
    FP64 as every other form is."""
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DELTA_SWITCH
    from deltamatch.kernels.triton_fwd import CUDA_FWD_SWITCH

    q, k, v, do = attention_inputs(1 if n == 8192 else 2, n, h, h_kv, seed=17, d=64)
    calls = []
    wide = cuda_lib.delta_wide
    monkeypatch.setattr(cuda_lib, "delta_wide", lambda *a, **kw: calls.append(kw["variant"]) or wide(*a, **kw))
    monkeypatch.setenv(CUDA_DELTA_SWITCH, "w4p")
    monkeypatch.setenv(CUDA_FWD_SWITCH, "0")
    ours = _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored"), q, k, v, do)
    assert calls == ["w4p"]  # the switch took effect
    ref = _fwd_bwd(lambda a, b, c: attention_reference(a, b, c, causal, "matched_factored"), q, k, v, do)
    exact = _fwd_bwd(lambda a, b, c: attention_exact(a, b, c, causal), q, k, v, do, dtype=torch.float64)
    assert_near_reference(ours, ref, exact)


@pytest.mark.parametrize("causal", [True, False])
def test_persistent_delta_pass_takes_query_tiles_in_turn(dk_operands, causal):
    """``w4pd`` (one CTA an SM taking query tiles from a counter) where the tiles outnumber the SMs, so that CTAs take
    two or three in turn, their key tiles running on through one ring of stages (2 × 8 heads × 17 tiles of 128 queries,
    the last ragged, GQA 8 on 2): ``w4p``'s bits, every run."""
    n = 2100
    assert 2 * 8 * -(-n // 128) > torch.cuda.get_device_properties(0).multi_processor_count
    ops = dk_operands(n, causal, 8, 2)
    s = ops["saved"]
    args = (s["q8"], s["k8"], s["v8"], ops["do8"], s["sq"], s["sk"], s["sv"], ops["sdo"], s["lse2"], n, causal,
            ops["qk_scale"])
    want = cuda_lib.delta_wide(*args, variant="w4p")
    for _ in range(3):
        got = cuda_lib.delta_wide(*args, variant="w4pd")
        assert all(torch.equal(a, b) for a, b in zip(got, want))


# causal and not; a CTA with one query (129), a ragged second half (1000, GQA 4 on 2), the 8K reference length
@pytest.mark.parametrize("variant", cuda_lib.DELTA_WIDE_VARIANTS)
@pytest.mark.parametrize("n, causal, h, h_kv", [(129, True, 2, 2), (1000, True, 4, 2), (1000, False, 4, 2),
                                                (8192, True, 2, 1)])
def test_wide_delta_pass_in_the_backward_against_reference_and_fp64(n, causal, h, h_kv, variant, monkeypatch):
    """matched_factored with its δ pass over 128-key tiles (``DELTAMATCH_KERNEL_CUDA_DELTA``): dQ, dK, dV within a
    quarter of the reference simulation's own distance to FP64 from the reference, and no further from FP64 than the
    reference (+15%), as the forward over 128-key tiles is held."""
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DELTA_SWITCH

    q, k, v, do = attention_inputs(1 if n == 8192 else 2, n, h, h_kv, seed=13)
    calls = []
    wide = cuda_lib.delta_wide
    monkeypatch.setattr(cuda_lib, "delta_wide", lambda *a, **kw: calls.append(kw["variant"]) or wide(*a, **kw))
    monkeypatch.setenv(CUDA_DELTA_SWITCH, variant)
    ours = _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored"), q, k, v, do)
    assert calls == [variant]  # the switch took effect
    ref = _fwd_bwd(lambda a, b, c: attention_reference(a, b, c, causal, "matched_factored"), q, k, v, do)
    exact = _fwd_bwd(lambda a, b, c: attention_exact(a, b, c, causal), q, k, v, do, dtype=torch.float64)
    assert_near_reference(ours, ref, exact)


@pytest.mark.parametrize("n, causal", [(130, True), (1000, False)])
def test_fragment_ordered_codes_are_the_natural_ones_permuted(dk_operands, n, causal):
    """The per-channel pass's fragment order on the GPU (what the CUDA dK/dV and dQ kernels read: Q̂'ᶜ, dÔᶜ, and K̂ᶜ as
    the factored forward writes it) against the natural codes permuted by PyTorch indexing (``fragment_token_order``),
    bit for bit."""
    from deltamatch.kernels.triton_quant import fragment_token_order

    from deltamatch.kernels.triton_bwd import k_fragment_order

    ops = dk_operands(n, causal, *heads(n))
    assert k_fragment_order(128, torch.bfloat16)  # so the forward wrote K̂ᶜ (k8t_f) in fragment order
    for natural, ordered in ((ops["q8t_c"], ops["q8t_f"]), (ops["do8t_c"], ops["do8t_f"]),
                             (ops["k8t_c"], ops["k8t_f"])):
        order = fragment_token_order(natural.shape[-1], natural.device)
        assert torch.equal(ordered.view(torch.uint8), natural[..., order].view(torch.uint8))


@pytest.mark.parametrize("n, causal", [(130, True), (1000, False)])
def test_row_scale_inverses_are_the_delta_passs(dk_operands, n, causal):
    """``triton_bwd.row_scale_inverses`` (what ``dkdv_factored`` forms when given no ``irs``) against the δ pass's own
    ``1.0 / s``, bit for bit: the dK/dV kernel reads either in place of its former per-tile division."""
    from deltamatch.kernels import triton_bwd

    ops = dk_operands(n, causal, *heads(n))
    ours = triton_bwd.row_scale_inverses(ops["rs"])
    assert torch.equal(ours.view(torch.int32), ops["irs"].view(torch.int32))
    assert not torch.equal(ops["irs"], torch.ones_like(ops["irs"]))  # not the masked rows' 1 everywhere


@pytest.fixture(scope="module")
def forward_operands():
    """The codes matched_factored's forward reads (Q̂, K̂ centred, token-major; V̂ᶜ channel-major), by the project's
    passes, per (n, causal, h, hk)."""
    from deltamatch.kernels.triton_quant import BLOCK_KV, BLOCK_Q, quantize_operand, quantize_per_channel, token_mean

    cache = {}

    def get(n, h, hk):
        if (n, h, hk) not in cache:
            q, k, v, _ = attention_inputs(2, n, h, hk, seed=n + h)
            q8, _, sq = quantize_operand(q, BLOCK_Q, layouts="token")
            k8, _, sk = quantize_operand(k, BLOCK_KV, centre=True, mean=token_mean(k), layouts="token")
            _, v8t, svc = quantize_per_channel(v, "v", layouts="channel")
            cache[n, h, hk] = dict(q=q, q8=q8, k8=k8, v8t=v8t, sq=sq, sk=sk, svc=svc)
        return cache[n, h, hk]

    return get


def triton_factored_forward(ops, causal, promote):
    from deltamatch.kernels import triton_fwd

    cfg = {**triton_fwd.forward_config(128, factored=True),
           "ACC_PROMOTE": triton_fwd.FACTORED_ACC_PROMOTE if promote else None}
    q = ops["q"]
    return triton_fwd.attention_forward(ops["q8"], ops["k8"], ops["v8t"], ops["sq"], ops["sk"], ops["svc"], q.shape,
                                        q.dtype, causal, 128**-0.5, config=cfg)


def cuda_factored_forward(ops, causal, promote, variant="ws4p"):
    q = ops["q"]
    return cuda_lib.fwd_factored(ops["q8"], ops["k8"], ops["v8t"], ops["sq"], ops["sk"], ops["svc"], tuple(q.shape),
                                 causal, 128**-0.5 * math.log2(math.e), dtype=q.dtype, promote=promote,
                                 variant=variant)


# the dQ cases: a ragged second CTA with no second half (130), halves that share all but one key tile (256), many
# tiles (1024), GQA 8 on 2 with a ragged second half (1000)
@pytest.mark.parametrize("variant", cuda_lib.FWD_VARIANTS)
@pytest.mark.parametrize("n, causal, promote", DQ_CASES)
def test_factored_forward_is_tritons_bit_for_bit(forward_operands, n, causal, promote, variant):
    """O and lse2 of the CUDA forward against Triton's factored forward: O bit for bit below N, lse2 bit for bit on
    every row Triton writes (each 64-query block that holds a query below N)."""
    ops = forward_operands(n, *heads(n))
    (o, lse), (o_ref, lse_ref) = (cuda_factored_forward(ops, causal, promote, variant),
                                  triton_factored_forward(ops, causal, promote))
    torch.cuda.synchronize()
    rows = -(-n // 64) * 64
    assert torch.isfinite(o).all() and torch.isfinite(lse[..., :rows]).all()
    for name, ours, theirs in (("o", o, o_ref), ("lse2", lse[..., :rows], lse_ref[..., :rows])):
        assert_same_bits(ours, theirs, name)


def _fwd_bwd(fn, q, k, v, do, dtype=None):
    ins = [(t if dtype is None else t.to(dtype)).detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*ins)
    o.backward(do.to(o.dtype))
    return [o.detach(), *(t.grad for t in ins)]


# causal and not; a CTA with one query (129), a ragged second half (1000, GQA 4 on 2), the 8K reference length
@pytest.mark.parametrize("variant", cuda_lib.FWD_WIDE_VARIANTS)
@pytest.mark.parametrize("n, causal, h, h_kv", [(129, True, 2, 2), (1000, True, 4, 2), (1000, False, 4, 2),
                                                (8192, True, 2, 1)])
def test_wide_forward_against_reference_and_fp64(n, causal, h, h_kv, variant, monkeypatch):
    """matched_factored with its forward over 128-key tiles (``DELTAMATCH_KERNEL_CUDA_FWD``): O, and dQ, dK, dV from
    its lse2, within a quarter of the reference simulation's own distance to FP64 from the reference, and no further
    from FP64 than the reference (+15%), as test_triton_gpu.test_against_reference_and_fp64 asks of Triton's."""
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_fwd import CUDA_FWD_SWITCH

    q, k, v, do = attention_inputs(1 if n == 8192 else 2, n, h, h_kv, seed=11)
    monkeypatch.setenv(CUDA_FWD_SWITCH, variant)
    ours = _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored"), q, k, v, do)
    monkeypatch.setenv(CUDA_FWD_SWITCH, "0")  # Triton's 64-key forward
    narrow = _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored"), q, k, v, do)
    ref = _fwd_bwd(lambda a, b, c: attention_reference(a, b, c, causal, "matched_factored"), q, k, v, do)
    exact = _fwd_bwd(lambda a, b, c: attention_exact(a, b, c, causal), q, k, v, do, dtype=torch.float64)
    assert not torch.equal(ours[0], narrow[0])  # the switch took effect
    assert_near_reference(ours, ref, exact)


@pytest.mark.parametrize("promote", [True, False])
@pytest.mark.parametrize("n, causal, h, h_kv", [(129, True, 2, 2), (1000, True, 4, 2), (1000, False, 4, 2),
                                                (8192, True, 2, 1)])
def test_the_d64_forward_against_reference_and_fp64(n, causal, h, h_kv, promote, monkeypatch):
    """matched_factored at D = 64 with the forward's D = 64 build (``DELTAMATCH_KERNEL_CUDA_FWD=w4p``: Q̂ and K̂ in the
    64-byte swizzle, P̂ V̂ᶜ by m64n64k32), promoted or not, and with it the δ
    pass's D = 64 build: O, dQ, dK, dV held to the reference simulation and FP64 as every other form is; the row
    maxima it writes are lse2's m (lse2 − m = log2(l) ≥ log2(448), l summing P · 448 with P = 1 at a row's max); the
    same bits twice. (Promoted or not by ``DELTAMATCH_KERNEL_ACC_PROMOTE``.)"""
    from deltamatch.kernels import triton_fwd
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import fp8_forward, triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DELTA_SWITCH

    q, k, v, do = attention_inputs(1 if n == 8192 else 2, n, h, h_kv, seed=23, d=64)
    calls = []
    wide = cuda_lib.fwd_wide
    monkeypatch.setattr(cuda_lib, "fwd_wide", lambda *a, **kw: calls.append(kw["variant"]) or wide(*a, **kw))
    monkeypatch.setenv(triton_fwd.CUDA_FWD_SWITCH, "w4p")
    monkeypatch.setenv(CUDA_DELTA_SWITCH, "w4p")
    monkeypatch.setenv(triton_fwd.ACC_PROMOTE_SWITCH, "1" if promote else "0")
    fn = lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored")  # noqa: E731
    ours, again = _fwd_bwd(fn, q, k, v, do), _fwd_bwd(fn, q, k, v, do)
    assert calls == ["w4p", "w4p"]  # the switch took effect
    assert all(torch.equal(a, b) for a, b in zip(ours, again))
    ref = _fwd_bwd(lambda a, b, c: attention_reference(a, b, c, causal, "matched_factored"), q, k, v, do)
    exact = _fwd_bwd(lambda a, b, c: attention_exact(a, b, c, causal), q, k, v, do, dtype=torch.float64)
    assert_near_reference(ours, ref, exact)
    _, saved, _ = fp8_forward(q, k, v, causal, "matched_factored", q.shape[-1] ** -0.5)
    gap = (saved["lse2"] - saved["m2"])[..., :n]
    assert (gap >= math.log2(448) - 1e-4).all(), gap.min()


# each emulating forward with the δ pass that matches it, and the row maxima read by the default δ pass
@pytest.mark.parametrize("forward, delta", [("w4p", "w4pm"), ("w4pe8", "w4pme8"), ("w4pe4", "w4pme4"),
                                            ("w4pe2", "w4pe2")])
@pytest.mark.parametrize("n, causal, h, h_kv", [(1000, True, 4, 2), (1000, False, 4, 2)])
def test_the_d64_forms_against_reference_and_fp64(n, causal, h, h_kv, forward, delta, monkeypatch):
    """matched_factored at D = 64 with each forward and δ pass built there (``DELTAMATCH_KERNEL_CUDA_FWD``,
    ``DELTAMATCH_KERNEL_CUDA_DELTA``; a share of the exponentials emulated, the row maxima read): O, dQ, dK, dV held to
    the reference simulation and FP64 as every other form is, and the same bits twice."""
    from deltamatch.kernels import triton_fwd
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_DELTA_SWITCH

    q, k, v, do = attention_inputs(2, n, h, h_kv, seed=29, d=64)
    calls = []
    fwd, dlt = cuda_lib.fwd_wide, cuda_lib.delta_wide
    monkeypatch.setattr(cuda_lib, "fwd_wide", lambda *a, **kw: calls.append(kw["variant"]) or fwd(*a, **kw))
    monkeypatch.setattr(cuda_lib, "delta_wide", lambda *a, **kw: calls.append(kw["variant"]) or dlt(*a, **kw))
    monkeypatch.setenv(triton_fwd.CUDA_FWD_SWITCH, forward)
    monkeypatch.setenv(CUDA_DELTA_SWITCH, delta)
    fn = lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored")  # noqa: E731
    ours, again = _fwd_bwd(fn, q, k, v, do), _fwd_bwd(fn, q, k, v, do)
    assert calls == [forward, delta] * 2  # the switches took effect
    assert all(torch.equal(a, b) for a, b in zip(ours, again))
    ref = _fwd_bwd(lambda a, b, c: attention_reference(a, b, c, causal, "matched_factored"), q, k, v, do)
    exact = _fwd_bwd(lambda a, b, c: attention_exact(a, b, c, causal), q, k, v, do, dtype=torch.float64)
    assert_near_reference(ours, ref, exact)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("promote", [True, False])
def test_wide_forward_is_deterministic_one_set_of_bits_and_refuses_a_bad_variant(forward_operands, promote, causal):
    """Two runs of each variant give the same bits, and the variants give each other's: they order the same arithmetic
    differently in time only (the pipelined issue, the consumers' turns). Those that emulate a share of the exponentials
    (``cuda_lib.EXP_EMULATED``) give their own, within the polynomial's error of the others'. The row maxima every
    variant writes when asked (``row_max``, for the δ pass's ``cuda_lib.DELTA_ROW_MAX``) are one set of bits, O and
    lse2 those of the launch without them, and m the max of S·c less log2(448) from FP64's S within the FP8 wgmma's
    accumulation error."""
    from deltamatch.kernels.triton_quant import fragment_token_order

    ops = forward_operands(1000, 4, 2)
    v8t = ops["v8t"][..., fragment_token_order(ops["v8t"].shape[-1], "cuda")].contiguous()
    qk_scale = 128**-0.5 * math.log2(math.e)
    args = (ops["q8"], ops["k8"], v8t, ops["sq"], ops["sk"], ops["svc"], tuple(ops["q"].shape), causal, qk_scale)
    first = cuda_lib.fwd_wide(*args, promote=promote, variant=cuda_lib.FWD_WIDE_VARIANTS[0])
    row_max = torch.full_like(first[1], float("nan"))
    assert all(torch.equal(a, b) for a, b in zip(first, cuda_lib.fwd_wide(*args, promote=promote, row_max=row_max,
                                                                          variant=cuda_lib.FWD_WIDE_VARIANTS[0])))
    n = ops["q"].shape[1]
    q8, k8 = (x.view(torch.float8_e4m3fn).double() for x in (ops["q8"], ops["k8"]))
    k8 = k8.repeat_interleave(q8.shape[1] // k8.shape[1], 1)
    sk = ops["sk"].double().repeat_interleave(q8.shape[1] // ops["sk"].shape[1], 1).repeat_interleave(64, -1)
    scores = q8 @ k8.transpose(-1, -2) * (ops["sq"].double().repeat_interleave(128, -1)[..., :, None] * sk[..., None, :]
                                          * qk_scale)
    keys = torch.arange(scores.shape[-1], device=scores.device)
    visible = (keys[None, :] < n) & ((keys[None, :] <= keys[:, None]) if causal else True)
    want = torch.where(visible, scores, -torch.inf).amax(-1) - math.log2(448)
    # Hopper's FP8 wgmma sums at reduced precision (the δ test's 3e-3 of Σ|terms| at worst): a loose check, which a
    # missing log2(448), scale or row would still fail by far
    assert ((row_max - want).abs() <= 1e-2 * (want.abs() + 1)).all(), "m against FP64's"
    for variant in cuda_lib.FWD_WIDE_VARIANTS:
        own = cuda_lib.fwd_wide(*args, promote=promote, variant=variant)
        again = torch.full_like(row_max, float("nan"))
        with_max = cuda_lib.fwd_wide(*args, promote=promote, variant=variant, row_max=again)
        assert all(torch.equal(a, b) for a, b in zip(own, with_max)) and torch.equal(again, row_max), variant
        for _ in range(2):
            again = cuda_lib.fwd_wide(*args, promote=promote, variant=variant)
            assert all(torch.equal(a, b) for a, b in zip(own, again)), variant
        if variant not in cuda_lib.EXP_EMULATED:
            assert all(torch.equal(a, b) for a, b in zip(first, own)), variant
            continue
        # emulated exponentials (relative error 7.5e-5): lse2 = m + log2(l) within 2e-4, and O apart only where a
        # P · 448 near an E4M3 rounding boundary went the other way
        (o, lse), (o0, lse0) = own, first
        rows = lse0.isfinite()
        assert not torch.equal(o, o0), variant  # the variant took effect
        assert (lse[rows] - lse0[rows]).abs().max() <= 2e-4, variant
        apart = (o.float() - o0.float()).norm() / o0.float().norm()
        assert apart <= 5e-3, f"{variant}: |O − O_w4| / |O_w4| = {apart:.2e}"
    with pytest.raises(ValueError, match=r"variant 'ws4p'"):
        cuda_lib.fwd_wide(*args, variant="ws4p")


def test_factored_forward_refuses_what_it_is_not_built_for(forward_operands):
    ops = forward_operands(130, 2, 2)
    with pytest.raises(ValueError, match=r"out_shape \(2, 130, 3, 128\): expected \(B, N, H, D\) = \(2, 130, 2"):
        cuda_lib.fwd_factored(ops["q8"], ops["k8"], ops["v8t"], ops["sq"], ops["sk"], ops["svc"], (2, 130, 3, 128),
                              True, 0.1)
    with pytest.raises(ValueError, match=r"variant 'ws9'"):
        cuda_lib.fwd_factored(ops["q8"], ops["k8"], ops["v8t"], ops["sq"], ops["sk"], ops["svc"], (2, 130, 2, 128),
                              True, 0.1, variant="ws9")
    with pytest.raises(ValueError, match=r"svc: torch.float32 \(2, 2, 64\)"):
        cuda_lib.fwd_factored(ops["q8"], ops["k8"], ops["v8t"], ops["sq"], ops["sk"], ops["svc"][..., :64],
                              (2, 130, 2, 128), True, 0.1)


def test_fused_factored_dkdv_is_deterministic_and_on_torchs_stream(dk_operands):
    """Two runs give the same bits, the second from an lse2 written on a side stream after a sleep: a launch not
    ordered after that copy would read zeros."""
    ops = dk_operands(1024, True, 2, 2)
    first = cuda_factored_dkdv(ops, True)
    lse, late = ops["saved"]["lse2"], torch.zeros_like(ops["saved"]["lse2"])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        late.copy_(lse)
        again = cuda_factored_dkdv(dict(ops, saved=dict(ops["saved"], lse2=late)), True)
    side.synchronize()
    for a, b in zip(first, again):
        assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [True, False])
def test_factored_dv_against_reference_and_fp64(causal):
    """As test_triton_gpu.test_against_reference_and_fp64 for dV: the kernel within a quarter of the reference's own
    distance to FP64 from the reference simulation, and no further from FP64 than the reference (+15%)."""
    from deltamatch.kernels.reference import attention_exact, attention_reference

    q, k, v, do = attention_inputs(2, 1000, 4, 2, seed=3)
    ours = cuda_factored_dv(factored_dv_operands(q, k, v, do, causal), promote=True)

    def grad_v(fn, dtype=None):
        ins = [(t if dtype is None else t.to(dtype)).detach().clone().requires_grad_() for t in (q, k, v)]
        fn(*ins).backward(do.to(dtype or do.dtype))
        return ins[2].grad

    ref = grad_v(lambda a, b, c: attention_reference(a, b, c, causal, "matched_factored"))
    exact = grad_v(lambda a, b, c: attention_exact(a, b, c, causal), dtype=torch.float64)
    to_ref, to_exact, ref_to_exact = relative_error(ours, ref), relative_error(ours, exact), relative_error(ref, exact)
    msg = f"dv: kernel-ref {to_ref:.2e} kernel-fp64 {to_exact:.2e} ref-fp64 {ref_to_exact:.2e}"
    assert to_ref < 0.25 * ref_to_exact, msg
    assert to_exact < 1.15 * ref_to_exact + 1e-3, msg
    assert ref_to_exact < 0.12, msg


@pytest.mark.parametrize("variant", ["simple", "pipe5_rs", "tma4"])  # static or dynamic shared memory, TMA maps
def test_factored_dv_runs_on_torchs_current_stream(dv_operands, variant):
    ops = dv_operands(1024, True)
    expected = cuda_factored_dv(ops, True, variant)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    lse = ops["saved"]["lse2"]
    late = torch.zeros_like(lse)
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        late.copy_(lse)
        got = cuda_lib.dv_factored(ops["saved"]["q8"], ops["saved"]["k8"], ops["do8t_c"], ops["saved"]["sq"],
                                   ops["saved"]["sk"], ops["sdoc"], late, ops["n"], True, ops["qk_scale"],
                                   variant=variant)
    side.synchronize()
    assert torch.equal(got, expected)


def _quant_input(b, n, h, dtype, seed, d=128):
    """A (B, N, H, D) view with the strides of a packed projection (the middle third of 3H heads), an outlier
    channel, an offset channel (what K's centring removes) and an all-zero channel (scale 1)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((b, n, 3 * h, d), device="cuda", generator=gen)
    x[..., 5] *= 40
    x[..., 7] += 3
    x[..., 9] = 0
    return x.to(dtype)[:, :, h:2 * h]


# one token, a ragged scale block (130), ragged statistics blocks (1000), the 8K reference length; D = 128 and 64 (its
# kernels ..._d64: 32-row slabs of the thread layout)
@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("n", [1, 130, 1000, 8192])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_quantisation_gives_the_triton_passes_bits(n, dtype, d):
    """``cuda_lib.quantize_block_and_channel`` (kernels/cuda/quant_passes.cu) against the two Triton passes it replaces
    in matched_factored's default step, given its K mean: the block-scaled token-major codes and scales of
    ``quantize_operand`` and the per-channel channel-major codes and scales of ``quantize_per_channel``, bit for bit,
    in natural and fragment token order, 64- and 128-row blocks, centred or not, 128 to 1024 rows a statistics CTA; the
    mean within FP32 summation order of PyTorch's, and every output the same bits on a second run. Q's pass alone
    (``quantize_block``): ``quantize_operand``'s token-major codes and scales."""
    from deltamatch.kernels import triton_quant as tq

    bits = lambda t: t.view(torch.uint8) if t.dtype == E4M3 else t.view(torch.int32)  # noqa: E731
    x = _quant_input(2, n, 3, dtype, seed=n, d=d)
    q8, sq = cuda_lib.quantize_block(x)  # Q's pass: the token-major cast alone
    want = tq.quantize_operand(x, 128, layouts="token")
    assert torch.equal(bits(q8), bits(want[0])) and torch.equal(bits(sq), bits(want[2]))
    for rows, centre, stats_rows in ((64, True, 128), (64, True, 1024), (64, False, 256), (128, False, 512)):
        for fragment in (False, True):
            kw = dict(centre=centre, fragment_order=fragment, stats_rows=stats_rows)
            ours = cuda_lib.quantize_block_and_channel(x, rows, **kw)
            again = cuda_lib.quantize_block_and_channel(x, rows, **kw)
            mean = ours[4]
            x8, _, sx = tq.quantize_operand(x, rows, centre=centre, mean=mean, layouts="token")
            _, x8t, sxc = tq.quantize_per_channel(x, "x", mean=mean, layouts="channel", fragment_order=fragment)
            for i, want in enumerate((x8, sx, x8t, sxc)):
                assert torch.equal(bits(ours[i]), bits(want)), (rows, centre, fragment, i)
                assert torch.equal(bits(ours[i]), bits(again[i])), (rows, centre, fragment, i)
            if centre:
                assert torch.equal(bits(mean), bits(again[4]))
                assert torch.allclose(mean, x.mean(dim=1, dtype=torch.float32), rtol=1e-5, atol=1e-6)
            else:
                assert mean is None


@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("n", [1, 130, 1000, 8192])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_q_prime_gives_the_triton_passes_bits(n, dtype, d):
    """``cuda_lib.quantize_channel_scaled`` (Q'ᶜ: ``dm_quant_channel_scaled``) against the two Triton launches it
    replaces, ``quantize_per_channel(x, row_scales=s, layouts="channel")``: the channel-major codes and the channel
    scales bit for bit, in natural and fragment token order, 128 to 1024 rows a statistics CTA, with row scales over
    twelve binades and NaN in the padded rows (which must not reach a code or a scale), and the same bits again."""
    from deltamatch.kernels import triton_quant as tq

    bits = lambda t: t.view(torch.uint8) if t.dtype == E4M3 else t.view(torch.int32)  # noqa: E731
    x = _quant_input(2, n, 3, dtype, seed=n + 1, d=d)
    n_pad = tq.padded_len(n)
    gen = torch.Generator(device="cuda").manual_seed(n)
    rs = torch.exp2(torch.randint(-20, -8, (2, 3, n_pad), device="cuda", generator=gen).float())
    rs *= 1 + torch.rand((2, 3, n_pad), device="cuda", generator=gen)
    rs[..., n:] = float("nan")
    for fragment in (False, True):
        _, want_t, want_s = tq.quantize_per_channel(x, "q", row_scales=rs, layouts="channel", fragment_order=fragment)
        for stats_rows in (128, 1024):
            ours = cuda_lib.quantize_channel_scaled(x, rs, fragment_order=fragment, stats_rows=stats_rows)
            again = cuda_lib.quantize_channel_scaled(x, rs, fragment_order=fragment, stats_rows=stats_rows)
            for i, want in enumerate((want_t, want_s)):
                assert torch.equal(bits(ours[i]), bits(want)), (fragment, stats_rows, i)
                assert torch.equal(bits(ours[i]), bits(again[i])), (fragment, stats_rows, i)
    assert torch.isfinite(want_s).all() and (want_s > 0).all()


@pytest.mark.parametrize("n, causal, h, h_kv, d", [(129, True, 2, 2, 128), (1000, False, 4, 2, 128),
                                                   (8192, True, 2, 1, 128), (129, True, 2, 2, 64),
                                                   (1000, False, 4, 2, 64)])
def test_q_prime_switch_keeps_the_backward_bits(n, causal, h, h_kv, d, monkeypatch):
    """matched_factored's backward with Q'ᶜ from the CUDA passes (``DELTAMATCH_KERNEL_CUDA_QPRIME=1``: one call a step,
    with the δ pass's row scales) gives the bits of the step with Triton's (``0``): O, dQ, dK and dV, GQA and odd N,
    D = 128 and 64."""
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_QPRIME_SWITCH

    q, k, v, do = attention_inputs(1 if n == 8192 else 2, n, h, h_kv, seed=19, d=d)
    calls = []
    scaled = cuda_lib.quantize_channel_scaled
    monkeypatch.setattr(cuda_lib, "quantize_channel_scaled", lambda *a, **kw: calls.append(kw) or scaled(*a, **kw))
    monkeypatch.setenv(CUDA_QPRIME_SWITCH, "1")
    ours = _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored"), q, k, v, do)
    assert calls == [dict(fragment_order=True)]
    monkeypatch.setenv(CUDA_QPRIME_SWITCH, "0")
    triton_passes = _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored"), q, k, v, do)
    assert len(calls) == 1
    for name, a, b in zip("o dq dk dv".split(), ours, triton_passes):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("n, causal, h, h_kv, d", [(129, True, 2, 2, 128), (1000, False, 4, 2, 128),
                                                   (8192, True, 2, 1, 128), (129, True, 2, 2, 64),
                                                   (1000, False, 4, 2, 64), (8192, True, 2, 1, 64)])
def test_cuda_quantisation_in_the_step_against_reference_and_fp64(n, causal, h, h_kv, d, monkeypatch):
    """matched_factored with Q, K, V and dO quantised by the CUDA passes (``DELTAMATCH_KERNEL_CUDA_QUANT=1``: four
    calls a step) against the reference simulation and FP64, as the other CUDA kernels are held; ``0`` runs none.
    D = 128 and 64."""
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import CUDA_QUANT_SWITCH

    q, k, v, do = attention_inputs(1 if n == 8192 else 2, n, h, h_kv, seed=17, d=d)
    calls = []
    quantize = cuda_lib.quantize_block_and_channel
    monkeypatch.setattr(cuda_lib, "quantize_block_and_channel",
                        lambda *a, **kw: calls.append(kw) or quantize(*a, **kw))
    block = cuda_lib.quantize_block
    monkeypatch.setattr(cuda_lib, "quantize_block", lambda *a: calls.append("q") or block(*a))
    monkeypatch.setenv(CUDA_QUANT_SWITCH, "1")
    ours = _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored"), q, k, v, do)
    assert [c if c == "q" else c.get("centre", False) for c in calls] == ["q", True, False, False]  # Q, K, V, dO
    monkeypatch.setenv(CUDA_QUANT_SWITCH, "0")
    triton_passes = _fwd_bwd(lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored"), q, k, v, do)
    assert len(calls) == 4
    ref = _fwd_bwd(lambda a, b, c: attention_reference(a, b, c, causal, "matched_factored"), q, k, v, do)
    exact = _fwd_bwd(lambda a, b, c: attention_exact(a, b, c, causal), q, k, v, do, dtype=torch.float64)
    assert_near_reference(ours, ref, exact)
    assert_near_reference(triton_passes, ref, exact)
