"""Mamba-2 mixer for the Mamba-2/GQA hybrid variant: transformers' ``Mamba2Mixer``, driven by our config and cache.

transformers already carries a complete Mamba-2 block (SSD chunked scan in PyTorch, the mamba-ssm / causal-conv1d
kernels when those packages are installed, and the conv/SSM states in the same ``DynamicCache`` linear-attention layers
our GDN uses), so this module only maps :class:`HybridConfig` onto a ``Mamba2Config`` and adapts the call signature.
Parameter names are transformers' (``in_proj``, ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm``, ``out_proj``).
"""

import torch
from transformers import Mamba2Config
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer as _HFMamba2Mixer


class Mamba2Mixer(_HFMamba2Mixer):
    @classmethod
    def from_config(cls, config, layer_idx: int) -> "Mamba2Mixer":
        inner = config.mamba_num_heads * config.mamba_head_dim
        if inner % config.hidden_size:
            raise ValueError(
                f"config keys mamba_num_heads x mamba_head_dim = {inner} must be a multiple of "
                f"hidden_size={config.hidden_size}"
            )
        mamba_config = Mamba2Config(
            hidden_size=config.hidden_size, num_heads=config.mamba_num_heads, head_dim=config.mamba_head_dim,
            expand=inner // config.hidden_size, state_size=config.mamba_state_size, n_groups=config.mamba_n_groups,
            conv_kernel=config.conv_size, layer_norm_epsilon=config.rms_norm_eps, use_bias=False, use_conv_bias=True,
            num_hidden_layers=config.num_hidden_layers, chunk_size=64,
        )
        return cls(mamba_config, layer_idx=layer_idx)

    def reset_mixer_parameters(self, copy_=None) -> None:
        """transformers' Mamba-2 init (A = 1..H, D = 1, dt_bias = softplus^-1(dt)); it skips loaded weights itself."""
        self.init_mamba2_weights()

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        if attention_mask is not None:
            attention_mask = attention_mask[:, -x.shape[1]:]
        return super().forward(x, cache_params=cache, attention_mask=attention_mask)
