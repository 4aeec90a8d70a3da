"""Only result-affecting keys trigger reruns: a display-only key (train.progress, metrics.tensorboard) or the order of
a config's keys changes no rendered run config and so no training or eval job; a display key still reaches dm-train
(through the environment)."""

import json

import yaml

from deltamatch.models.train.config import COSMETIC_ENV, RunConfig, apply_cosmetic, load_yaml

TARGET = "results/test/configs/train/base/tiny/bf16/s0.yaml"


def _config(root, tmp_path, name, **train):
    cfg = yaml.safe_load((root / "config" / "test.yaml").read_text())
    for section, values in train.items():
        cfg["train"].setdefault(section, {}).update(values)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def _reversed(value):
    """``value`` with the keys of every mapping in reverse order (the same config, written another way)."""
    if isinstance(value, dict):
        return {key: _reversed(value[key]) for key in reversed(list(value))}
    return [_reversed(v) for v in value] if isinstance(value, list) else value


def test_a_cosmetic_key_reruns_nothing_a_result_key_does(snakemake, root, tmp_path):
    quiet = _config(root, tmp_path, "quiet.yaml", train={"progress": False})
    done = snakemake(TARGET, "--cores", "1", f"--configfile={quiet}", workdir=tmp_path)
    assert done.returncode == 0, done.output
    rendered = yaml.safe_load((tmp_path / TARGET).read_text())
    assert "progress" not in rendered["train"] and rendered["train"]["steps"] == 12

    loud = _config(root, tmp_path, "loud.yaml", train={"progress": True}, metrics={"tensorboard": True})
    again = snakemake("-n", TARGET, "results/test/runs/base/tiny/bf16/s0/summary.json", "--cores", "1",
                      f"--configfile={loud}", workdir=tmp_path)
    assert again.returncode == 0, again.output
    assert "rule train_config" not in again.output  # the run's config (the train job's input) stays as it was

    shuffled = tmp_path / "shuffled.yaml"
    shuffled.write_text(yaml.safe_dump(_reversed(yaml.safe_load(quiet.read_text())), sort_keys=False))
    same = snakemake("-n", TARGET, "--cores", "1", f"--configfile={shuffled}", workdir=tmp_path)
    assert same.returncode == 0 and "rule train_config" not in same.output, same.output

    faster = _config(root, tmp_path, "faster.yaml", optim={"lr": 1e-2})
    changed = snakemake("-n", TARGET, "--cores", "1", f"--configfile={faster}", workdir=tmp_path)
    assert changed.returncode == 0 and "rule train_config" in changed.output, changed.output


def test_cosmetic_keys_reach_dm_train_through_the_environment(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_dir: r\ntrain: {progress: true}\n")
    config = apply_cosmetic(load_yaml(RunConfig, path), json.dumps({"train.progress": False,
                                                                    "metrics.tensorboard": True}))
    assert config.train.progress is False and config.metrics.tensorboard is True
    for bad, message in [('{"optim.lr": 1}', "not one of the cosmetic keys"), ("[1]", "JSON object"),
                         ('{"train.progress": "no"}', "must be a bool")]:
        try:
            apply_cosmetic(config, bad)
        except ValueError as err:
            assert message in str(err) and COSMETIC_ENV in str(err)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_a_cosmetic_key_in_a_group_is_refused_naming_it(snakemake, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nruns:\n  - {variant: base, train: {train: {progress: false}}}\n")
    done = snakemake("-n", f"--configfile={bad}", workdir=tmp_path)
    assert done.returncode != 0 and "runs[0].train" in done.output and "base 'train' section only" in done.output
