"""Which implementation trains each mixer of a model on this device, and why: one record per kind of layer.

The trainer prints these once (rank 0) and writes them to ``metrics.jsonl`` (kind ``backends``) and ``summary.json``,
so a run says whether its linear mixers ran fla's Triton kernels or the pure-torch twin, and whether its softmax
attention ran the Triton FP8 kernels, cuDNN, SDPA or the reference simulation.
"""

from __future__ import annotations

import torch
from torch import nn

from deltamatch.kernels.backends import select_backend
from deltamatch.models.layers.fla_hopper import training_backend


def _attention_backend(attn: nn.Module, method: str, device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    q = torch.zeros(1, 128, attn.num_heads, attn.head_dim, device=device, dtype=dtype)
    k = torch.zeros(1, 128, attn.num_kv_heads, attn.head_dim, device=device, dtype=dtype)
    backend = select_backend(q, k, k, True, method)
    return backend.name, f"dm_attn_func(mode={method!r}) on {device.type} {str(dtype).removeprefix('torch.')} inputs"


def training_backends(model: nn.Module, device: torch.device, autocast_dtype: torch.dtype | None) -> list[dict]:
    """``[{"mixer", "layers", "backend", "why"}]``, one entry per distinct (mixer, backend, why)."""
    method = model.config.attn_method
    entries: dict[tuple, list[int]] = {}
    for i, block in enumerate(model.model.layers):
        mixer, kind = block.mixer, model.config.layer_pattern[i]
        if hasattr(mixer, "head_k_dim"):  # GDN / KDA
            backend, why = training_backend(device, mixer.head_k_dim, getattr(mixer, "mixer_kind", kind))
        elif hasattr(mixer, "num_kv_heads"):  # GQA softmax attention
            backend, why = _attention_backend(mixer, method, device, autocast_dtype or torch.float32)
        else:
            backend, why = "torch", "plain PyTorch modules (fla kernels where the layer calls them)"
        entries.setdefault((kind, backend, why), []).append(i)
    return [{"mixer": kind, "layers": layers, "backend": backend, "why": why}
            for (kind, backend, why), layers in entries.items()]
