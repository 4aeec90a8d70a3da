"""The residual measures on hand-computed cases, and the errors for inputs on which they are undefined."""

import pytest
import torch

from deltamatch.kernels.measures import dk_colsum_share, relative_error, rowsum_residual


def test_dk_colsum_share_by_hand():
    dk = torch.zeros(1, 3, 1, 4)  # (B, N, H, D): shares per channel over the 3 tokens
    dk[0, :, 0, 0] = torch.tensor([1.0, 1.0, -1.0])  # |1| / 3
    dk[0, :, 0, 1] = torch.tensor([2.0, 0.0, 0.0])  # 1
    dk[0, :, 0, 2] = torch.tensor([1.0, -1.0, 0.0])  # 0; channel 3 is all zero and skipped, not 0/0
    assert dk_colsum_share(dk) == pytest.approx(1 / 3)


def test_dk_colsum_share_of_zero_dk_names_the_problem():
    with pytest.raises(ValueError, match="dk_colsum_share: dK is zero"):
        dk_colsum_share(torch.zeros(2, 5, 3, 4))


def test_relative_error_by_hand():
    ref = torch.tensor([3.0, 4.0])
    assert relative_error(torch.tensor([3.0, 5.0]), ref) == pytest.approx(1 / 5)


def test_relative_error_against_a_zero_reference_names_the_problem():
    with pytest.raises(ValueError, match="relative_error: the reference is zero"):
        relative_error(torch.ones(3), torch.zeros(3))
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(torch.ones(3), torch.ones(4))


def test_rowsum_residual_by_hand():
    ds = torch.tensor([[1.0, -1.0, 0.5], [0.0, 0.0, 0.0], [2.0, 2.0, 0.0]])  # rows: 0.5 / 2.5, skipped, 1
    assert rowsum_residual(ds) == pytest.approx(0.2)  # median of (0.2, 1) picks the lower one
    with pytest.raises(ValueError, match="every row of dS is zero"):
        rowsum_residual(torch.zeros(2, 3))
