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
"""

import pytest
import torch

from deltamatch.kernels import cuda_lib

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
