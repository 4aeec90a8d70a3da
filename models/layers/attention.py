"""Grouped-query softmax attention with QK-RMSNorm gains, RoPE or NoPE, and a swappable core.

q, k, v are projected to ``(B, N, H, D)`` / ``(B, N, H_kv, D)`` with the head dim D independent of the hidden size;
q and k each go through an RMSNorm over D whose learnable gains (shared by all heads, as in OLMo-2/Qwen3) are what the
paper's gain-concentration figure measures; RoPE rotates them unless the config asks for NoPE. The attention core
(:class:`AttentionCore`) is a module of its own so that instrumentation can hook its inputs and output gradient.

Which core runs (one rule, in :meth:`AttentionCore.forward`):

- the paper's method, ``deltamatch.kernels.dm_attn_func(q, k, v, causal=True, mode=attn_method)``, whenever the
  whole causal square is computed at once (no cached keys, no padding) and the module is in training mode, or
  gradients are on (probes), or ``attn_inference == "method"``. Training mode alone suffices so that activation
  checkpointing, whose first forward may run without grad, recomputes exactly what it ran;
- otherwise exact attention through ``torch.nn.functional.scaled_dot_product_attention`` (decoding with a KV cache,
  padded batches, and by default every eval-mode no-grad forward: evaluation and generation), so cached and uncached
  generation see the same numbers.

Without deltamatch installed (the copy of this file in a Hub repo) the method core is exact attention for ``bf16`` and
for models not in training mode; training an FP8 method there raises ``ImportError``.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .norm import RMSNorm


def rope_cos_sin(position_ids: torch.Tensor, dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables ``(B, N, 1, dim)`` for the rotate-half convention, from integer positions ``(B, N)``."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float32) / dim)
    angles = position_ids.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, :, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + D/2) of ``x (B, N, H, D)`` by the position angles."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, scale: float | None
) -> torch.Tensor:
    """Exact causal attention in the public layout; queries are the last N_q of N_k positions (bottom-right causal).

    ``key_mask (B, N_k)`` marks real tokens (1) and padding (0). Rows whose keys are all padding come out as zeros.
    """
    n_q, n_k = q.shape[1], k.shape[1]
    q_pos = torch.arange(n_k - n_q, n_k, device=q.device)
    mask = q_pos[:, None] >= torch.arange(n_k, device=q.device)[None, :]  # (N_q, N_k)
    mask = mask[None, None]
    if key_mask is not None:
        mask = mask & key_mask[:, None, None, -n_k:].bool()
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale,
        enable_gqa=q.shape[2] != k.shape[2],
    )
    if key_mask is not None:
        o = o.nan_to_num(0.0)  # fully masked rows (left padding) are irrelevant; keep them finite
    return o.transpose(1, 2)


def _method_attention(attn_method: str, training: bool):
    """``deltamatch.kernels.dm_attn_func``; ``None`` where deltamatch is not installed (this file's Hub copy) and exact
    attention stands in: BF16 (exact attention in the model's own dtype, so on the CPU in FP32 rather than the
    kernels' BF16-operand rounding), or a model that is not training. Training an FP8 method without the
    kernels is refused rather than silently run in another precision."""
    try:  # in a try block: transformers then does not require deltamatch for the Hub copy
        from deltamatch.kernels import dm_attn_func
    except ImportError as err:
        if training and attn_method != "bf16":
            raise ImportError(f"training with attn_method={attn_method!r} needs the deltamatch FP8 attention kernels "
                              f"(pip install deltamatch): {err}") from err
        return None
    return dm_attn_func


class AttentionCore(nn.Module):
    """softmax(q k^T * scale) v, causal, in the public layout ``(B, N, H, D)``; the module docstring gives the rule."""

    def __init__(self, attn_method: str, attn_inference: str = "sdpa", softmax_scale: float | None = None):
        super().__init__()
        self.attn_method, self.attn_inference, self.softmax_scale = attn_method, attn_inference, softmax_scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None = None):
        padded = key_mask is not None and not bool(key_mask[:, -k.shape[1]:].all())
        square = q.shape[1] == k.shape[1] and not padded
        if square and (self.training or torch.is_grad_enabled() or self.attn_inference == "method"):
            dm_attn_func = _method_attention(self.attn_method, self.training)
            if dm_attn_func is not None:
                return dm_attn_func(q, k, v, causal=True, mode=self.attn_method, softmax_scale=self.softmax_scale)
        if padded and (self.training or torch.is_grad_enabled()):
            raise ValueError(
                "attention_mask with padding is not supported while training: the FP8 attention cores take no mask"
            )
        return sdpa_attention(q, k, v, key_mask, self.softmax_scale)

    def extra_repr(self) -> str:
        return f"attn_method={self.attn_method!r}, attn_inference={self.attn_inference!r}"


class GQAttention(nn.Module):
    """Grouped-query attention; ``forward(x, position_ids, attention_mask, cache)`` returns ``(B, N, hidden)``."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        attn_method: str,
        attn_inference: str = "sdpa",
        qk_norm: bool = True,
        rope: bool = True,
        rope_base: float = 10000.0,
        norm_eps: float = 1e-6,
        layer_idx: int = 0,
    ):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"attention num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope, self.rope_base, self.layer_idx = rope, rope_base, layer_idx
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, eps=norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps=norm_eps) if qk_norm else None
        self.core = AttentionCore(attn_method, attn_inference)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache=None):
        B, N, _ = x.shape
        q = self.q_proj(x).view(B, N, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, N, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, N, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            cos, sin = rope_cos_sin(position_ids, self.head_dim, self.rope_base, q.dtype)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            # transformers' caches hold (B, H, N, D)
            k, v = cache.update(k.transpose(1, 2), v.transpose(1, 2), self.layer_idx)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        o = self.core(q, k, v, attention_mask)
        return self.o_proj(o.reshape(B, N, self.num_heads * self.head_dim))
