"""The backend decision for the linear mixers and the narrow fla backward, checked on the CPU with the device faked."""

import pytest
import torch
from packaging.version import Version

from deltamatch.models.layers import fla_hopper

pytest.importorskip("fla")


@pytest.fixture
def hopper_with_triton(monkeypatch):
    """Pretend to be an sm90 device under a given Triton version, without TileLang."""
    def fake(version: str):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        monkeypatch.setattr(fla_hopper, "_triton_version", lambda: Version(version))
        monkeypatch.setattr(fla_hopper.importlib.util, "find_spec",
                            lambda name, *a: None if name == "tilelang" else object())
        monkeypatch.delenv(fla_hopper.ENV_SWITCH, raising=False)
        fla_hopper.training_backend.cache_clear()  # decided once per process; each faked device decides afresh

    yield fake
    fla_hopper.training_backend.cache_clear()


CUDA = torch.device("cuda", 0)


def test_cpu_always_trains_the_twin():
    assert fla_hopper.training_backend(torch.device("cpu"), 128)[0] == "torch"


def test_hopper_with_affected_triton_trains_fla_only_for_verified_head_dims(hopper_with_triton):
    hopper_with_triton("3.6.0")
    backend, why = fla_hopper.training_backend(CUDA, 128)
    assert backend == "fla" and "#640" in why and "128" in why
    backend, why = fla_hopper.training_backend(CUDA, 64)
    assert backend == "torch" and "head dim 64" in why and "not among those verified" in why


def test_kda_and_fixed_triton_keep_flas_own_behaviour(hopper_with_triton):
    hopper_with_triton("3.6.0")
    assert fla_hopper.training_backend(CUDA, 64, mixer="kda")[0] == "fla"
    hopper_with_triton("3.7.1")
    assert fla_hopper.training_backend(CUDA, 64)[0] == "fla"


def test_switch_off_trains_the_twin(hopper_with_triton, monkeypatch):
    hopper_with_triton("3.6.0")
    monkeypatch.setenv(fla_hopper.ENV_SWITCH, "0")
    fla_hopper.training_backend.cache_clear()
    backend, why = fla_hopper.training_backend(CUDA, 128)
    assert backend == "torch" and fla_hopper.ENV_SWITCH in why


def _registered_backend():
    from fla.backends import _get_operation_registry

    fla_hopper.enable_verified_backward()
    registry = _get_operation_registry("common")
    return next(b for b in registry._backends.values() if b.backend_type == "deltamatch_verified_hopper")


def test_verifier_accepts_only_gated_calls_at_verified_head_dims():
    backend = _registered_backend()
    assert backend.priority > 5  # after fla's TileLang backend, which fixes the same kernel where it is installed

    def call(K, gated=True):
        q = k = torch.zeros(1, 64, 2, K)
        v = do = torch.zeros(1, 64, 2, 2 * K)
        h = dh = torch.zeros(1, 1, 2, K, 2 * K)
        g = torch.zeros(1, 64, 2) if gated else None
        return backend.verify("chunk_bwd_dqkwg", q=q, k=k, v=v, do=do, h=h, dh=dh, g=g, scale=1.0)

    assert call(128) == (True, None)
    assert call(64)[0] is False and "64" in call(64)[1]
    assert call(128, gated=False)[0] is False


def test_guard_is_lifted_only_inside_the_call():
    from fla.ops.common import chunk_o

    before = chunk_o.TRITON_ABOVE_3_7_1
    with fla_hopper._guard_lifted():
        assert chunk_o.TRITON_ABOVE_3_7_1 is True
    assert chunk_o.TRITON_ABOVE_3_7_1 == before
