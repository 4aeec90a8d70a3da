"""``HybridConfig``: one transformers config for every model the paper trains.

A model is a stack of pre-norm blocks ``x + mixer(norm(x))``, ``x + mlp(norm(x))``. ``layer_pattern`` names the mixer
of each block: a linear-attention mixer (``gdn`` Gated DeltaNet, ``kda`` Kimi Delta Attention, ``mamba2``) or a softmax
attention mixer (``gqa``, ``mla``) whose core is the attention method under study (``attn_method``). By default the
pattern puts attention at every layer with ``i % attn_every == attn_every - 1`` and ``linear_mixer`` elsewhere;
``attn_every = 1`` gives a pure-attention model. Named sizes live in ``sizes.py``.
"""

from transformers import PretrainedConfig

try:  # the method registry; a Hub copy of this file runs without deltamatch (the name was checked when exported)
    from deltamatch.methods import check_public as _check_method
except ImportError:
    _check_method = None

LINEAR_MIXERS = ("gdn", "kda", "mamba2")
ATTENTION_MIXERS = ("gqa", "mla")
ATTN_INFERENCE = ("sdpa", "method")
POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "gdn_num_heads", "gdn_head_dim", "conv_size", "mla_kv_lora_rank",
                 "mla_rope_dim", "mamba_num_heads", "mamba_head_dim", "mamba_state_size", "mamba_n_groups")


