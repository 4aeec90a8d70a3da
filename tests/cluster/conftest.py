"""The local SLURM cluster (tests/cluster/slurm.sh), started once per test session and stopped after it.

Tests that need it are marked ``cluster`` and take the ``slurm`` fixture; run them alone with ``pytest -m cluster``.
The fixture installs SLURM when it is missing (root only: CI runs as root in a fresh clone) and skips otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "cluster" / "slurm.sh"
ACCOUNT = "deltamatch"
PARTITION = "main"


@dataclass
class Slurm:
    """The running test cluster: names a job needs, and small helpers around its clients."""

    account: str
    """Account registered with sacctmgr."""
    partition: str
    """Default partition with nodes n1 and n2."""
    env: dict[str, str]
    """Environment for snakemake/sbatch: the venv's console scripts first on PATH."""

    def run(self, *args: str, check: bool = True) -> str:
        return subprocess.run(args, capture_output=True, text=True, check=check, env=self.env).stdout

    def ok(self, *args: str) -> bool:
        """Whether the command succeeds."""
        return subprocess.run(args, capture_output=True, text=True, env=self.env).returncode == 0

    def sacct(self, job_id: str, fields: str = "JobID,State,NodeList,NNodes,NTasks,Elapsed",
              since: str | None = None) -> list[dict[str, str]]:
        """All records (job, steps, earlier requeued runs with -D) of one job; with ``since`` (sacct's -S) only those
        from then on: the accounting database outlives slurmctld's job numbering (tests/cluster/slurm.sh keeps it
        across restarts), so an earlier session's job of the same id is listed too without it."""
        out = self.run("sacct", "-D", "-n", "-P", "-j", job_id, f"--format={fields}", *(["-S", since] if since else []))
        keys = fields.split(",")
        return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line]


def _script(command: str) -> None:
    subprocess.run(["bash", str(SCRIPT), command], check=True, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def slurm():
    """Start the cluster (installing SLURM first when missing), yield a :class:`Slurm`, stop it."""
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (tests/cluster/slurm.sh)")
    if shutil.which("slurmctld") is None:
        _script("install")
    env = dict(os.environ)
    # Jobs inherit this environment (sbatch --export=ALL): rules find dm-launch and friends on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", MPLBACKEND="Agg")
    slurm = Slurm(account=ACCOUNT, partition=PARTITION, env=env)
    try:  # a start that fails half-way still stops what it started
        _script("start")
        # Jobs a killed earlier session left in the controller's saved state would be requeued into this one.
        if leftovers := slurm.run("squeue", "-h", "-o", "%i").split():
            slurm.run("scancel", *leftovers, check=False)
        yield slurm
    finally:
        _script("stop")
