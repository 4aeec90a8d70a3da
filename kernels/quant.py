"""E4M3 quantisation with FP32 block scales, as the numerics spec (kernels/README.md) writes it.

E4M3 (``float8_e4m3fn``) has 4 exponent bits (bias 7), 3 mantissa bits, no infinities, and a largest finite value of
448 = 1.75·2⁸. Normal numbers have exponents −6…8, so the spacing of representable values in the binade
[2ᵉ, 2ᵉ⁺¹) is 2ᵉ⁻³; below 2⁻⁶ the subnormals are spaced 2⁻⁹. A block quantiser stores ``code = rne(x / s)`` with one
FP32 scale ``s = amax / 448`` per block, so the block's largest entry lands on ±448 and nothing saturates.

Two roundings that agree bit for bit (a test checks every representable neighbourhood):

- ``round_e4m3``: clamp to ±448 and cast through ``torch.float8_e4m3fn`` (which itself maps overflow to NaN, hence the
  clamp). The reference uses it.
- ``round_e4m3_fp32``: the same rounding in plain FP32 arithmetic (frexp, a power-of-two step, round-half-even). It is
  what a kernel can do where the hardware cast is unavailable or wrong (Triton's interpreter).

``rounding_disabled()`` turns every rounding here into the identity; the reference uses it to show that, without
quantisation, every method computes exact attention.
"""

import contextlib
import threading
from collections.abc import Iterator

import torch

E4M3_MAX = 448.0
_STATE = threading.local()


def rounding_enabled() -> bool:
    return getattr(_STATE, "enabled", True)


@contextlib.contextmanager
def rounding_disabled() -> Iterator[None]:
    """Make every FP8/BF16 rounding of the reference the identity inside the block."""
    previous = rounding_enabled()
    _STATE.enabled = False
    try:
        yield
    finally:
        _STATE.enabled = previous


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round FP32 values to the E4M3 grid (nearest, ties to even, saturating at ±448); result in FP32."""
    if not rounding_enabled():
        return x
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype)


def round_e4m3_fp32(x: torch.Tensor) -> torch.Tensor:
    """``round_e4m3`` in FP32 arithmetic only: exact, since every step below is a power-of-two scaling."""
    a = x.abs().clamp(max=E4M3_MAX)
    _, exponent = torch.frexp(a)  # a = m · 2^exponent, m in [0.5, 1): the binade is 2^(exponent - 1)
    binade = (exponent - 1).clamp(min=-6)  # subnormals share the step of the lowest normal binade
    step = torch.ldexp(torch.ones_like(a), binade - 3)
    return torch.copysign(torch.round(a / step) * step, x)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to BF16 and back (the BF16 method's operand precision)."""
    if not rounding_enabled():
        return x
    return x.to(torch.bfloat16).to(x.dtype)


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round FP32 values to TF32 (10 mantissa bits, nearest, ties to even), as a TF32 tensor-core operand; FP32 out.
    Finite inputs only: the rounding adds to the bit pattern, which would carry a NaN's payload into the exponent."""
    if not rounding_enabled():
        return x
    if x.dtype != torch.float32:
        raise ValueError(f"round_tf32 takes float32, got {x.dtype}")
    bits = x.contiguous().view(torch.int32)
    tie = (bits >> 13) & 1  # the kept mantissa's last bit: ties go to the even one
    return ((bits + 0xFFF + tie) & ~0x1FFF).view(torch.float32)


def _scales_from_amax(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def quantize_tiles(x: torch.Tensor, rows: int | None, cols: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise the last two dims of ``x`` in ``rows × cols`` tiles (``None``: the whole dim).

    Returns ``(x̂, scales)``: the dequantised values (codes · scale, FP32, the shape of ``x``) and the FP32 scales, of
    shape ``(..., ceil(R/rows), ceil(C/cols))``. A partial last tile is padded with zeros, which never change a scale.
    """
    x = x.float()
    *lead, n_rows, n_cols = x.shape
    br, bc = rows or n_rows, cols or n_cols
    tr, tc = -(-n_rows // br), -(-n_cols // bc)
    padded = torch.nn.functional.pad(x, (0, tc * bc - n_cols, 0, tr * br - n_rows))
    tiles = padded.reshape(*lead, tr, br, tc, bc)
    scales = _scales_from_amax(tiles.abs().amax(dim=(-3, -1)))  # (..., tr, tc)
    if not rounding_enabled():
        return x, scales
    codes = round_e4m3(tiles / scales[..., :, None, :, None])
    deq = (codes * scales[..., :, None, :, None]).reshape(*lead, tr * br, tc * bc)
    return deq[..., :n_rows, :n_cols], scales


def quantize_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor quantisation (one scale for the whole tensor), as the cuDNN / TE FP8 baseline does."""
    x = x.float()
    scale = _scales_from_amax(x.abs().amax())
    if not rounding_enabled():
        return x, scale
    return round_e4m3(x / scale) * scale, scale


def quantize_fixed(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Quantise with a fixed scale (cuDNN quantises P in [0, 1] with scale 1/448)."""
    x = x.float()
    if not rounding_enabled():
        return x
    return round_e4m3(x / scale) * scale
