"""The pipeline and its training on the live test cluster, through the project's own SLURM profile and rules.

One module fixture starts four Snakemake sessions side by side, each in its own working directory, and waits for all:

* ``pipeline_slurm`` / ``pipeline_local``: the shrunk test config's report figures (data, two training runs, figures)
  through ``--profile profiles/slurm`` and through the local profile; the two must agree exactly (CPU training is
  deterministic for a seed).
* ``requeue``: 2 nodes x 1 process with one (fake) GPU per node, as a GPU cluster runs it (``--gres=gpu:1`` per node;
  dm-launch -> srun -> torchrun, c10d rendezvous; gloo, as torch here has no CUDA). While it trains,
  ``scontrol requeue`` throws the job back into the queue; it must start again under the same job id and resume from
  its checkpoint (Snakemake's retries are off for this one).
* ``timeout``: 1 node x 1 process; its first attempt gets 1 minute (the pipeline's ``runtime * attempt``) and is
  killed by SLURM's time limit; Snakemake retries it with 2 minutes and it resumes from its checkpoint. So that the limit hits
  whatever the machine's speed, the test pauses (SIGSTOP) the first attempt's trainer once it has written a checkpoint:
  SLURM then sends SIGCONT, SIGTERM and SIGKILL at the limit, as to any job that overran.
* ``sigterm``: a plain ``sbatch`` of ``dm-train`` that cannot finish (100,000 steps) under a 1-minute limit. At the
  limit slurmstepd sends SIGTERM, then SIGKILL ``KillWait`` seconds later; the trainer must finish its step, write a
  complete checkpoint at that step and exit 143 (models/train/signals.py), so the retry the pipeline's ``retries``
  submits loses no step. (The ``timeout`` scenario's frozen trainer is killed before a handler could run: that scenario
  checks the resume, this one the handler.) It runs at ``nice 19``, so its busy minute slows the others little.

Every scenario waits on SLURM's one-minute granularity; side by side they cost that minute once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from deltamatch.models.train.checkpoint import complete_checkpoints

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster

STEPS = {"requeue": 24, "timeout": 60}
CHECKPOINT_EVERY = {"requeue": 4, "timeout": 10}
NODES = {"requeue": 2, "timeout": 1}
RUNTIME = {"requeue": 10, "timeout": 1}  # minutes for attempt 1
RETRIES = {"requeue": 0, "timeout": 2}  # attempt n gets n minutes; a loaded CI machine may need the third
GPUS = {"requeue": 1, "timeout": 0}  # per node
PIPELINE_TARGETS = [f"results/test/report/figures/{name}.csv" for name in ("figure1_loss", "figure4_gain")]
SNAKEMAKE = str(REPO / ".venv" / "bin" / "snakemake")


def _config(work: Path, variant: str) -> Path:
    """config/test.yaml with one bf16 run named after the scenario."""
    cfg = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    cfg["name"] = "cluster"
    cfg["launch"] = {"nodes": NODES[variant], "procs_per_node": 1}
    cfg["train"]["metrics"] = {"probe_every": 0, "val_every": 0, "val_batches": 1}
    cfg["train"]["train"]["steps"] = STEPS[variant]
    cfg["train"]["checkpoint"] = {"every": CHECKPOINT_EVERY[variant], "keep": 1}
    cfg["runs"] = [{"variant": variant, "sizes": ["tiny"], "methods": ["bf16"], "seeds": [0], "suites": ["offline"]}]
    cfg["probe"] = {"enabled": False}
    cfg["report"] = {**cfg.get("report", {}), "main_variant": variant}
    cfg["resources"]["train"]["runtime"] = RUNTIME[variant]
    cfg["resources"]["train"]["gpus"] = GPUS[variant]
    path = work / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _start(slurm, work: Path, cmd: list[str]) -> tuple[subprocess.Popen, Path]:
    log = work / "snakemake.log"
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=slurm.env, cwd=work), log


def _pipeline(slurm, work: Path, on_slurm: bool) -> tuple[subprocess.Popen, Path]:
    """The test config's report figures for its bf16 run, through profiles/slurm or the local profile (one core).

    One method, not the test config's two: four scenarios share two cores, and the time-limit scenario's retry must
    get through its steps while these run."""
    work.mkdir()
    cfg = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    cfg["runs"][0]["methods"] = ["bf16"]
    (work / "pipeline.yaml").write_text(yaml.safe_dump(cfg))
    where = (["--profile", str(REPO / "profiles" / "slurm"), "--slurm-init-seconds-before-status-checks", "2",
              "--latency-wait", "5"] if on_slurm else ["--profile", str(REPO / "profiles" / "local"), "--cores", "1"])
    return _start(slurm, work, [SNAKEMAKE, *PIPELINE_TARGETS, "-s", str(REPO / "Snakefile"), "-d", str(work),
                                "--configfile", str(work / "pipeline.yaml"), *where])


def _snakemake(slurm, work: Path, variant: str) -> tuple[subprocess.Popen, Path]:
    """Start the pipeline's train rule for ``variant`` through profiles/slurm, in the background."""
    work.mkdir()
    cmd = [SNAKEMAKE, str(_run_dir(Path("."), variant) / "summary.json"),
           "-s", str(REPO / "Snakefile"), "-d", str(work), "--configfile", str(_config(work, variant)),
           "--profile", str(REPO / "profiles" / "slurm"), "--retries", str(RETRIES[variant]),
           "--slurm-init-seconds-before-status-checks", "2", "--latency-wait", "5"]
    return _start(slurm, work, cmd)


