"""Model FLOPs per token and model-FLOPs utilisation (MFU) for the ``train`` records and the benchmark.

FLOPs per trained token (forward + backward) = 6 x the parameters of every matmul (all parameters but the token
embedding, whose lookup is no matmul; the LM head counts) + causal softmax attention, 6 x N x H x D per attention layer
(the PaLM count 12 x N x H x D, halved for the causal mask). The linear mixers' chunked recurrences are left out, so
the MFU is a lower bound of the work the GPU does (the same convention for every attention method).

MFU divides by the dense BF16 matmul rate of the device: ``DELTAMATCH_PEAK_TFLOPS`` when set, else the rate measured on
this project's H200 (8192^3 bf16 matmul through PyTorch, 769-798 TFLOP/s, see the device notes; 790 used), else none.
"""

from __future__ import annotations

import os

import torch

MEASURED_PEAK_TFLOPS = {"H200": 790.0}


def flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    """Model FLOPs per trained token of a ``HybridForCausalLM`` (also FSDP-sharded: parameter shapes are global) at
    sequence length ``seq_len`` (see the module docstring)."""
    matmul_params = sum(p.numel() for p in model.parameters()) - model.model.embed_tokens.weight.numel()
    attention = sum(6 * seq_len * attn.num_heads * attn.head_dim for _, attn in model.attention_layers()
                    if hasattr(attn, "num_heads"))
    return 6.0 * matmul_params + attention


def peak_tflops(device: torch.device) -> float | None:
    """Dense BF16 TFLOP/s to divide by, or None where unknown."""
    if os.environ.get("DELTAMATCH_PEAK_TFLOPS"):
        return float(os.environ["DELTAMATCH_PEAK_TFLOPS"])
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((rate for key, rate in MEASURED_PEAK_TFLOPS.items() if key in name), None)
