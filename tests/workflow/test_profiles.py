"""The profiles compose as documented: Snakemake's own argument parsing, from a folder laid out like a clone, gives a
SLURM run the cluster profile's settings (no workflow profile layered on top) and a local run the local ones."""

import os
from pathlib import Path

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


# Stand-ins for the SLURM clients the executor plugin calls: sbatch records its arguments and hands out job ids,
# sacct reports every job as killed by its time limit (so Snakemake resubmits it), the rest answer nothing.
SBATCH = """#!/usr/bin/env python3
import json, os, sys
log = os.environ["FAKE_SLURM_LOG"]
job = 1000 + (sum(1 for _ in open(log)) if os.path.exists(log) else 0)
with open(log, "a") as fh:
    fh.write(json.dumps({"job": job, "args": sys.argv[1:]}) + "\\n")
print(job)
"""
SACCT = """#!/usr/bin/env python3
import json, os, sys
log = os.environ["FAKE_SLURM_LOG"]
if "--format=JobIdRaw,State" in " ".join(sys.argv) and os.path.exists(log):
    for line in open(log):
        print(f"{json.loads(line)['job']}|TIMEOUT")
"""


def _stand_in_slurm(folder):
    folder.mkdir()
    for name, text in {"sbatch": SBATCH, "sacct": SACCT}.items():
        (folder / name).write_text(text)
    for name in ("sinfo", "squeue", "scontrol", "sacctmgr", "sshare", "scancel"):
        (folder / name).write_text("#!/bin/sh\nexit 0\n")
    for path in folder.iterdir():
        path.chmod(0o755)
    return folder


@pytest.mark.slow
def test_slurm_jobs_get_the_documented_retries_threads_latency_and_capped_runtime(clone, tmp_path):
    """The paper's 569M training job through profiles/slurm against stand-in sbatch/sacct: submitted 1 + retries
    times, with its rule's threads as --cpus-per-task, runtime x attempt capped at max_runtime, latency-wait 60."""
    import json
    import subprocess
    import sys

    paper = yaml.safe_load((clone / "config" / "paper.yaml").read_text())
    profile = yaml.safe_load((clone / "profiles" / "slurm" / "config.yaml").read_text())
    # the data already prepared (prepare_data is a local rule of the paper config that needs the Hub)
    (clone / "results" / "paper" / "configs").mkdir(parents=True)
    (clone / "results" / "paper" / "configs" / "data.yaml").write_text("prepared: elsewhere\n")
    os.utime(clone / "results" / "paper" / "configs" / "data.yaml", (1, 1))
    (clone / "results" / "paper" / "data").mkdir()
    fake = _stand_in_slurm(tmp_path / "slurm-bin")
    log = tmp_path / "sbatch.jsonl"
    env = {**os.environ, "FAKE_SLURM_LOG": str(log),
           "PATH": f"{fake}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    target = "results/paper/runs/base/569M/bf16/s0/summary.json"
    done = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/slurm",
                           "--configfile=config/paper.yaml", target, "--slurm-init-seconds-before-status-checks", "1"],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0 and "TIMEOUT" in done.stdout + done.stderr  # every attempt "ran out of time"
    calls = [json.loads(line)["args"] for line in log.read_text().splitlines()]
    assert len(calls) == 1 + profile["retries"] == 3
    runtime = paper["per_size"]["569M"]["resources"]["runtime"]
    cap = paper["resources"]["train"]["max_runtime"]
    for attempt, args in enumerate(calls, start=1):
        assert args[args.index("-t") + 1] == str(min(runtime * attempt, cap))
        assert f"--cpus-per-task={paper['resources']['train']['threads']}" in args
        assert "--gres=gpu:8" in args and "--nodes=1" in args
        wrap = next(a for a in args if a.startswith("--wrap="))
        assert f"--latency-wait {profile['latency-wait']}" in wrap and f"--attempt {attempt}" in wrap


@pytest.mark.slow
def test_hub_data_preparation_runs_where_snakemake_runs(clone, tmp_path):
    """data_local (the paper config): prepare_data is never submitted to SLURM; it runs beside Snakemake, which has
    the network (here none, so it fails fast naming the Hub, and no sbatch call was made)."""
    import subprocess
    import sys

    fake = _stand_in_slurm(tmp_path / "slurm-bin")
    log = tmp_path / "sbatch.jsonl"
    env = {**os.environ, "FAKE_SLURM_LOG": str(log), "HF_HUB_OFFLINE": "1",
           "PATH": f"{fake}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/slurm",
                           "--configfile=config/paper.yaml", "results/paper/data", "--retries", "0"],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and not log.exists()
    assert "Hub is unreachable" in (clone / "results" / "paper" / "logs" / "data.log").read_text()