def _run_dir(work: Path, variant: str) -> Path:
    return work / "results" / "cluster" / "runs" / variant / "tiny" / "bf16" / "s0"


def _train_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["step"] for r in records if r["kind"] == "train"]


def _job_of(slurm, variant: str) -> str | None:
    """The SLURM job id of a running train job (the plugin puts rule and wildcards into the job comment)."""
    for line in slurm.run("squeue", "-h", "-t", "RUNNING", "-o", "%i|%k").splitlines():
        job, comment = line.split("|", 1)
        if comment.startswith("rule_train_") and f"_wildcards_{variant}_" in comment:
            return job
    return None


def _requeue(slurm, job: str) -> None:
    slurm.run("scontrol", "requeue", job)
    # SLURM holds a requeued job for about two minutes (BeginTime, set once its old processes are gone); release it
    # as soon as it is pending again, to keep the test short.
    for _ in range(300):
        if slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip() == "PENDING":
            slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now")
            return
        time.sleep(0.1)
    raise AssertionError(f"requeued job {job} never became pending")


def _trainer_pids(job: str) -> list[int]:
    """The dm-train processes of SLURM job ``job`` (started by this test, found through /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"deltamatch.models.train.cli" in cmdline and f"SLURM_JOB_ID={job}".encode() in environ:
            pids.append(int(entry.name))
    return pids


def _drive(slurm, work: dict[str, Path], procs: dict[str, subprocess.Popen], timeout: float = 300) -> str:
    """Requeue the requeue run and freeze the timeout run's first attempt, each once it has a checkpoint."""
    requeued = frozen = None
    deadline = time.monotonic() + timeout
    while requeued is None or frozen is None:
        if time.monotonic() > deadline or any(procs[v].poll() is not None for v in ("requeue", "timeout")):
            raise AssertionError(f"requeued job {requeued}, frozen job {frozen}; snakemake exits "
                                 f"{ {v: procs[v].poll() for v in ('requeue', 'timeout')} }")
        for variant in ("requeue", "timeout"):
            done = requeued if variant == "requeue" else frozen
            job = None if done else _job_of(slurm, variant)
            if job is None or len(_train_steps(_run_dir(work[variant], variant))) <= CHECKPOINT_EVERY[variant] * 2:
                continue
            if variant == "requeue":
                _requeue(slurm, job)
                requeued = job
            elif pids := _trainer_pids(job):
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                frozen = job
        time.sleep(0.5)
    return requeued


def _resumed_step(log: Path) -> int:
    match = re.search(r"dm-train: resumed from \S+ \(step (\d+)\)", log.read_text())
    assert match, f"{log} shows no resume:\n{log.read_text()[-2000:]}"
    return int(match.group(1))


