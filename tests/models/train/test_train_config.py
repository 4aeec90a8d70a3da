"""Trainer config validation, schedules and the Muon/AdamW parameter split."""

import math
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from deltamatch.models.train import cli
from deltamatch.models.train.config import RunConfig, ScheduleSection, parse
from deltamatch.models.train.optim import build_optimizers, split_parameters
from deltamatch.models.train.schedule import lr_multiplier


@pytest.mark.parametrize("bad, key", [
    ({"optim": {"lr": 1e-3, "momentum": 0.9}}, "optim.momentum"),
    ({"trian": {}}, "trian"),
    ({"train": {"steps": "ten"}}, "train.steps"),
    ({"train": {"steps": 10.5}}, "train.steps"),
    ({"train": {"deterministic": "yes"}}, "train.deterministic"),
    ({"optim": {"betas": [0.9]}}, "optim.betas"),
    ({"optim": {"name": "sgd"}}, "optim.name"),
    ({"model": {"overrides": [1, 2]}}, "model.overrides"),
    ({"train": {"steps": 0}}, "train.steps"),
])
def test_bad_keys_are_rejected_by_name(bad, key, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), **bad}))
    assert cli.main(["--config", str(path)]) == 2
    assert f"'{key}'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_valid_config_parses_with_yaml_quirks():
    text = "run_dir: r\noptim: {lr: 3e-4, betas: [0.9, 0.99]}\nmodel: {init_from: null}\ntrain: {steps: 5}\n"
    config = parse(RunConfig, yaml.safe_load(text))
    assert config.optim.lr == 3e-4 and config.optim.betas == (0.9, 0.99)  # '3e-4' is a str to PyYAML
    assert config.train.steps == 5 and config.model.init_from is None and config.seed == 0
    with pytest.raises(ValueError, match="'run_dir'"):
        parse(RunConfig, {"seed": 1})


def test_schedules():
    cos = ScheduleSection(kind="cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert lr_multiplier(0, 100, cos) == pytest.approx(0.1)
    assert lr_multiplier(9, 100, cos) == 1.0 == lr_multiplier(10, 100, cos)
    assert lr_multiplier(99, 100, cos) == pytest.approx(0.1)
    mid = 10 + (99 - 10) / 2
    assert lr_multiplier(int(mid), 100, cos) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 44 / 89)))
    wsd = ScheduleSection(kind="wsd", warmup_steps=5, decay_fraction=0.2, min_lr_ratio=0.0)
    values = [lr_multiplier(s, 100, wsd) for s in range(100)]
    assert values[5:80] == [1.0] * 75
    assert values[99] == pytest.approx(0.0) and all(a > b for a, b in zip(values[79:], values[80:]))


def _tiny():
    from deltamatch.models import HybridForCausalLM, get_config

    torch.manual_seed(0)
    return HybridForCausalLM(get_config("tiny", hidden_size=64, intermediate_size=128, num_hidden_layers=4))


def test_muon_takes_hidden_matrices_and_adamw_the_rest():
    model = _tiny()
    groups = split_parameters(model)
    muon = {n for n, _ in groups["muon"]}
    # independent reference: every nn.Linear inside a block except the GDN gate projections
    expected = {f"model.layers.{i}.{name}.weight" for i, block in enumerate(model.model.layers)
                for name, mod in block.named_modules()
                if isinstance(mod, nn.Linear) and name.split(".")[-1] not in ("a_proj", "b_proj")}
    assert muon == expected
    adamw = {n for g in ("decay", "no_decay") for n, _ in groups[g]}
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= adamw
    for needle in ("A_log", "dt_bias", "a_proj", "b_proj", "conv1d", "q_norm", "k_norm", "mixer_norm"):
        assert any(needle in n for n in adamw) and not any(needle in n for n in muon), needle
    assert muon.isdisjoint(adamw) and len(muon) + len(adamw) == len(list(model.parameters()))

    opts = build_optimizers(model, parse(RunConfig, {"run_dir": "r", "optim": {"name": "muon"}}).optim)
    assert [type(o) for o in opts] == [torch.optim.Muon, torch.optim.AdamW]
    ids = [{id(p) for g in o.param_groups for p in g["params"]} for o in opts]
    assert ids[0] == {id(p) for _, p in groups["muon"]}
    no_decay = next(g for g in opts[1].param_groups if g["weight_decay"] == 0.0)
    assert {id(p) for p in no_decay["params"]} == {id(p) for _, p in groups["no_decay"]}
    only_adamw = build_optimizers(model, parse(RunConfig, {"run_dir": "r"}).optim)
    assert [type(o) for o in only_adamw] == [torch.optim.AdamW]


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[3] / "config" / "train").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_example_configs_validate(path):
    from deltamatch.models.data.prepare import PrepareConfig
    from deltamatch.models.train.config import load_yaml

    config = load_yaml(PrepareConfig if path.name.startswith("data_") else RunConfig, path)
    assert config is not None


@pytest.mark.parametrize("bad, key", [
    ({"data": {"seq_len": 1}}, "data.seq_len"),
    ({"optim": {"lr": 0}}, "optim.lr"),
    ({"optim": {"betas": [1.0, 0.9]}}, "optim.betas[0]"),
    ({"optim": {"muon_momentum": 1.5}}, "optim.muon_momentum"),
    ({"optim": {"weight_decay": -0.1}}, "optim.weight_decay"),
    ({"schedule": {"min_lr_ratio": 1.5}}, "schedule.min_lr_ratio"),
    ({"train": {"on_nonfinite": "ignore"}}, "train.on_nonfinite"),
    ({"model": {"size": "7B"}}, "model.size"),
    ({"model": {"attn_method": "fp4"}}, "model.attn_method"),
])
def test_out_of_range_values_are_rejected_by_name(bad, key, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "data": {"dir": str(tmp_path / "none")},
                                    **bad}))
    assert cli.main(["--config", str(path)]) == 2
    assert f"'{key}'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides", [{"linear_mixer": "kda"}, {"linear_mixer": "mamba2"}, {"attn_mixer": "mla"}],
                         ids=lambda o: next(iter(o.values())))
def test_muon_split_of_the_variants(overrides):
    """Every variant's gates stay with AdamW: an independent walk over the modules, by the gate names of each mixer."""
    from deltamatch.models import HybridForCausalLM, get_config

    torch.manual_seed(0)
    model = HybridForCausalLM(get_config("tiny", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                         **overrides))
    groups = split_parameters(model)
    muon = {n for n, _ in groups["muon"]}
    gate_modules = {"a_proj", "b_proj", "f_proj"}
    expected = {f"model.layers.{i}.{name}.weight" for i, block in enumerate(model.model.layers)
                for name, mod in block.named_modules()
                if isinstance(mod, nn.Linear) and not gate_modules & set(name.split("."))}
    assert muon == expected
    no_decay = {n for n, _ in groups["no_decay"]}
    for name, param in model.named_parameters():
        if name.rsplit(".", 1)[-1] in ("A_log", "dt_bias", "D") or param.ndim == 1:
            assert name in no_decay, name
