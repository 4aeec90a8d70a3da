"""Named sizes: parameter counts within 2 % of the targets, counted on the meta device; ``dm-model-info``."""

import json

import pytest
import torch

from deltamatch.models import HybridForCausalLM, get_config, list_configs
from deltamatch.models.info import main as model_info_main

@pytest.fixture(autouse=True)
def meta_device_builds(monkeypatch):
    """Put the real ``torch.empty`` back for these meta-device builds. ``torch.device("meta")`` recognises constructors
    by identity, so it never sees conftest's NaN-poisoning wrapper and the 5.29B weights would be allocated for real;
    meta tensors hold no data to poison."""
    monkeypatch.setattr(torch, "empty", torch._C._VariableFunctions.empty)
    monkeypatch.setattr(torch, "empty_like", torch._C._VariableFunctions.empty_like)
    torch.utils._device._device_constructors.cache_clear()
    yield
    torch.utils._device._device_constructors.cache_clear()


# params, attention layers; the hybrid targets are fla's GatedDeltaNet counts for the same dimensions
TARGETS = {"569M": (569e6, 4), "1.67B": (1.67e9, 6), "5.29B": (5.29e9, 7), "2.58B-gqa": (2.58e9, 32)}


@pytest.mark.parametrize("name", list(TARGETS))
def test_parameter_count_within_two_percent(name):
    config = get_config(name)
    with torch.device("meta"):
        model = HybridForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    target, n_attention = TARGETS[name]
    assert abs(params / target - 1) < 0.02, params
    assert len(model.attention_layers()) == n_attention
    if name != "2.58B-gqa":
        assert [i for i, _ in model.attention_layers()] == [i for i in range(config.num_hidden_layers) if i % 4 == 3]
        assert config.gdn_num_heads * config.gdn_head_dim == 0.75 * config.hidden_size
    assert config.head_dim == 128 and config.vocab_size == 32000 and not config.tie_word_embeddings


def test_hybrid_layer_matches_fla_gated_deltanet_count():
    from fla.layers import GatedDeltaNet as FlaGatedDeltaNet

    config = get_config("569M")
    with torch.device("meta"):
        ours = HybridForCausalLM(config).model.layers[0].mixer
        theirs = FlaGatedDeltaNet(hidden_size=1536, head_dim=128, num_heads=9, expand_v=2)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_list_configs_and_overrides():
    assert set(list_configs()) == {"tiny", *TARGETS}
    config = get_config("1.67B", attn_method="matched", head_dim=256)
    assert config.attn_method == "matched" and config.head_dim == 256


def test_model_info_cli(capsys):
    assert model_info_main(["tiny", "--set", "vocab_size=1000"]) == 0
    info = json.loads(capsys.readouterr().out)
    config = get_config("tiny", vocab_size=1000)
    model = HybridForCausalLM(config)
    assert info["params"] == sum(p.numel() for p in model.parameters())
    assert info["params"] - info["non_embedding_params"] == 2 * 1000 * config.hidden_size
    assert info["layer_pattern"] == ["gdn", "gdn", "gdn", "gqa"]


@pytest.mark.parametrize("overrides, message", [
    ({"hiden_size": 64}, "'hiden_size'"),
    ({"hidden_size": "64"}, "'hidden_size' must be int"),
    ({"qk_norm": 1}, "'qk_norm' must be bool"),
    ({"num_hidden_layers": True}, "'num_hidden_layers' must be int"),
    ({"hidden_size": 0}, "hidden_size must be a positive integer"),
    ({"linear_mixer": "gdm"}, "linear_mixer: unknown mixer 'gdm'"),
    ({"attn_mixer": "mha"}, "attn_mixer: unknown mixer 'mha'"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ({"attn_mixer": "mla", "rope": False}, "rope=False"),
])
def test_bad_overrides_are_rejected_by_name(overrides, message, capsys):
    with pytest.raises(ValueError, match=message):
        get_config("tiny", **overrides)
    args = [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
    assert model_info_main(["tiny", *args]) == 2
    assert "dm-model-info: error:" in capsys.readouterr().err


def test_float_fields_take_integers():
    assert get_config("tiny", rope_base=500000, gdn_expand_v=1).rope_base == 500000
