"""Shared test fixtures: GPU marker handling and NaN-poisoned ``torch.empty`` so unwritten outputs fail."""

import pytest
import torch

from poison import poison_torch_empty


def _has_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def pytest_collection_modifyitems(config, items):
    if _has_sm90():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA Hopper (sm90) GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    """Fill every float ``torch.empty``/``empty_like`` with NaN, so code that forgets to write an output fails a test."""
    poison_torch_empty(monkeypatch.setattr)
    yield
