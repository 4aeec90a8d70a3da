"""SLURM's time limit against a running trainer: SIGTERM at the limit ends ``dm-train`` cleanly on the real cluster.

A job that cannot finish (100,000 tiny steps) gets a 1-minute limit. At the limit slurmstepd sends SIGTERM, then
SIGKILL ``KillWait`` seconds later; the trainer must finish its step, write a complete checkpoint at that step and
exit 143 (models/train/signals.py), so the retry that the pipeline's ``retries`` submits loses no step. (The
``timeout`` scenario of test_slurm_training.py pauses its trainer with SIGSTOP to force the limit, and there SLURM's
SIGKILL ends it before a handler could run: that scenario checks the resume, this one the handler.)
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.cluster


def test_time_limit_sigterm_checkpoints_the_step_reached(slurm, tmp_path):
    from deltamatch.models.train.checkpoint import complete_checkpoints

    (tmp_path / "data.yaml").write_text(yaml.safe_dump({"out_dir": str(tmp_path / "data"),
                                                        "corpus": {"max_bytes": 500_000}}))
    subprocess.run([sys.executable, "-m", "deltamatch.models.data.cli", "--config", str(tmp_path / "data.yaml")],
                   check=True, capture_output=True)
    run_dir = tmp_path / "run"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "run_dir": str(run_dir), "model": {"size": "tiny", "attn_method": "bf16"},
        "data": {"dir": str(tmp_path / "data"), "seq_len": 64},
        "train": {"steps": 100_000, "micro_batch": 2, "device": "cpu", "threads": 1, "progress": False},
        "metrics": {"probe_every": 0, "val_every": 0, "val_batches": 1},
        "checkpoint": {"every": 100_000, "keep": 1}}))
    out = tmp_path / "job.out"
    job = slurm.run("sbatch", "--parsable", "-t", "1", "-A", slurm.account, "-p", slurm.partition, "-o", str(out),
                    "--wrap", f"exec {sys.executable} -m deltamatch.models.train.cli --config {tmp_path / 'run.yaml'}")
    job = job.strip().split(";")[0]
    deadline = time.monotonic() + 240
    while (state := slurm.run("sacct", "-X", "-n", "-P", "-j", job, "--format=State").strip()) not in (
            "TIMEOUT", "COMPLETED", "FAILED", "CANCELLED"):
        assert time.monotonic() < deadline, f"job {job} still {state!r}"
        time.sleep(2)
    log = out.read_text()
    assert state == "TIMEOUT", log[-2000:]
    match = re.search(r"dm-train: SIGTERM received: stopped after step (\d+) with checkpoint (\S+);", log)
    assert match, log[-2000:]
    step = int(match.group(1))
    assert step > 0 and Path(match.group(2)).name == f"step_{step:08d}"
    # the only checkpoint is the one SIGTERM wrote, and it is complete (every file its metadata names)
    assert [s for s, _ in complete_checkpoints(run_dir / "checkpoints")] == [step]
    assert "Traceback" not in log
