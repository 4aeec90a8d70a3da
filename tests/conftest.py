"""Shared test fixtures: GPU marker handling and NaN-poisoned ``torch.empty`` so unwritten outputs fail."""

import contextlib
import json
import os

import pytest
import torch

from poison import poison_torch_empty
# `make test` runs two xdist workers with `--dist loadgroup`; which worker runs which test is tests/xdist_groups.py's
from xdist_groups import pytest_configure_node, pytest_unconfigure, pytest_xdist_make_scheduler  # noqa: F401 (hooks)
from xdist_groups import write_groups


def _has_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


# Every GPU test runs under its own limit (pytest-timeout, signal method: a stuck test fails by name and the rest of
# the GPU suite still runs); tests that compile and autotune fla's kernels on a fresh machine set a longer one.
GPU_TEST_TIMEOUT_S = 240


def pytest_collection_modifyitems(config, items):
    write_groups(config, items)
    if _has_sm90():
        if config.pluginmanager.hasplugin("timeout"):
            for item in items:
                if "gpu" in item.keywords and item.get_closest_marker("timeout") is None:
                    item.add_marker(pytest.mark.timeout(GPU_TEST_TIMEOUT_S))
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA Hopper (sm90) GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    """On a Hopper GPU the tests launch fla's kernels with the recorded configs training uses (fla_autotune.py)."""
    if _has_sm90():
        from deltamatch.models.layers.fla_hopper import fla_installed

        if fla_installed():
            from deltamatch.models.train.fla_autotune import apply_pins

            return apply_pins()
    return None


# DELTAMATCH_TEST_REPORT=FILE appends one JSON line per test phase as it ends (outcome, seconds, the failure's text):
# a device call that runs out of time still brings back why each finished test failed and how long it took.
REPORT_ENV = "DELTAMATCH_TEST_REPORT"


def pytest_runtest_logreport(report):
    path = os.environ.get(REPORT_ENV)
    if not path or os.environ.get("PYTEST_XDIST_WORKER") or (report.when != "call" and report.outcome == "passed"):
        return  # under xdist the controller writes what its workers report
    gateway = getattr(getattr(report, "node", None), "gateway", None)  # the xdist worker that ran it, if any
    record = dict(test=report.nodeid, when=report.when, outcome=report.outcome, seconds=round(report.duration, 2),
                  worker=gateway.id if gateway else None)
    if report.failed:
        record["failure"] = report.longreprtext[-4000:]
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


@pytest.fixture(autouse=True)
def narrow_fla_autotuning(request):
    """On Hopper, a GPU test autotunes fla's kernels over their 4-warp configs of at most 2 stages only (keys pinned
    for training keep their pinned config): the tests check numerics, which need a valid config, not the fastest, and
    compiling every config for every shape the suite uses took longer than its budget (fla_autotune.py)."""
    if "gpu" not in request.keywords or not _has_sm90():
        yield
        return
    from deltamatch.models.layers.fla_hopper import fla_installed
    from deltamatch.models.train.fla_autotune import PINNED_PACKAGES, narrow_autotuning

    with narrow_autotuning(*PINNED_PACKAGES, keep_choices=True) if fla_installed() else contextlib.nullcontext():
        yield


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    """Fill every float ``torch.empty``/``empty_like`` with NaN, so code that forgets to write an output fails a test."""
    poison_torch_empty(monkeypatch.setattr)
    yield
