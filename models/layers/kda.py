"""Kimi Delta Attention (Kimi Linear, 2025): Gated DeltaNet with a decay per key channel instead of per head.

``S_t = Diag(exp(g_t)) S_{t-1} + beta_t k_t (v_t - (Diag(exp(g_t)) S_{t-1})^T k_t)^T`` with
``g = -exp(A_log) * softplus(f_proj(x) + dt_bias)`` of shape ``(B, T, H, K)``; ``f_proj`` and the output gate
``g_proj`` are low-rank (hidden -> head_v_dim -> ...), and the output norm gates with a sigmoid. Parameter names and
shapes are those of ``fla.layers.KimiDeltaAttention``. The recurrence runs in fla's Triton kernels on CUDA and in fla's
``naive_recurrent_kda`` (the oracle, a loop over tokens) elsewhere; short convolutions, padding and the cache are the
shared :class:`~deltamatch.models.layers.gdn.DeltaRuleMixer` code.
"""

import math

import torch
from torch import nn

from .gdn import DeltaRuleMixer, copy_into, l2_normalize
from .norm import GatedRMSNorm


def kda_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Per-channel log decay ``-exp(A_log)_h * softplus(f + dt_bias)`` for ``f (B, T, H, K)``, in FP32."""
    H = f.shape[-2]
    return -A_log.float().exp().view(H, 1) * torch.nn.functional.softplus(f.float() + dt_bias.float().view(H, -1))


class KimiDeltaAttention(DeltaRuleMixer):
    mixer_kind = "kda"

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        expand_v: float = 1.0,
        conv_size: int = 4,
        norm_eps: float = 1e-5,
        layer_idx: int = 0,
    ):
        super().__init__()
        self._init_qkv(hidden_size, num_heads, head_dim, expand_v, conv_size, layer_idx)
        self.f_proj = nn.Sequential(
            nn.Linear(hidden_size, self.head_v_dim, bias=False), nn.Linear(self.head_v_dim, self.key_dim, bias=False)
        )
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(num_heads))
        self.dt_bias = nn.Parameter(torch.zeros(self.key_dim))
        self.g_proj = nn.Sequential(
            nn.Linear(hidden_size, self.head_v_dim, bias=False), nn.Linear(self.head_v_dim, self.value_dim, bias=True)
        )
        self.o_norm = GatedRMSNorm(self.head_v_dim, eps=norm_eps, activation="sigmoid")
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.A_log._no_weight_decay = self.dt_bias._no_weight_decay = True
        if not self.A_log.is_meta:
            self.reset_mixer_parameters()

    @classmethod
    def from_config(cls, config, layer_idx: int) -> "KimiDeltaAttention":
        """KDA in place of GDN with the same heads and dims (``gdn_*`` keys), so the variant matches GDN's size."""
        return cls(
            config.hidden_size, config.gdn_num_heads, config.gdn_head_dim, expand_v=config.gdn_expand_v,
            conv_size=config.conv_size, layer_idx=layer_idx,
        )

    def reset_mixer_parameters(self, copy_=copy_into) -> None:
        """fla's initialisation: A ~ U(1, 16); dt = exp(U(log 1e-3, log 0.1)) >= 1e-4 per channel, softplus^-1(dt)."""
        A = torch.rand(self.num_heads) * 15 + 1
        dt = torch.exp(torch.rand(self.key_dim) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
        copy_(self.A_log, A.log())
        copy_(self.dt_bias, dt + torch.log(-torch.expm1(-dt)))

    def _output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return self.g_proj(x)

    def _rule(self, x, q, k, v, state, output_final_state: bool):
        f = self.f_proj(x).reshape(*x.shape[:2], self.num_heads, self.head_k_dim)
        b = self.b_proj(x)
        if self._backend(x) == "fla":
            try:  # optional at import time (a Hub copy of this file is checked by transformers)
                from fla.ops.kda import chunk_kda, fused_recurrent_kda
            except ImportError as err:
                raise ImportError(f"the fla KDA backend needs flash-linear-attention: {err}") from err

            decoding = not torch.is_grad_enabled() and q.shape[1] <= 64
            kernel = fused_recurrent_kda if decoding else chunk_kda
            return kernel(
                q=q, k=k, v=v, g=f, beta=b, A_log=self.A_log, dt_bias=self.dt_bias, initial_state=state,
                output_final_state=output_final_state, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                use_beta_sigmoid_in_kernel=True,
            )
        try:
            from fla.ops.kda.naive import naive_recurrent_kda
        except ImportError as err:
            raise ImportError(f"KDA layers need flash-linear-attention (pip install flash-linear-attention): {err}") from err

        o, final = naive_recurrent_kda(
            l2_normalize(q.float()), l2_normalize(k.float()), v.float(), kda_gate(f, self.A_log, self.dt_bias),
            b.float().sigmoid(), initial_state=state, output_final_state=True,
        )
        return o, final
