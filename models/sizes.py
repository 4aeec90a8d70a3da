"""The named model sizes. The paper does not publish its exact dimensions; each function's docstring records ours.

Shared choices for the paper-size hybrids (counted with fla on the meta device; the test asserts counts within 2 %):
vocab 32000, untied embeddings, Gated DeltaNet with key dim 0.75 x hidden (heads of 128) and expand_v 2, softmax
attention at every layer with ``i % 4 == 3``, GQA head dim 128 with 4 KV heads, QK-RMSNorm, RoPE, SwiGLU MLP.

Variants are overrides of these (``get_config("1.67B", linear_mixer="kda")`` etc.); their extra dimensions:
KDA takes GDN's heads and dims; MLA uses latent rank 512, 64 RoPE + 64 no-position channels per 128-dim head,
full-rank queries; Mamba-2 uses 2 x hidden inner width in heads of 64 with state size 128, one B/C group.
"""

from collections.abc import Callable

from deltamatch.models.configuration_hybrid import HybridConfig

PAPER_VOCAB = 32000


def tiny() -> dict:
    """CPU smoke model, 3.0M params at vocab 8192: hidden 128, 4 layers (3 GDN + 1 GQA), GDN 2 heads x 48 (key dim
    96 = 0.75 x hidden), GQA 4 q / 2 kv heads x 32, MLP 352. A training step at batch 1 x 256 tokens takes well under
    a second on one CPU core. Override ``vocab_size`` with the tokenizer's."""
    return dict(
        vocab_size=8192, hidden_size=128, intermediate_size=352, num_hidden_layers=4, gdn_num_heads=2,
        gdn_head_dim=48, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    )


def _paper(hidden: int, layers: int, gdn_heads: int, q_heads: int, mlp: int) -> dict:
    return dict(
        vocab_size=PAPER_VOCAB, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        gdn_num_heads=gdn_heads, gdn_head_dim=128, num_attention_heads=q_heads, num_key_value_heads=4, head_dim=128,
        mamba_num_heads=2 * hidden // 64, mamba_head_dim=64, mamba_state_size=128,
        mla_kv_lora_rank=512, mla_rope_dim=64,
    )


def size_569m() -> dict:
    """567.6M: hidden 1536, 16 layers (12 GDN + 4 GQA), GDN 9 heads x 128, GQA 12 q / 4 kv x 128, MLP 3712."""
    return _paper(1536, 16, 9, 12, 3712)


def size_1p67b() -> dict:
    """1667.6M: hidden 2048, 24 layers (18 GDN + 6 GQA), GDN 12 heads x 128, GQA 16 q / 4 kv x 128, MLP 6912."""
    return _paper(2048, 24, 12, 16, 6912)


def size_5p29b() -> dict:
    """5294.6M: hidden 3584, 28 layers (21 GDN + 7 GQA), GDN 21 heads x 128, GQA 28 q / 4 kv x 128, MLP 10752."""
    return _paper(3584, 28, 21, 28, 10752)


def size_2p58b_gqa() -> dict:
    """2.58B pure-attention baseline: hidden 2560, 32 GQA layers, 20 q / 4 kv heads x 128, MLP 7808, vocab 32000
    (2587M). Chosen as the Llama-style shape (hidden 2560 = 20 x 128, MLP ~ 3 x hidden) whose count lands on 2.58B."""
    return dict(
        vocab_size=PAPER_VOCAB, hidden_size=2560, intermediate_size=7808, num_hidden_layers=32, attn_every=1,
        num_attention_heads=20, num_key_value_heads=4, head_dim=128,
    )


CONFIGS: dict[str, Callable[[], dict]] = {
    "tiny": tiny,
    "569M": size_569m,
    "1.67B": size_1p67b,
    "5.29B": size_5p29b,
    "2.58B-gqa": size_2p58b_gqa,
}


def list_configs() -> list[str]:
    """Names accepted by :func:`get_config`."""
    return list(CONFIGS)


def check_overrides(overrides: dict, prefix: str = "") -> None:
    """Every override names a ``HybridConfig`` field and has its default's type; errors name ``prefix + key``
    (``prefix`` is where the caller's user wrote them, e.g. ``model.overrides.``)."""
    defaults = HybridConfig().to_dict()  # PretrainedConfig would silently keep a misspelt field as an attribute
    for key, value in overrides.items():
        where = f"'{prefix}{key}'"
        if key not in defaults:
            raise ValueError(f"unknown config key {where} (not a HybridConfig field)")
        default = defaults[key]
        expected = (int, float) if type(default) is float else type(default)
        if default is not None and type(default) in (bool, int, float, str) and (
                not isinstance(value, expected) or isinstance(value, bool) != isinstance(default, bool)):
            raise ValueError(f"config key {where} must be {type(default).__name__}, got {value!r}")


def get_config(name: str, **overrides) -> HybridConfig:
    """The named size as a :class:`HybridConfig`, with ``overrides`` applied (e.g. ``attn_method="matched"``,
    ``linear_mixer="kda"``, ``attn_mixer="mla"``, ``head_dim=256``, ``rope=False``, ``qk_norm=False``)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model size {name!r}; choose one of {list_configs()}")
    check_overrides(overrides)
    fields = CONFIGS[name]()
    fields.update(overrides)
    return HybridConfig(**fields)
