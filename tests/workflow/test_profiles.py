"""The profiles compose as documented: Snakemake's own argument parsing, from a folder laid out like a clone, gives a
SLURM run the cluster profile's settings (no workflow profile layered on top) and a local run the local ones."""

import os

import pytest
import yaml
from snakemake.cli import parse_args

TARGET = "results/paper/report/tables/main_1p67b.csv"


@pytest.fixture
def clone(root, tmp_path, monkeypatch):
    for entry in root.iterdir():
        if entry.name not in {".git", ".venv", "results", ".snakemake"}:
            (tmp_path / entry.name).symlink_to(entry)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_slurm_profile_is_not_shadowed_by_a_workflow_profile(clone, capsys):
    documented = yaml.safe_load((clone / "profiles" / "slurm" / "config.yaml").read_text())
    _, args = parse_args(["--profile", "profiles/slurm", "--configfile=config/paper.yaml", TARGET])
    assert "workflow specific profile" not in capsys.readouterr().err
    assert args.retries == documented["retries"] == 2
    assert args.latency_wait == documented["latency-wait"] == 60
    assert args.executor == "slurm"
    # no `cores` from a local profile: each job's --cpus-per-task is its rule's threads, not the login node's cores
    assert args.cores is None
    assert args.targets == [TARGET] and [str(p) for p in args.configfile] == ["config/paper.yaml"]


def test_local_profile_is_used_only_when_named(clone):
    _, args = parse_args(["--profile", "profiles/local"])
    assert args.cores == os.cpu_count() and args.retries == 1 and args.latency_wait == 5
    _, bare = parse_args(["--cores", "2"])
    assert bare.retries == 0  # Snakemake's own default: nothing of profiles/local leaks in
