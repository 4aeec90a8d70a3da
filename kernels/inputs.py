"""Validation of attention inputs, shared by every backend so a bad call fails the same way everywhere."""

import math

import torch

from deltamatch.methods import METHODS, public_methods

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_HEAD_DIM = 256


def validate_attention_inputs(q, k, v, mode: str, softmax_scale=None) -> None:
    """Raise ``ValueError`` naming the problem for anything but ``q (B,N,H,D)``, ``k, v (B,N,H_kv,D)``, H % H_kv == 0."""
    if mode not in METHODS:  # the registry's names (the public ones, and internal twins such as cudnn_fp8_sim)
        raise ValueError(f"unknown attention mode {mode!r}; choose one of {list(public_methods())}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4 (B, N, H, D), got shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; expected one of {[str(d) for d in FLOAT_DTYPES]}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    (b, n, h, d), (bk, nk, hk, dk) = q.shape, k.shape
    if (b, n, d) != (bk, nk, dk):
        raise ValueError(
            f"q {tuple(q.shape)} and k/v {tuple(k.shape)} must agree in batch, sequence length and head dim"
        )
    if n == 0 or b == 0:
        raise ValueError(f"empty attention input: shape {tuple(q.shape)}")
    if h % hk != 0:
        raise ValueError(f"query heads H={h} must be a multiple of key/value heads H_kv={hk} (GQA)")
    if d % 16 != 0 or d > MAX_HEAD_DIM:
        raise ValueError(f"unsupported head dim {d}: must be a multiple of 16 and at most {MAX_HEAD_DIM}")
    if softmax_scale is not None and (
        isinstance(softmax_scale, bool)  # True would pass as the number 1
        or not isinstance(softmax_scale, (int, float))
        or not (math.isfinite(softmax_scale) and softmax_scale > 0)
    ):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
