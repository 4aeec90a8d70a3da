"""Multi-head latent attention (DeepSeek-V2) for the MLA hybrid variant.

Keys and values come from one low-rank latent: ``c = norm(kv_a(x))`` of rank ``kv_lora_rank``, expanded per head by
``kv_b`` into a no-position key part and the value; a small decoupled key part of ``rope_dim`` channels, shared by all
heads, carries RoPE. Queries are a full-rank projection, or low-rank (``q_lora_rank`` > 0). As in the GQA layers,
q and k then go through QK-RMSNorm over their whole head dim (gains instrumented like GQA's) before RoPE on their last
``rope_dim`` channels, and the core is the same :class:`~deltamatch.models.layers.attention.AttentionCore` (heads:
``H_kv = H``; q/k head dim = v head dim = ``head_dim``). The KV cache holds the expanded per-head k and v, not the
latent: simpler, and decoding speed is not what the paper measures.
"""

import torch
from torch import nn

from .attention import AttentionCore, apply_rope, rope_cos_sin
from .norm import RMSNorm


class MultiHeadLatentAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        kv_lora_rank: int,
        rope_dim: int,
        attn_method: str,
        attn_inference: str = "sdpa",
        q_lora_rank: int = 0,
        qk_norm: bool = True,
        rope_base: float = 10000.0,
        norm_eps: float = 1e-6,
        layer_idx: int = 0,
    ):
        super().__init__()
        if not 0 < rope_dim < head_dim or rope_dim % 2:
            raise ValueError(f"mla_rope_dim must be even and in (0, head_dim={head_dim}), got {rope_dim}")
        self.num_heads, self.head_dim, self.rope_dim = num_heads, head_dim, rope_dim
        self.nope_dim, self.kv_lora_rank = head_dim - rope_dim, kv_lora_rank
        self.rope_base, self.layer_idx = rope_base, layer_idx
        if q_lora_rank > 0:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=False)
            self.q_a_norm = RMSNorm(q_lora_rank, eps=norm_eps)
            self.q_b_proj = nn.Linear(q_lora_rank, num_heads * head_dim, bias=False)
        else:
            self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.kv_a_proj = nn.Linear(hidden_size, kv_lora_rank + rope_dim, bias=False)
        self.kv_a_norm = RMSNorm(kv_lora_rank, eps=norm_eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (self.nope_dim + head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, eps=norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps=norm_eps) if qk_norm else None
        self.core = AttentionCore(attn_method, attn_inference)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> "MultiHeadLatentAttention":
        return cls(
            config.hidden_size, config.num_attention_heads, config.head_dim, config.mla_kv_lora_rank,
            config.mla_rope_dim, config.attn_method, config.attn_inference, q_lora_rank=config.mla_q_lora_rank,
            qk_norm=config.qk_norm, rope_base=config.rope_base, norm_eps=config.rms_norm_eps, layer_idx=layer_idx,
        )

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, attention_mask=None, cache=None) -> torch.Tensor:
        B, N, _ = x.shape
        H, D = self.num_heads, self.head_dim
        q = self._queries(x).view(B, N, H, D)
        latent, k_rope = self.kv_a_proj(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_norm(latent)).view(B, N, H, self.nope_dim + D)
        k_nope, v = kv.split([self.nope_dim, D], dim=-1)
        k = torch.cat([k_nope, k_rope[:, :, None, :].expand(B, N, H, self.rope_dim)], dim=-1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope_cos_sin(position_ids, self.rope_dim, self.rope_base, q.dtype)
        q = torch.cat([q[..., : self.nope_dim], apply_rope(q[..., self.nope_dim :], cos, sin)], dim=-1)
        k = torch.cat([k[..., : self.nope_dim], apply_rope(k[..., self.nope_dim :], cos, sin)], dim=-1)
        if cache is not None:
            k, v = cache.update(k.transpose(1, 2), v.transpose(1, 2), self.layer_idx)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        o = self.core(q, k, v.contiguous(), attention_mask)
        return self.o_proj(o.reshape(B, N, H * D))
