"""Optimisers: AdamW, or Muon for the hidden 2-D matrices with AdamW for everything else.

Muon (``torch.optim.Muon``) orthogonalises each matrix update with a Newton-Schulz iteration, which only makes sense
for a weight that maps one hidden space into another. So Muon takes the 2-D weights inside the blocks
(``model.model.layers``), and AdamW keeps:

- the token embeddings and the LM head (lookup tables and a classifier, not hidden-to-hidden maps);
- norm gains, biases and every other 1-D parameter;
- convolution kernels (3-D);
- the gate parameters of the linear mixers: ``A_log``, ``dt_bias``, ``D``, and the per-head decay/step projections
  ``a_proj`` / ``b_proj`` / ``f_proj``. Those projections have as many rows as heads (2 x hidden), so an orthogonalised
  update would set every gate's change to the same unit spectral norm regardless of its gradient.

One exception: Mamba-2 computes its per-head step ``dt`` from rows of the shared ``in_proj`` (as transformers'
``Mamba2Mixer`` does), so those rows go to Muon with the rest of that matrix; its ``A_log``, ``dt_bias`` and ``D`` stay
with AdamW.

Weight decay applies to matrices only (2-D and up, gates excluded). Each group remembers its peak ``initial_lr``; the
loop multiplies it by the schedule every step.
"""

from __future__ import annotations

import torch
from torch import nn

from deltamatch.models.train.config import OptimSection

GATE_PARAMS = ("A_log", "dt_bias", "D")
GATE_MODULES = ("a_proj", "b_proj", "f_proj")


def is_gate(name: str) -> bool:
    """Whether parameter ``name`` belongs to a linear mixer's decay/step gate."""
    parts = name.split(".")
    return parts[-1] in GATE_PARAMS or any(p in GATE_MODULES for p in parts[:-1])


def split_parameters(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Trainable parameters by group: ``muon`` (hidden 2-D), ``decay`` (other matrices), ``no_decay`` (the rest)."""
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {"muon": [], "decay": [], "no_decay": []}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        in_blocks = ".layers." in f".{name}"
        if is_gate(name) or param.ndim < 2:
            groups["no_decay"].append((name, param))
        elif param.ndim == 2 and in_blocks:
            groups["muon"].append((name, param))
        else:
            groups["decay"].append((name, param))
    return groups


def build_optimizers(model: nn.Module, config: OptimSection) -> list[torch.optim.Optimizer]:
    """``[AdamW]`` or ``[Muon, AdamW]`` per ``config.name``, with the parameter split above."""
    groups = split_parameters(model)
    if config.name == "adamw":
        groups["decay"] = groups["muon"] + groups["decay"]
        groups["muon"] = []
    adamw_groups = [
        {"params": [p for _, p in groups["decay"]], "weight_decay": config.weight_decay, "initial_lr": config.lr},
        {"params": [p for _, p in groups["no_decay"]], "weight_decay": 0.0, "initial_lr": config.lr},
    ]
    optimizers: list[torch.optim.Optimizer] = []
    if groups["muon"]:
        optimizers.append(torch.optim.Muon(
            [{"params": [p for _, p in groups["muon"]], "initial_lr": config.muon_lr}],
            lr=config.muon_lr, weight_decay=config.weight_decay, momentum=config.muon_momentum,
        ))
    on_cuda = all(p.is_cuda for g in adamw_groups for p in g["params"])
    optimizers.append(torch.optim.AdamW(  # fused: one kernel per step on GPUs; the CPU keeps the default loop
        [g for g in adamw_groups if g["params"]], lr=config.lr, betas=config.betas, eps=config.eps,
        fused=True if on_cuda else None,
    ))
    return optimizers


def set_lr(optimizers: list[torch.optim.Optimizer], multiplier: float) -> None:
    """Set every group's rate to its peak times ``multiplier``."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * multiplier
