"""Which recurrence trains a linear mixer on this device, and fla's gated backward on Hopper where it is proven right.

fla 0.6 refuses its gated chunk backward (``fla.ops.common.chunk_o.chunk_bwd_dqkwg``) on Hopper under Triton
>= 3.4, < 3.7.1 unless TileLang is installed: fla issue #640 reports wrong gradients there. The refusal is broader
than the report. #640's analysis ties the wrong ``dk`` to the ``BK = 64`` tiling of that kernel, and on Hopper fla tiles
K by ``min(next_pow2(K), 128)``, so the paper's 128-dim GDN heads run one ``BK = 128`` tile. A second report (#984:
``prepare_wy_repr_bwd`` at ``BT = 64`` with 4 warps, for which fla restricts the ungated delta rule to 2 warps on
Hopper but not the gated one) concerns the same backward.

So this module enables fla's backward narrowly: for the key head dims in :data:`VERIFIED_HEAD_DIMS` only, which
``tests/models/layers/test_fla_gpu.py`` checks on the H200 against the twin in FP64 (output, final state and the
gradient of every input: q, k, v, gate, beta, A_log, dt_bias, initial state; T = 63, 300 and 8192, B = 2, with and
without an initial state, for each warp count ``prepare_wy_repr_bwd`` may autotune to). Measured on 2026-12-01 at T = 8192 with
an initial state (2 warps, FP32 inputs): every relative error <= 3.8e-3 (benchmarks/results/h200_train_2026-12-01). Everywhere else fla's own behaviour
stands: Triton >= 3.7.1 or TileLang enables the backward by itself, and other head dims train with the pure-torch twin
(:func:`deltamatch.models.layers.gdn.chunk_gated_delta_rule`). The mechanism is fla's own backend registry
(``fla.backends.register``): a backend for the ``common`` operation whose verifier accepts only those calls, run after
fla's TileLang backend, that calls fla's Triton implementation with the version guard lifted for that call alone.
``DELTAMATCH_FLA_HOPPER_BWD=0`` turns it off (the twin then trains every gated mixer on such a GPU).

:func:`training_backend` is the one decision the layers and the trainer's log share: ``("fla" | "torch", why)``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os

import torch
from packaging.version import Version

VERIFIED_HEAD_DIMS = frozenset({128})
ENV_SWITCH = "DELTAMATCH_FLA_HOPPER_BWD"


# Optional imports (Triton, fla) sit in try blocks: a Hub copy of this file (models/hub_code.py) must load without them.
@functools.cache
def fla_installed() -> bool:
    """Whether flash-linear-attention can be imported (the Hub copy of the layers runs without it, on the twins)."""
    return importlib.util.find_spec("fla") is not None


@functools.cache
def _triton_version():
    try:
        import triton
    except ImportError:
        return None
    return Version(triton.__version__.split("+")[0])


def refuses_gated_backward(device: torch.device) -> bool:
    """Whether fla 0.6 itself refuses its gated chunk backward on ``device`` (Hopper, 3.4 <= Triton < 3.7.1, no
    TileLang)."""
    if _triton_version() is None:
        return False
    hopper = torch.cuda.get_device_capability(device)[0] == 9
    affected = Version("3.4.0") <= _triton_version() < Version("3.7.1")
    return hopper and affected and importlib.util.find_spec("tilelang") is None


@functools.cache
def training_backend(device: torch.device, head_k_dim: int, mixer: str = "gdn") -> tuple[str, str]:
    """``("fla", why)`` or ``("torch", why)``: the recurrence that trains a ``mixer`` ("gdn" or "kda") with key
    head dim ``head_k_dim`` on ``device``. Decided once per process (the layers ask on every forward), so
    ``DELTAMATCH_FLA_HOPPER_BWD`` is read at the first call."""
    if device.type != "cuda":
        return "torch", "not a CUDA device: the pure-torch twin"
    if not fla_installed():
        return "torch", "flash-linear-attention is not installed: the pure-torch twin"
    if mixer != "gdn" or not refuses_gated_backward(device):
        return "fla", "fla's Triton chunk kernels (fla trusts its backward on this GPU and Triton)"
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return "torch", f"fla refuses its gated backward here (fla #640) and {ENV_SWITCH}=0: the pure-torch twin"
    if head_k_dim not in VERIFIED_HEAD_DIMS:
        return "torch", (f"fla refuses its gated backward on Hopper with Triton {_triton_version()} (fla #640) and "
                         f"head dim {head_k_dim} is not among those verified here ({sorted(VERIFIED_HEAD_DIMS)}): "
                         "the pure-torch twin")
    enable_verified_backward()
    return "fla", (f"fla's Triton chunk kernels; its gated backward, refused by fla on Hopper with Triton "
                   f"{_triton_version()} (fla #640), is enabled for head dim {head_k_dim}, verified against FP64 by "
                   "tests/models/layers/test_fla_gpu.py")


@contextlib.contextmanager
def _guard_lifted():
    try:
        from fla.ops.common import chunk_o
    except ImportError as err:
        raise ImportError(f"fla's gated backward needs flash-linear-attention: {err}") from err

    saved = chunk_o.TRITON_ABOVE_3_7_1
    chunk_o.TRITON_ABOVE_3_7_1 = True
    try:
        yield
    finally:
        chunk_o.TRITON_ABOVE_3_7_1 = saved


@functools.cache
def enable_verified_backward() -> None:
    """Register the narrow backend with fla (once per process)."""
    try:
        from fla.backends import BaseBackend, register
        from fla.ops.common import chunk_o
    except ImportError as err:
        raise ImportError(f"fla's gated backward needs flash-linear-attention: {err}") from err

    triton_impl = inspect.unwrap(chunk_o.chunk_bwd_dqkwg)

    class VerifiedHopperBackward(BaseBackend):
        backend_type = "deltamatch_verified_hopper"
        priority = 6  # after fla's TileLang backend (5), which fixes the same kernel where TileLang is installed

        @staticmethod
        def chunk_bwd_dqkwg_verifier(*args, **kwargs) -> tuple[bool, str | None]:
            bound = inspect.signature(triton_impl).bind(*args, **kwargs)
            k, g = bound.arguments["k"], bound.arguments.get("g")
            if g is None or bound.arguments.get("g_gamma") is not None:
                return False, "not the per-token gated case that fla's guard is about"
            if k.shape[-1] not in VERIFIED_HEAD_DIMS:
                return False, f"head dim {k.shape[-1]} not verified on Hopper by deltamatch"
            return True, None

        @staticmethod
        def chunk_bwd_dqkwg(*args, **kwargs):
            with _guard_lifted():
                return triton_impl(*args, **kwargs)

    register("common")(VerifiedHopperBackward)
