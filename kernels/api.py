"""``dm_attn_func``: the one public entry point to FP8 attention, whatever backend runs it."""

from deltamatch.kernels.backends import select_backend
from deltamatch.kernels.inputs import validate_attention_inputs


def dm_attn_func(q, k, v, causal: bool = True, mode: str = "matched", softmax_scale: float | None = None):
    """Scaled-dot-product attention under one of the paper's numerics.

    q: ``(B, N, H, D)``; k, v: ``(B, N, H_kv, D)`` with ``H % H_kv == 0``. ``mode``: ``bf16``, ``stale``,
    ``consistent``, ``matched`` (Delta-Matching) or ``cudnn_fp8``. Returns O ``(B, N, H, D)`` in q's dtype;
    differentiable. Runs the Triton Hopper kernels on sm90 CUDA tensors, cuDNN for ``cudnn_fp8`` on CUDA, and the
    PyTorch reference simulation elsewhere (once per reason it warns when CUDA inputs end up there).
    """
    validate_attention_inputs(q, k, v, mode, softmax_scale)
    backend = select_backend(q, k, v, causal, mode)
    return backend.apply(q, k, v, causal, mode, softmax_scale)
