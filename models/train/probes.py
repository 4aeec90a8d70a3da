"""The measurements behind the paper's Figures 1, 4, 5 and Table 9, taken while training.

- ``gain`` records: per attention layer, the QK-norm gain concentration (share of the largest channel in
  Σ_c (g_q,c g_k,c)²), its top channels and the largest |gain| of q and k.
- ``residual`` records: per attention layer and δ kind (stale, consistent, matched), the normalised row-sum residual
  of dS before and after its FP8 cast and the dK column-sum share, all measured on the *same* activations: the q, k,
  v and dO that the layer's attention core sees on a slice of the current batch
  (``deltamatch.models.instrument.capture_attention_io`` + ``deltamatch.kernels.measures.residual_summary``); for
  the stale and consistent δ also what their error does to a step (Figure 4, left and middle:
  ``deltamatch.models.instrument.delta_error_effects``): the shares of attention rows it sharpens and flattens, and
  its push on each QK channel with how consistently heads and sequences agree on that push.

Under FSDP every rank runs the forward/backward of the probe (the shards must be gathered by all ranks), and rank 0
alone runs the reference probe on its activations and writes the records. Parameter gradients are not touched.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from deltamatch.methods import DELTA_KINDS as DELTAS
from deltamatch.kernels.measures import residual_summary
from deltamatch.models.instrument import capture_attention_io, delta_error_effects, gain_concentration
from deltamatch.models.train.distributed import Layout, full_tensor


def gain_records(model: nn.Module) -> list[dict]:
    """One record per attention layer with QK-norm (gathers the gains from their shards: call on every rank)."""
    records = []
    for layer, attn in model.attention_layers():
        if getattr(attn, "q_norm", None) is None:
            continue
        q_gain = full_tensor(attn.q_norm.weight.detach())
        k_gain = full_tensor(attn.k_norm.weight.detach())
        share, top = gain_concentration(q_gain, k_gain)
        records.append({"layer": layer, "concentration": share, "top_channels": top,
                        "q_gain_max": float(q_gain.abs().max()), "k_gain_max": float(k_gain.abs().max())})
    return records


def residual_records(model: nn.Module, batch: torch.Tensor, layout: Layout, autocast) -> list[dict]:
    """One record per attention layer x δ kind, from a slice of ``batch`` (call on every rank; rank 0 returns them)."""
    with autocast():
        io = capture_attention_io(model, batch, batch)
    if not layout.is_main:
        return []
    records = []
    for layer, (q, k, v, do) in sorted(io.items()):
        summary = residual_summary(q, k, v, do, causal=True)
        effects = delta_error_effects(q, k, v, do)
        for delta in DELTAS:
            records.append({"layer": layer, "delta": delta, **{k: float(x) for k, x in summary[delta].items()},
                            **effects.get(delta, {})})
    return records


def autocast_for(device: torch.device, enabled: bool):
    """A factory of bf16 autocast contexts on CUDA; a null context on the CPU."""
    if device.type == "cuda" and enabled:
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext
