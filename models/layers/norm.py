"""RMSNorm and the gated RMSNorm at the output of the linear-attention mixers.

Both normalise in FP32 and cast back, as fla's fused kernels do, so the CPU twin and the CUDA path (fla's Triton
kernels, :mod:`deltamatch.models.layers.fused`) see the same numbers up to accumulation order. Parameter names match fla's ``RMSNorm`` / ``FusedRMSNormGated`` (a single ``weight``), so
checkpoints move between the two.
"""

import torch
import torch.nn.functional as F
from torch import nn

from . import fused


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dimension, computed in FP32."""
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learnable gain per channel (the QK-norm gains the paper instruments are these)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused.fused_enabled(x):
            return fused.rms_norm(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


GATE_ACTIVATIONS = {"swish": F.silu, "sigmoid": torch.sigmoid}


class GatedRMSNorm(nn.Module):
    """``rmsnorm(x) * weight * act(gate)``: fla's ``FusedRMSNormGated`` (GDN: swish, KDA: sigmoid) in plain PyTorch."""

    def __init__(self, dim: int, eps: float = 1e-5, activation: str = "swish"):
        super().__init__()
        if activation not in GATE_ACTIVATIONS:
            raise ValueError(f"gate activation must be one of {list(GATE_ACTIVATIONS)}, got {activation!r}")
        self.eps, self.activation = eps, activation
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if fused.fused_enabled(x):
            return fused.rms_norm_gated(x, gate, self.weight, self.eps, self.activation)
        y = rms_norm(x.float(), self.weight, self.eps) * GATE_ACTIVATIONS[self.activation](gate.float())
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, activation={self.activation}"
