"""``HybridForCausalLM``: the Gated-DeltaNet/GQA hybrid causal LM (and its variants) as a transformers model.

Blocks are pre-norm: ``x += mixer(norm(x))``, ``x += mlp(norm(x))``; embeddings and LM head are untied; the mixer of
each block is built from the registry :data:`MIXERS` by the name in ``config.layer_pattern``. Generation uses
transformers' ``DynamicCache`` built from ``config.layer_types``: key/value tensors for attention blocks, the
short-convolution window and the recurrent state for linear-attention blocks.

This file is copied next to the weights by ``save_pretrained`` (``register_for_auto_class``); the export then
replaces it with a self-contained copy (``deltamatch.models.hub_code``: the layer imports become sibling modules), so
``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` works without deltamatch installed.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from deltamatch.models.layers.fused import fused_enabled, linear_cross_entropy
from deltamatch.models.layers.attention import GQAttention
from deltamatch.models.layers.gdn import GatedDeltaNet, ShortConvolution
from deltamatch.models.layers.mlp import SwiGLU
from deltamatch.models.layers.norm import RMSNorm

from .configuration_hybrid import ATTENTION_MIXERS, HybridConfig


def _gqa(config: HybridConfig, layer_idx: int) -> nn.Module:
    return GQAttention(
        config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
        attn_method=config.attn_method, attn_inference=config.attn_inference, qk_norm=config.qk_norm,
        rope=config.rope, rope_base=config.rope_base, norm_eps=config.rms_norm_eps, layer_idx=layer_idx,
    )


def _gdn(config: HybridConfig, layer_idx: int) -> nn.Module:
    return GatedDeltaNet(
        config.hidden_size, config.gdn_num_heads, config.gdn_head_dim, expand_v=config.gdn_expand_v,
        conv_size=config.conv_size, layer_idx=layer_idx,
    )


def _mla(config: HybridConfig, layer_idx: int) -> nn.Module:
    from deltamatch.models.layers.mla import MultiHeadLatentAttention

    return MultiHeadLatentAttention.from_config(config, layer_idx)


def _kda(config: HybridConfig, layer_idx: int) -> nn.Module:
    from deltamatch.models.layers.kda import KimiDeltaAttention

    return KimiDeltaAttention.from_config(config, layer_idx)


def _mamba2(config: HybridConfig, layer_idx: int) -> nn.Module:
    from deltamatch.models.layers.mamba2 import Mamba2Mixer

    return Mamba2Mixer.from_config(config, layer_idx)


MIXERS: dict[str, Callable[[HybridConfig, int], nn.Module]] = {
    "gqa": _gqa, "mla": _mla, "gdn": _gdn, "kda": _kda, "mamba2": _mamba2,
}


class HybridBlock(GradientCheckpointingLayer):
    """One pre-norm block: a token mixer (linear or softmax attention) and a SwiGLU MLP."""

    def __init__(self, config: HybridConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.is_attention = config.layer_pattern[layer_idx] in ATTENTION_MIXERS
        self.mixer_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mixer = MIXERS[config.layer_pattern[layer_idx]](config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, hidden_states, position_ids=None, attention_mask=None, past_key_values=None):
        h = self.mixer_norm(hidden_states)
        if self.is_attention:
            h = self.mixer(h, position_ids, attention_mask=attention_mask, cache=past_key_values)
        else:
            h = self.mixer(h, attention_mask=attention_mask, cache=past_key_values)
        hidden_states = hidden_states + h
        return hidden_states + self.mlp(self.mlp_norm(hidden_states))


class HybridPreTrainedModel(PreTrainedModel):
    config_class = HybridConfig
    config: HybridConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HybridBlock"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _is_stateful = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)  # Linear, Embedding: normal(initializer_range); RMSNorms: ones
        if isinstance(module, ShortConvolution):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        elif hasattr(module, "reset_mixer_parameters"):  # gates, decays, skip terms of the linear mixers
            module.reset_mixer_parameters(init.copy_)


class HybridModel(HybridPreTrainedModel):
    """Embeddings, the block stack (``layers``, one ``nn.ModuleList`` entry per block for FSDP2) and the final norm."""

    def __init__(self, config: HybridConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HybridBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: DynamicCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        hidden_states = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if use_cache is None:  # no cache in training: it would only hold memory (and confuse checkpoint recompute)
            use_cache = self.config.use_cache and not self.training
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        if position_ids is None:
            # RoPE is relative, so a per-row shift from left padding changes nothing
            past = past_key_values.get_seq_length() if self._has_cached_attention(past_key_values) else 0
            position_ids = torch.arange(past, past + hidden_states.shape[1], device=hidden_states.device)
            position_ids = position_ids[None].expand(hidden_states.shape[0], -1)
        for block in self.layers:
            hidden_states = block(hidden_states, position_ids, attention_mask, past_key_values)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), past_key_values=past_key_values)

    def _has_cached_attention(self, cache) -> bool:
        return cache is not None and bool(self.config.attention_layer_ids) and len(cache.layers) > 0


class HybridForCausalLM(HybridPreTrainedModel, GenerationMixin):
    """The causal LM: ``forward(input_ids, labels=...)`` gives the mean next-token cross-entropy in ``.loss``."""

    _tied_weights_keys = {}

    def __init__(self, config: HybridConfig):
        super().__init__(config)
        self.model = HybridModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: DynamicCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
        )
        hidden = out.last_hidden_state
        if labels is not None and not logits_to_keep and fused_enabled(hidden):
            # training and validation on CUDA: loss only, without the (B, N, vocab) logits (see layers/fused.py)
            loss = linear_cross_entropy(hidden[:, :-1], self.lm_head.weight, labels[:, 1:])
            return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=out.past_key_values)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            # HF convention: position t predicts labels[t + 1]; -100 is ignored
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=out.past_key_values)

    def attention_layers(self) -> list[tuple[int, nn.Module]]:
        """``(layer index, attention module)`` for every softmax-attention block; the module has ``q_norm``/``k_norm``
        (None when QK-norm is off) and its core as ``.core``."""
        return [(i, block.mixer) for i, block in enumerate(self.model.layers) if block.is_attention]


HybridConfig.register_for_auto_class()
HybridForCausalLM.register_for_auto_class("AutoModelForCausalLM")
