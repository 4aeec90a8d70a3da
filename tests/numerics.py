"""The test suite's numerical oracles. The one relative-error helper: ‖x − ref‖ / ‖ref‖ in FP64 (``deltamatch.kernels.measures``'s, the measure
dm-sweep reports, so a test's tolerance and a reported error mean the same thing), and ``assert_close`` on top of it; and ``rne_e4m3_fp64``, E4M3 rounding built in FP64 from the code table, independent
of the quantiser it checks.

Import it as ``from numerics import assert_close, relative_error`` (tests/ is on the path through tests/conftest.py).
"""

import torch

from deltamatch.kernels.measures import relative_error

__all__ = ["assert_close", "assert_near_reference", "relative_error", "rne_e4m3_fp64"]


def assert_close(actual, expected, tol: float, what: str = "") -> float:
    """Assert ``relative_error(actual, expected) < tol`` (any devices, any float dtypes); returns the error."""
    error = relative_error(actual.detach(), expected.detach())
    assert error < tol, f"{what or 'value'}: relative error {error:.3g} is not below {tol:g}"
    return error


def assert_near_reference(ours, ref, exact, parts=("o", "dq", "dk", "dv")) -> list[float]:
    """The bar a kernel's outputs meet (``parts`` name them): each finite, within a quarter of the reference
    simulation's own distance to FP64 from the reference, and no further from FP64 than the reference (+15%, + 10⁻³).
    Returns the reference's distances to FP64, part by part."""
    distances = []
    for part, x, r, e in zip(parts, ours, ref, exact):
        assert torch.isfinite(x).all(), part
        to_ref, to_exact, ref_to_exact = relative_error(x, r), relative_error(x, e), relative_error(r, e)
        msg = f"{part}: kernel-ref {to_ref:.2e} kernel-fp64 {to_exact:.2e} ref-fp64 {ref_to_exact:.2e}"
        assert to_ref < 0.25 * ref_to_exact, msg
        assert to_exact < 1.15 * ref_to_exact + 1e-3, msg
        distances.append(ref_to_exact)
    return distances


def rne_e4m3_fp64(y: torch.Tensor) -> torch.Tensor:
    """The E4M3 value nearest to ``y`` clamped to ±448, ties to the even code, built in FP64 from the code table.

    Positive codes 0…126 are the finite non-negative E4M3 values in increasing order, so a tie between two
    neighbours goes to the one whose index is even (mantissa LSB 0).
    """
    grid = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    a = y.double().abs().clamp(max=448.0)
    hi = torch.searchsorted(grid, a.contiguous()).clamp(max=126)  # first grid value >= a
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    pick = torch.where((d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0)), lo, hi)
    return torch.copysign(grid[pick], y.double())
