"""The E4M3 quantiser against torch.float8_e4m3fn, bit for bit, and the block-scale layout."""

import pytest
import torch

from deltamatch.kernels import quant
from numerics import rne_e4m3_fp64


def _all_e4m3_values() -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return codes[torch.isfinite(codes)]


def test_roundings_equal_torch_cast_and_an_fp64_oracle_bit_for_bit():
    grid = _all_e4m3_values().unique().sort().values  # every finite E4M3 value, both signs
    mids = (grid[1:] + grid[:-1]) / 2  # exact ties: round-half-even decides
    nudged = torch.cat([mids.nextafter(grid[1:]), mids.nextafter(grid[:-1])])
    gen = torch.Generator().manual_seed(0)
    random = torch.cat([torch.randn(20000, generator=gen) * 10 ** e for e in range(-4, 4)])
    beyond = torch.tensor([448.0, 449.0, 464.0, 465.0, 480.0, 1e6, -1e6, 2.0**-10, 2.0**-11, -(2.0**-12), 0.0, -0.0])
    x = torch.cat([grid, mids, nudged, random, beyond])
    ours = quant.round_e4m3_fp32(x)
    theirs = x.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))  # bits, so -0.0 and +0.0 differ
    assert torch.equal(quant.round_e4m3(x).view(torch.int32), rne_e4m3_fp64(x).float().view(torch.int32))


def _code_values(scale: float) -> torch.Tensor:
    """Values whose quotient by a power-of-two ``scale`` is every E4M3 value, every tie and its two neighbours."""
    grid = _all_e4m3_values().unique().sort().values
    mids = (grid[1:] + grid[:-1]) / 2
    y = torch.cat([grid, mids, mids.nextafter(grid[1:]), mids.nextafter(grid[:-1]),
                   torch.tensor([2.0**-10, 3 * 2.0**-10, 2.0**-11, -(2.0**-12), 2.0**-9 * 1.4])])  # subnormal range
    return y * scale


def test_tile_codes_equal_an_independent_nearest_even_rounding_bit_for_bit():
    pow2 = torch.tensor([2.0**-6, 1.0, 2.0**5])  # power-of-two scales: y = x / s is exact, so ties stay ties
    body = [torch.cat([torch.tensor([448.0 * s]), _code_values(s.item())]) for s in pow2]  # amax / 448 = s exactly
    # amax values whose scale fl(amax / 448) rounds down, so amax / scale lands above 448 and must saturate to 448
    amax = torch.linspace(300.0, 301.0, 4001)
    above = amax[amax / (amax / 448) > 448][:8]
    gen = torch.Generator().manual_seed(2)
    width = max(len(r) for r in body)
    x = torch.rand(len(body) + len(above), width, generator=gen) * 2 - 1
    for i, r in enumerate(body):
        x[i] = 0
        x[i, : len(r)] = r
    x[len(body):] *= above[:, None] * torch.tensor([-1.0, 1.0]).repeat(4)[:, None]
    x[len(body):, 7] = above
    deq, scales = quant.quantize_tiles(x, 1, None)
    s = scales[:, :1]
    assert torch.equal(s[: len(body), 0], pow2) and len(above) == 8
    assert (x[len(body):].abs().amax(1) / s[len(body):, 0] > 448).all()
    # every row, bit for bit: FP32 x / s (the spec's quotient) rounded by the FP64 oracle, times s in FP32
    expect = rne_e4m3_fp64(x / s).float() * s
    assert torch.equal(deq.view(torch.int32), expect.view(torch.int32))
    # and the codes themselves, which the power-of-two rows give back exactly
    codes, ref = deq[: len(body)] / s[: len(body)], rne_e4m3_fp64(x[: len(body)] / s[: len(body)]).float()
    assert torch.equal(codes.view(torch.int32), ref.view(torch.int32))
    assert (codes == 0).sum() > 3 and ((codes.abs() > 0) & (codes.abs() < 2.0**-6)).any()  # zeros and subnormals


def test_ties_round_to_even_and_saturate():
    # 17 lies halfway between 16 and 18 (spacing 2 in [16, 32)); 16 has the even mantissa.
    assert quant.round_e4m3_fp32(torch.tensor([17.0, 19.0, 500.0, -500.0])).tolist() == [16.0, 20.0, 448.0, -448.0]
    # subnormals: spacing 2^-9 below 2^-6
    assert quant.round_e4m3_fp32(torch.tensor([3 * 2.0**-10])).item() == 2 * 2.0**-9