def _wait(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(60)
        return -1


def _check_run(work: Path, variant: str) -> None:
    run_dir = _run_dir(work, variant)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS[variant]
    # Each step trained once after the resume point: the metrics of the two runs join without a gap or a repeat.
    assert _train_steps(run_dir) == list(range(1, STEPS[variant] + 1))
    train_log = work / "results" / "cluster" / "logs" / "train" / variant / "tiny" / "bf16" / "s0.log"
    assert _resumed_step(train_log) >= CHECKPOINT_EVERY[variant]


class Runs:
    """The finished Snakemake sessions: working directories, exit codes, logs; the requeued job id; the start time."""

    def __init__(self, root: Path):
        self.root, self.started = root, time.strftime("%Y-%m-%dT%H:%M:%S")
        self.work = {name: root / name for name in ("requeue", "timeout", "pipeline_slurm", "pipeline_local",
                                                    "sigterm")}
        self.rc: dict[str, int] = {}
        self.logs: dict[str, Path] = {}
        self.requeued: str | None = None
        self.sigterm_job: str | None = None

    def assert_ok(self, name: str) -> None:
        assert self.rc[name] == 0, f"{name}: snakemake exit {self.rc[name]}\n" + self.logs[name].read_text()[-4000:]


def _submit_sigterm(slurm, work: Path) -> str:
    """Prepare a small data folder, then submit a dm-train that cannot finish under a 1-minute limit."""
    work.mkdir()
    (work / "data.yaml").write_text(yaml.safe_dump({"out_dir": str(work / "data"), "corpus": {"max_bytes": 500_000}}))
    subprocess.run([sys.executable, "-m", "deltamatch.models.data.cli", "--config", str(work / "data.yaml")],
                   check=True, capture_output=True)
    (work / "run.yaml").write_text(yaml.safe_dump({
        "run_dir": str(work / "run"), "model": {"size": "tiny", "attn_method": "bf16"},
        "data": {"dir": str(work / "data"), "seq_len": 64},
        "train": {"steps": 100_000, "micro_batch": 2, "device": "cpu", "threads": 1, "progress": False},
        "metrics": {"probe_every": 0, "val_every": 0, "val_batches": 1},
        "checkpoint": {"every": 100_000, "keep": 1}}))
    job = slurm.run("sbatch", "--parsable", "-t", "1", "-A", slurm.account, "-p", slurm.partition,
                    "-o", str(work / "job.out"), "--wrap",
                    f"exec nice -n 19 {sys.executable} -m deltamatch.models.train.cli --config {work / 'run.yaml'}")
    return job.strip().split(";")[0]


def _sigterm_state(slurm, job: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while (state := slurm.run("sacct", "-X", "-n", "-P", "-j", job, "--format=State").strip()) not in (
            "TIMEOUT", "COMPLETED", "FAILED", "CANCELLED"):
        if time.monotonic() > deadline:
            return f"still {state!r} after {timeout:.0f} s"
        time.sleep(2)
    return state


@pytest.fixture(scope="module")
def runs(slurm, tmp_path_factory):
    runs = Runs(tmp_path_factory.mktemp("cluster"))
    procs = {}
    try:
        runs.sigterm_job = _submit_sigterm(slurm, runs.work["sigterm"])
        for variant in ("requeue", "timeout"):
            procs[variant], runs.logs[variant] = _snakemake(slurm, runs.work[variant], variant)
        for name, on_slurm in (("pipeline_slurm", True), ("pipeline_local", False)):
            procs[name], runs.logs[name] = _pipeline(slurm, runs.work[name], on_slurm)
        runs.requeued = _drive(slurm, runs.work, procs)
        deadline = time.monotonic() + 480
        for name, proc in procs.items():
            runs.rc[name] = _wait(proc, deadline - time.monotonic())
        runs.rc["sigterm"] = _sigterm_state(slurm, runs.sigterm_job, max(deadline - time.monotonic(), 60))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)
    return runs


def test_two_node_training_resumes_after_requeue(runs, slurm):
    runs.assert_ok("requeue")
    _check_run(runs.work["requeue"], "requeue")
    # One job id, two runs in accounting; the training step ran as 2 tasks on n1 and n2, holding a GPU on each.
    records = slurm.sacct(runs.requeued, "JobID,State,NodeList,NTasks,AllocTRES", since=runs.started)
    states = [r["State"] for r in records if r["JobID"] == runs.requeued]
    assert states[0] == "REQUEUED" and states[-1] == "COMPLETED", records
    assert any(r["NodeList"] == "n[1-2]" and r["NTasks"] == "2" and "gres/gpu=2" in r["AllocTRES"]
               for r in records), records


def test_training_killed_by_time_limit_resumes_with_more_time(runs, slurm):
    runs.assert_ok("timeout")
    _check_run(runs.work["timeout"], "timeout")
    # The first attempt ended in TIMEOUT under a 1-minute limit; each retry got one minute more and resumed, until
    # one completed (the second on an idle machine).
    out = slurm.run("sacct", "-X", "-n", "-P", "--format=JobID,State,Timelimit,Comment", "-S", runs.started)
    attempts = [line.split("|")[1:3] for line in out.splitlines() if "_wildcards_timeout_" in line]
    assert 2 <= len(attempts) <= 1 + RETRIES["timeout"], out
    assert attempts == [*[["TIMEOUT", f"00:0{n}:00"] for n in range(1, len(attempts))],
                        ["COMPLETED", f"00:0{len(attempts)}:00"]], out


def test_pipeline_through_slurm_builds_the_same_report(runs, slurm):
    runs.assert_ok("pipeline_slurm")
    runs.assert_ok("pipeline_local")
    for target in PIPELINE_TARGETS:
        on_slurm = pd.read_csv(runs.work["pipeline_slurm"] / target)
        local = pd.read_csv(runs.work["pipeline_local"] / target)
        assert len(local) > 0, target
        pd.testing.assert_frame_equal(on_slurm, local, check_exact=True, obj=target)
    # The training and data jobs really ran as SLURM jobs, and accounting saw them finish.
    out = slurm.run("sacct", "-X", "-n", "-P", "--format=JobID,State,Comment", "-S", runs.started)
    done = {line.split("|")[2] for line in out.splitlines() if line.split("|")[1] == "COMPLETED"}
    assert "rule_train_wildcards_base_tiny_bf16_0" in done, out


def test_time_limit_sigterm_checkpoints_the_step_reached(runs):
    log = (runs.work["sigterm"] / "job.out").read_text()
    assert runs.rc["sigterm"] == "TIMEOUT", log[-2000:]
    match = re.search(r"dm-train: SIGTERM received: stopped after step (\d+) with checkpoint (\S+);", log)
    assert match, log[-2000:]
    step = int(match.group(1))
    assert step > 0 and Path(match.group(2)).name == f"step_{step:08d}"
    # the only checkpoint is the one SIGTERM wrote, and it is complete (every file its metadata names)
    assert [s for s, _ in complete_checkpoints(runs.work["sigterm"] / "run" / "checkpoints")] == [step]
    assert "Traceback" not in log