class HybridConfig(PretrainedConfig):
    """Configuration of :class:`~deltamatch.models.HybridForCausalLM`; the defaults are the ``tiny`` model."""

    model_type = "deltamatch_hybrid"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 8192
    """Embedding rows and LM-head outputs (untied)."""
    hidden_size: int = 128
    """Residual stream width."""
    intermediate_size: int = 352
    """SwiGLU inner width."""
    num_hidden_layers: int = 4
    """Number of blocks."""
    layer_pattern: list[str] | None = None
    """Mixer name per block; derived from ``attn_every``, ``linear_mixer`` and ``attn_mixer`` when None."""
    attn_every: int = 4
    """Attention at layers with ``i % attn_every == attn_every - 1`` (1: every layer)."""
    linear_mixer: str = "gdn"
    """Linear-attention mixer of the non-attention layers: ``gdn``, ``kda`` or ``mamba2``."""
    attn_mixer: str = "gqa"
    """Softmax-attention mixer: ``gqa`` or ``mla``."""
    attn_method: str = "bf16"
    """Attention core method: a public name of the registry ``deltamatch.methods`` (bf16, matched, ...)."""
    attn_inference: str = "sdpa"
    """Core of eval-mode no-grad forwards: ``sdpa`` (exact; evaluation, generation) or ``method`` (as in training)."""
    num_attention_heads: int = 4
    """Query heads of GQA/MLA layers."""
    num_key_value_heads: int = 2
    """Key/value heads of GQA layers (GQA groups = heads / kv heads)."""
    head_dim: int = 32
    """Attention head dim, independent of ``hidden_size`` (the paper's models use 128; 256 is an ablation)."""
    qk_norm: bool = True
    """RMSNorm with learnable gains on q and k per head (off: the QK-norm ablation)."""
    rope: bool = True
    """Rotary position embedding on q and k (off: NoPE)."""
    rope_base: float = 10000.0
    """RoPE base frequency."""
    gdn_num_heads: int = 2
    """Gated DeltaNet heads."""
    gdn_head_dim: int = 48
    """Gated DeltaNet key head dim (heads x head dim = key dim, 0.75 x hidden in the paper-size configs)."""
    gdn_expand_v: float = 2.0
    """Value head dim = expand_v x key head dim."""
    conv_size: int = 4
    """Short-convolution width of the linear mixers."""
    mla_q_lora_rank: int = 0
    """MLA query compression rank (0: full-rank query projection)."""
    mla_kv_lora_rank: int = 64
    """MLA joint key/value latent rank."""
    mla_rope_dim: int = 16
    """MLA decoupled RoPE dims per head (taken out of ``head_dim``; the rest is the no-position part)."""
    mamba_num_heads: int = 4
    """Mamba-2 heads."""
    mamba_head_dim: int = 64
    """Mamba-2 head dim (heads x head dim = 2 x hidden by default)."""
    mamba_state_size: int = 64
    """Mamba-2 SSM state size N."""
    mamba_n_groups: int = 1
    """Mamba-2 B/C groups."""
    rms_norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    initializer_range: float = 0.02
    """Std of the normal initialisation of linear and embedding weights."""
    tie_word_embeddings: bool = False
    """Tie LM head to embeddings (the paper's models are untied)."""
    use_cache: bool = True
    """Return a cache from forward by default (generation)."""
    layer_types: list[str] | None = None
    """transformers cache layout per block (``linear_attention`` / ``full_attention``); derived, do not set."""
    pad_token_id: int | None = None
    """Padding token id (from the tokenizer)."""
    bos_token_id: int | None = None
    """Beginning-of-sequence token id."""
    eos_token_id: int | None = None
    """End-of-sequence token id."""

    def __post_init__(self, **kwargs):
        for key, choices in (("linear_mixer", LINEAR_MIXERS), ("attn_mixer", ATTENTION_MIXERS)):
            if getattr(self, key) not in choices:
                raise ValueError(f"config key {key}: unknown mixer {getattr(self, key)!r}; choose from {choices}")
        if self.layer_pattern is None:
            if self.attn_every < 1:
                raise ValueError(f"config key attn_every must be >= 1, got {self.attn_every}")
            self.layer_pattern = [
                self.attn_mixer if i % self.attn_every == self.attn_every - 1 else self.linear_mixer
                for i in range(self.num_hidden_layers)
            ]
        self.layer_pattern = list(self.layer_pattern)
        self.layer_types = [
            "full_attention" if mixer in ATTENTION_MIXERS else "linear_attention" for mixer in self.layer_pattern
        ]
        super().__post_init__(**kwargs)
        self.check()

    def check(self) -> None:
        """Raise ValueError naming the first config key that is out of range."""
        if len(self.layer_pattern) != self.num_hidden_layers:
            raise ValueError(
                f"config key layer_pattern has {len(self.layer_pattern)} entries, "
                f"num_hidden_layers is {self.num_hidden_layers}"
            )
        for mixer in self.layer_pattern:
            if mixer not in LINEAR_MIXERS + ATTENTION_MIXERS:
                choices = LINEAR_MIXERS + ATTENTION_MIXERS
                raise ValueError(f"config key layer_pattern: unknown mixer {mixer!r}; choose from {choices}")
        if _check_method is not None:
            _check_method(self.attn_method)
        if self.attn_inference not in ATTN_INFERENCE:
            raise ValueError(f"config key attn_inference must be one of {ATTN_INFERENCE}, got {self.attn_inference!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"config key num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        for key in POSITIVE_INTS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config key {key} must be a positive integer, got {value!r}")
        if not self.gdn_expand_v > 0:
            raise ValueError(f"config key gdn_expand_v must be > 0, got {self.gdn_expand_v}")
        if self.head_dim % 16 or self.head_dim > 256:
            raise ValueError(f"config key head_dim must be a multiple of 16 and at most 256, got {self.head_dim}")
        if self.tie_word_embeddings:
            raise ValueError("config key tie_word_embeddings=True is not supported: the paper's models (and this "
                             "implementation) keep the LM head separate from the embeddings")
        if not self.rope and "mla" in self.layer_pattern:
            raise ValueError("config key rope=False (NoPE) is not supported with MLA layers: MLA's decoupled RoPE "
                             "channels (mla_rope_dim) are part of its design; use attn_mixer='gqa' for the NoPE ablation")

    @property
    def attention_layer_ids(self) -> list[int]:
        """Indices of the softmax-attention blocks."""
        return [i for i, mixer in enumerate(self.layer_pattern) if mixer in ATTENTION_MIXERS]
