"""The SLURM commands README.md and docs/cluster.md give, run exactly as written on the real local SLURM
(tests/workflow/test_doc_commands.py classifies every documented command; these are its ``cluster`` rows)."""

from __future__ import annotations

import getpass
import subprocess

import pytest
from doc_commands import ROOT, documented_commands

pytestmark = pytest.mark.cluster
DOCUMENTED = documented_commands()


def _run(slurm, command: str) -> subprocess.CompletedProcess:
    assert command in DOCUMENTED, f"not a documented command: {command}"
    env = {**slurm.env, "USER": slurm.env.get("USER") or getpass.getuser()}  # a login shell sets USER
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def test_install_is_idempotent_as_root(slurm):
    assert "already installed" in _run(slurm, "tests/cluster/slurm.sh install").stderr  # the fixture installed it


def test_account_and_partition_lookups(slurm):
    accounts = _run(slurm, 'sacctmgr -n -s list user "$USER" format=account%30').stdout.split()
    assert slurm.account in accounts
    assert slurm.partition in _run(slurm, "sinfo -s").stdout
    gres = _run(slurm, 'sinfo -o "%P %G"').stdout.split()
    assert gres[:2] == ["PARTITION", "GRES"] and any(word.startswith("gpu:fake:2") for word in gres)
    limits = _run(slurm, 'sinfo -o "%P %l"').stdout.splitlines()
    assert limits[0].split() == ["PARTITION", "TIMELIMIT"] and limits[1].split()[0].rstrip("*") == slurm.partition
    assert "is UP" in _run(slurm, "scontrol ping").stdout


def test_squeue_lines_show_a_jobs_comment(slurm):
    job = slurm.run("sbatch", "--parsable", "-A", slurm.account, "-p", slurm.partition, "-J", "doc-test",
                    "--comment=rule_train_wildcards_doc", "-t", "2", "--wrap", "sleep 60").strip().split(";")[0]
    try:
        short = _run(slurm, 'squeue -u $USER -o "%i %k %T"').stdout.splitlines()
        assert short[0].split() == ["JOBID", "COMMENT", "STATE"]
        assert any(line.split()[:2] == [job, "rule_train_wildcards_doc"] for line in short[1:]), short
        named = _run(slurm, 'squeue -u $USER -o "%i %j %k %T"').stdout.splitlines()
        assert any(line.split()[:3] == [job, "doc-test", "rule_train_wildcards_doc"] for line in named[1:]), named
    finally:
        slurm.run("scancel", job, check=False)
