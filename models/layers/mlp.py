"""SwiGLU feed-forward block: ``down(silu(gate(x)) * up(x))``, no biases (fla's ``GatedMLP`` parameter names)."""

import torch
import torch.nn.functional as F
from torch import nn

from . import fused


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if fused.fused_enabled(x):
            return self.down_proj(fused.swiglu(gate, up))
        return self.down_proj(F.silu(gate) * up)
