"""The E4M3 quantiser against torch.float8_e4m3fn, bit for bit, and the block-scale layout."""

import pytest
import torch

from deltamatch.kernels import quant


def _all_e4m3_values() -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return codes[torch.isfinite(codes)]


def test_fp32_rounding_equals_torch_cast_bit_for_bit():
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
    assert torch.equal(quant.round_e4m3(x).view(torch.int32), theirs.view(torch.int32))


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