@pytest.mark.parametrize("rows,cols", [(128, None), (64, None), (1, 64), (64, 1), (64, 64)])
def test_tile_scales_and_codes(rows, cols):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 150, 70, generator=gen) * 3  # ragged in both dims
    deq, scales = quant.quantize_tiles(x, rows, cols)
    br, bc = rows or 150, cols or 70
    assert scales.shape == (2, 3, -(-150 // br), -(-70 // bc))
    for ti in range(scales.shape[2]):
        for tj in range(scales.shape[3]):
            tile = x[:, :, ti * br : (ti + 1) * br, tj * bc : (tj + 1) * bc]
            expect = tile.abs().amax(dim=(-2, -1)) / 448
            torch.testing.assert_close(scales[:, :, ti, tj], expect, rtol=0, atol=0)
            codes = deq[:, :, ti * br : (ti + 1) * br, tj * bc : (tj + 1) * bc] / scales[:, :, ti, tj, None, None]
            # on the grid, up to the FP32 rounding of code · scale
            torch.testing.assert_close(codes, quant.round_e4m3(codes), rtol=1e-6, atol=1e-6)
            assert codes.abs().amax() <= 448 * (1 + 1e-6)
    assert 0 < (deq - x).abs().max() < 0.1 * x.abs().max()  # really quantised, not garbage


def test_zero_tile_has_unit_scale_and_stays_zero():
    x = torch.zeros(1, 1, 64, 16)
    deq, scales = quant.quantize_tiles(x, 64, None)
    assert scales.item() == 1.0 and torch.equal(deq, x)


def test_rounding_disabled_is_identity():
    x = torch.randn(4, 4, 64, 32)
    with quant.rounding_disabled():
        assert torch.equal(quant.quantize_tiles(x, 64, 64)[0], x)
        assert torch.equal(quant.round_bf16(x), x)
    assert not torch.equal(quant.quantize_tiles(x, 64, 64)[0], x)


def test_per_channel_codes_equal_the_reference_quantiser_bit_for_bit():
    """The PyTorch twin of the per-channel pass; the Triton pass is checked against it in the interpreter
    (test_triton_quant_interpreter.py)."""
    from deltamatch.kernels.triton_quant import quantize_per_channel_torch

    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 70, 3, 64, generator=gen) * 2).to(torch.bfloat16)
    x[:, :, :, 7] *= 50  # an outlier channel gets its own scale
    x8, x8t, scales = quantize_per_channel_torch(x, "v")
    inner = x.float().transpose(1, 2)
    expected, expected_scales = quant.quantize_tiles(inner, None, 1)
    assert x8.shape == (2, 3, 128, 64) and x8t.shape == (2, 3, 64, 128) and scales.shape == (2, 3, 64)
    assert torch.equal(scales, expected_scales[..., 0, :])
    assert torch.equal(x8[:, :, :70].float() * scales[:, :, None, :], expected)
    assert torch.equal(x8.float().transpose(-1, -2), x8t.float()) and (x8[:, :, 70:].float() == 0).all()
    with pytest.raises(ValueError, match="v"):
        quantize_per_channel_torch(x[0], "v")


def test_per_channel_codes_of_centred_and_row_scaled_operands():
    """K̂ᶜ (K less the token mean the K pass uses) and Q̂' (Q times dŜ's row scales) of the factored layout."""
    from deltamatch.kernels.triton_quant import padded_len, quantize_per_channel_torch

    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(1, 130, 2, 64, generator=gen) + 3).to(torch.bfloat16)
    mean = x.mean(dim=1, dtype=torch.float32)
    rows = torch.rand(1, 2, padded_len(130), generator=gen) + 0.5
    for kwargs, inner in (({"mean": mean}, x.float().transpose(1, 2) - mean[:, :, None]),
                          ({"row_scales": rows}, x.float().transpose(1, 2) * rows[:, :, :130, None])):
        x8, _, scales = quantize_per_channel_torch(x, "k", **kwargs)
        expected, expected_scales = quant.quantize_tiles(inner, None, 1)
        assert torch.equal(scales, expected_scales[..., 0, :])
        assert torch.equal(x8[:, :, :130].float() * scales[:, :, None, :], expected)
    with pytest.raises(ValueError, match="mean"):
        quantize_per_channel_torch(x, "k", mean=mean.double())
    with pytest.raises(ValueError, match="row_scales"):
        quantize_per_channel_torch(x, "q", row_scales=rows[:, :, :130])


def _rne_tf32_fp64(x: torch.Tensor) -> torch.Tensor:
    """FP32 values rounded to 11 significant bits (TF32: 10 stored) in FP64, nearest, ties to even: the oracle."""
    x64 = x.double()
    m, e = torch.frexp(x64)  # x = m · 2^e, |m| in [0.5, 1): 11 significant bits are m · 2^11 rounded
    return torch.ldexp(torch.round(torch.ldexp(m, torch.full_like(e, 11))), e - 11)


def test_tf32_rounding_equals_an_fp64_oracle_bit_for_bit():
    """``round_tf32`` (a tensor-core operand of TF32: the forward-PV δ's P) against rounding to 11 significant bits in
    FP64: every tie goes to the even neighbour, its two neighbours to the nearer value, at every scale and sign."""
    ones = torch.tensor([1.0, 1.5, 0.75, 2.0**-20, 3.0e5])
    step = torch.ldexp(ones, torch.frexp(ones)[1] - 11)  # the spacing of TF32 at each: 2^(e - 11)
    ties = torch.cat([ones + step / 2, ones + 1.5 * step])  # one rounds down to even, one up to even
    nudged = torch.cat([ties.nextafter(ties + 1), ties.nextafter(ties - 1)])
    gen = torch.Generator().manual_seed(0)
    random = torch.cat([torch.randn(20000, generator=gen) * 10 ** e for e in range(-6, 6)])
    x = torch.cat([ones, ties, nudged, -ties, random, torch.tensor([0.0, -0.0, 1.0 - 2.0**-24])])
    ours = quant.round_tf32(x)
    assert torch.equal(ours.view(torch.int32), _rne_tf32_fp64(x).float().view(torch.int32))
    assert torch.equal(ours.view(torch.int32) & 0x1FFF, torch.zeros_like(ours, dtype=torch.int32))
    assert torch.equal(quant.round_tf32(torch.tensor([1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11])),
                       torch.tensor([1.0, 1.0 + 2.0**-9]))  # the two ties, to the even neighbour each
    with quant.rounding_disabled():
        assert torch.equal(quant.round_tf32(x), x)
    with pytest.raises(ValueError, match="round_tf32 takes float32, got torch.float64"):
        quant.round_tf32(x.double())
