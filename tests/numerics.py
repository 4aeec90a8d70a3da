"""The test suite's one relative-error helper: ‖x − ref‖ / ‖ref‖ in FP64 (``deltamatch.kernels.measures``'s, the measure
dm-sweep reports, so a test's tolerance and a reported error mean the same thing), and ``assert_close`` on top of it.

Import it as ``from numerics import assert_close, relative_error`` (tests/ is on the path through tests/conftest.py).
"""

from deltamatch.kernels.measures import relative_error

__all__ = ["assert_close", "relative_error"]


def assert_close(actual, expected, tol: float, what: str = "") -> float:
    """Assert ``relative_error(actual, expected) < tol`` (any devices, any float dtypes); returns the error."""
    error = relative_error(actual.detach(), expected.detach())
    assert error < tol, f"{what or 'value'}: relative error {error:.3g} is not below {tol:g}"
    return error
