"""CUDA fast paths for the model's elementwise parts, with the plain PyTorch code as their twin.

On a CUDA tensor, when flash-linear-attention is installed, the model runs fla's Triton kernels for

- RMSNorm (one kernel forward, one backward, instead of six elementwise passes over FP32 activations);
- the gated RMSNorm at the output of the linear mixers (fla's ``FusedRMSNormGated`` math);
- SwiGLU's ``silu(gate) * up``;
- the LM head and cross-entropy together (``FusedLinearCrossEntropyLoss``): the logits are made and consumed chunk by
  chunk, so an 8K-token micro-batch never holds its 8192 x 32000 FP32 logits (1 GiB) and their gradient.

Each computes what its twin computes (FP32 statistics, output in the input's dtype) up to accumulation order; the GPU
tests compare both on the same inputs. The CPU path is always the twin. ``use_fused(False)`` pins the twin on CUDA too
(and ``use_fused(True)`` asks for the fast path, failing where fla is missing); ``None`` restores the automatic choice.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from .fla_hopper import fla_installed

_PINNED = threading.local()


def fused_enabled(x: torch.Tensor) -> bool:
    """Whether the fast path runs for inputs like ``x``: the pinned choice, else CUDA with fla installed."""
    pinned = getattr(_PINNED, "on", None)
    if pinned is not None:
        return pinned and x.is_cuda
    return x.is_cuda and fla_installed()


@contextlib.contextmanager
def use_fused(on: bool | None) -> Iterator[None]:
    """Pin the fast path on or off inside the block; ``None`` restores the automatic choice."""
    previous = getattr(_PINNED, "on", None)
    _PINNED.on = on
    try:
        yield
    finally:
        _PINNED.on = previous


# fla's imports sit in try blocks: a Hub copy of this file (models/hub_code.py) must load without fla installed.
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    try:
        from fla.modules.layernorm import rms_norm as fla_rms_norm
    except ImportError as err:
        raise ImportError(f"the fused RMSNorm needs flash-linear-attention: {err}") from err
    return fla_rms_norm(x, weight, None, eps=eps)


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   activation: str) -> torch.Tensor:
    try:
        from fla.modules.fused_norm_gate import rms_norm_gated as fla_rms_norm_gated
    except ImportError as err:
        raise ImportError(f"the fused gated RMSNorm needs flash-linear-attention: {err}") from err
    return fla_rms_norm_gated(x, gate, weight, None, activation=activation, eps=eps)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    try:
        from fla.modules.activations import swiglu as fla_swiglu
    except ImportError as err:
        raise ImportError(f"the fused SwiGLU needs flash-linear-attention: {err}") from err
    return fla_swiglu(gate, up)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``labels`` without materialising the logits. Under autocast
    both operands are cast to its dtype first, as ``nn.Linear`` would be."""
    try:
        from fla.modules.fused_linear_cross_entropy.ops import fused_linear_cross_entropy_loss
    except ImportError as err:
        raise ImportError(f"the fused linear cross-entropy needs flash-linear-attention: {err}") from err

    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    # fla accumulates the LM head's gradient in FP32 matmuls (inside this forward): on the tensor cores as TF32, not
    # as SIMT FP32 (profiled on the H200 at 8K tokens: 14.6 ms of a 146 ms step)
    with _tf32_matmuls():
        return fused_linear_cross_entropy_loss(hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1), weight,
                                               ignore_index=ignore_index)


@contextlib.contextmanager
def _tf32_matmuls() -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
