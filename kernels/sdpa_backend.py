"""The BF16 baseline on CUDA: PyTorch's fused scaled-dot-product attention (cuDNN / FlashAttention kernels).

The reference's ``bf16`` method materialises N×N scores; on a GPU the paper's BF16/FP32 reference is a fused kernel with
BF16 operands and FP32 accumulation, which is what SDPA runs for BF16 inputs.
"""

import torch
import torch.nn.functional as F

from deltamatch.methods import implemented_by


class SDPABackend:
    name = "sdpa"

    def supports(self, q, k, v, causal, mode) -> str | None:
        if mode not in implemented_by("sdpa"):
            return f"SDPA runs only the methods {implemented_by('sdpa')}, not {mode!r}"
        if not q.is_cuda:
            return "inputs are not CUDA tensors (the CPU runs the reference's BF16 numerics)"
        return None

    def apply(self, q, k, v, causal, mode, softmax_scale):
        dtype = q.dtype
        q, k, v = (t.transpose(1, 2).to(torch.bfloat16) for t in (q, k, v))
        o = F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        return o.transpose(1, 2).to(dtype)
