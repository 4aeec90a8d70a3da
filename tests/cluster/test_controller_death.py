"""What docs/cluster.md says about a dead controller: a running job carries on without slurmctld, and the restarted
controller recovers it from its saved state and records how it ended."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster
SCRIPT = Path(__file__).with_name("slurm.sh")
STATE = Path(os.environ.get("DM_SLURM_STATE", "/var/tmp/deltamatch-slurm"))


def _logs(lines: int = 25) -> str:
    """The last lines of the controller's and the nodes' logs: what a timed-out wait needs to be read."""
    logs = sorted((STATE / "log").glob("slurm*.log"))
    return "\n".join(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                     for log in logs)


def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}\n{_logs()}"
        time.sleep(0.2)


def test_jobs_outlive_the_controller_and_are_recovered(slurm, tmp_path):
    # The job ends only once the test opens its gate, after the controller is dead: with a fixed `sleep 6` a loaded CI
    # machine once took longer than that to see the state saved, so the job ended (and told the controller) before the
    # kill, the recovered controller held it as running from the older save, and it ran into its time limit (TIMEOUT)
    started, finished, gate = tmp_path / "started", tmp_path / "finished", tmp_path / "gate"
    job = slurm.run("sbatch", "--parsable", "-A", slurm.account, "-t", "2", "-o", str(tmp_path / "job.out"),
                    "--wrap", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.2; done; touch {finished}").strip()
    _until(started.exists, 30, "the job to start")
    _until(lambda: slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip() == "RUNNING", 30,
           "the controller to see the job running")
    # A controller killed before it has saved a started job forgets it (docs/cluster.md), and it batches its saves
    # (Slurm's SAVE_MAX_WAIT: up to 5 s after the last), which on a loaded machine once outlasted a fixed 3 s wait. So
    # the test waits for a save it knows holds the running job: a job update asks for one, and job_state is rewritten
    # after it. The second's pause keeps an earlier save, begun before the job ran, from passing for it (file times
    # run on the kernel's coarse clock, a tick behind time.time_ns()).
    time.sleep(1)
    asked = time.time_ns()
    slurm.run("scontrol", "update", f"jobid={job}", "comment=state-saved-while-running")
    saved = STATE / "ctld" / "job_state"
    _until(lambda: saved.exists() and saved.stat().st_mtime_ns > asked, 30, "the controller to save the running job")

    controller = int((STATE / "run" / "slurmctld.pid").read_text())
    os.kill(controller, signal.SIGKILL)  # the daemon the fixture started, by its recorded PID
    _until(lambda: not slurm.ok("scontrol", "ping"), 10, "the controller to be gone")
    assert not finished.exists()  # the job was still running when its controller died

    gate.touch()
    _until(finished.exists, 30, "the orphaned job to finish without a controller")

    subprocess.run(["bash", str(SCRIPT), "start"], check=True, stdin=subprocess.DEVNULL)
    # The job's end reaches the recovered controller on Slurm's retry schedules: slurmstepd resends it every 15 s, and
    # the controller resends an undelivered message to a node on its own, slower timer (agent_retry). Locally that
    # takes 0.5-10 s; on the loaded 2-core CI machine accounting once took just over 30 s and the queue once more than
    # 60 s. So both bounds are for a hang, not for speed, and a timeout prints the daemons' logs.
    _until(lambda: not slurm.run("squeue", "-h", "-j", job, check=False).strip(), 180, "the job to leave the queue")
    _until(lambda: slurm.run("sacct", "-X", "-n", "-j", job, "-o", "State").split() == ["COMPLETED"], 120,
           "accounting to record the job as completed")
