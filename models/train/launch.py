"""``dm-launch --config FILE [--nodes N --gpus-per-node G]``: start ``dm-train`` on this machine or across SLURM nodes.

Three shapes of the same run, chosen from the arguments and the environment:

* **one process** (``N = 1``, ``G = 1``): ``dm-train`` itself, in this process's place.
* **one node, G processes**: ``torchrun --standalone --nproc-per-node G``; one process per GPU, or G gloo processes on
  the CPU when there is no GPU (``dm-train`` picks NCCL or gloo itself).
* **N nodes** (inside a SLURM allocation, e.g. a Snakemake job with ``resources: nodes=N``): ``srun`` starts one task
  per node, and each task starts ``torchrun --nnodes N --nproc-per-node G`` with a c10d rendezvous hosted by the
  allocation's first node. Snakemake's SLURM plugin runs a rule's shell inside a one-node step (``srun -n1``) whose
  ``SLURM_*`` variables describe that step, not the job; ``dm-launch`` keeps only ``SLURM_JOB_ID`` for its ``srun``,
  which then looks the allocation up itself, and the node list is read *inside* the new step. ``--overlap`` lets the
  step share the CPUs of the step the rule runs in.

Every shape resumes the same way: ``dm-train`` loads the newest complete checkpoint of its run dir, so a job that was
killed by its time limit, requeued (``scontrol requeue``) or retried by Snakemake continues where it stopped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

TRAIN_MODULE = "deltamatch.models.train.cli"
LAUNCH_MODULE = "deltamatch.models.train.launch"
BASE_PORT = 29500
"""Rendezvous ports are BASE_PORT + (job id mod PORT_SPAN): jobs sharing a node do not collide."""
PORT_SPAN = 10000


@dataclass
class LaunchConfig:
    """How to start one training run."""

    config: str
    """The ``dm-train`` YAML config."""
    nodes: int = 1
    """Nodes to train on; more than one needs a SLURM allocation of that many nodes."""
    procs_per_node: int = 1
    """Training processes per node: one per GPU on a GPU node, gloo processes on a CPU node."""
    port: int | None = None
    """Rendezvous port on the first node; default derived from the SLURM job id."""
    train_args: list[str] = field(default_factory=list)
    """Further arguments for ``dm-train`` (e.g. ``--run-dir DIR``)."""

    def __post_init__(self):
        if self.nodes < 1:
            raise ValueError(f"--nodes must be at least 1, got {self.nodes}")
        if self.procs_per_node < 1:
            raise ValueError(f"--gpus-per-node must be at least 1, got {self.procs_per_node}")
        if not os.path.isfile(self.config):
            raise ValueError(f"--config {self.config}: no such file")


def _python() -> list[str]:
    return [sys.executable]


def _train_argv(cfg: LaunchConfig) -> list[str]:
    return ["-m", TRAIN_MODULE, "--config", cfg.config, *cfg.train_args]


def local_command(cfg: LaunchConfig) -> list[str]:
    """The command for one node: ``dm-train`` itself, or ``torchrun --standalone`` for several processes."""
    if cfg.procs_per_node == 1:
        return [*_python(), *_train_argv(cfg)]
    return [*_python(), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.procs_per_node}",
            *_train_argv(cfg)]


def srun_command(cfg: LaunchConfig, job_id: str) -> list[str]:
    """The ``srun`` that starts one node task per node; each task runs :func:`node_command` (``--node-task``)."""
    port = cfg.port if cfg.port is not None else BASE_PORT + int(job_id) % PORT_SPAN
    return [
        "srun", "--overlap", "--whole", f"--nodes={cfg.nodes}", f"--ntasks={cfg.nodes}", "--ntasks-per-node=1",
        # One node failing must stop the others, or they wait in the rendezvous until its timeout.
        "--kill-on-bad-exit=1", f"--jobid={job_id}",
        *_python(), "-m", LAUNCH_MODULE, "--node-task", "--config", cfg.config, f"--nodes={cfg.nodes}",
        f"--gpus-per-node={cfg.procs_per_node}", f"--port={port}", *(["--", *cfg.train_args] if cfg.train_args else []),
    ]


def expand_nodelist(nodelist: str) -> list[str]:
    """``n[1-2],gpu07`` -> ``['n1', 'n2', 'gpu07']``, by SLURM's own parser."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def node_address(node: str) -> str:
    """The address other nodes reach ``node`` at: its ``NodeAddr`` (the node name on most clusters)."""
    out = subprocess.run(["scontrol", "show", "node", node, "--oneliner"], capture_output=True, text=True)
    for word in out.stdout.split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1]
    return node


def node_command(cfg: LaunchConfig, env: dict[str, str]) -> list[str]:
    """Inside the ``srun`` step: ``torchrun`` for this node, rendezvous on the step's first node."""
    try:
        nodelist = env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]
        node_id, job_id = int(env["SLURM_NODEID"]), env["SLURM_JOB_ID"]
    except KeyError as err:
        raise ValueError(f"--node-task runs inside an srun step; {err.args[0]} is not set") from err
    nodes = expand_nodelist(nodelist)
    if len(nodes) != cfg.nodes:
        raise ValueError(f"--nodes={cfg.nodes} but the srun step runs on {len(nodes)} nodes ({nodelist})")
    port = cfg.port if cfg.port is not None else BASE_PORT + int(job_id) % PORT_SPAN
    # A requeued job gets the same id, hence the same port: the restart count keeps rendezvous ids apart.
    rdzv_id = f"{job_id}-{env.get('SLURM_RESTART_COUNT', '0')}"
    return [
        *_python(), "-m", "torch.distributed.run", f"--nnodes={cfg.nodes}", f"--nproc-per-node={cfg.procs_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={node_address(nodes[0])}:{port}", f"--rdzv-id={rdzv_id}",
        # Explicit host: emulated nodes share one machine, where the hostname heuristic would pick every node.
        f"--rdzv-conf=is_host={'true' if node_id == 0 else 'false'}",
        *_train_argv(cfg),
    ]


KEEP_SLURM = ("SLURM_JOB_ID", "SLURM_CONF")


def allocation_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the step's ``SLURM_*``/``SRUN_*`` variables, so ``srun`` looks up the whole job allocation.

    A rule's shell runs inside a one-node step (the plugin's ``srun -n1``), whose ``SLURM_NNODES``, ``SLURM_NODELIST``
    etc. would otherwise confine the new step to that one node ("Only allocated 1 nodes asked for 2").
    """
    return {k: v for k, v in env.items()
            if not (k.startswith(("SLURM_", "SRUN_", "SBATCH_")) and k not in KEEP_SLURM)}


def under_slurm(env: dict[str, str]) -> bool:
    """Inside a SLURM allocation with ``srun`` available."""
    return "SLURM_JOB_ID" in env and shutil.which("srun") is not None


def plan(cfg: LaunchConfig, env: dict[str, str]) -> list[str]:
    """The command this launch runs, given the environment."""
    if cfg.nodes == 1:
        return local_command(cfg)
    if not under_slurm(env):
        raise ValueError(f"--nodes={cfg.nodes} needs a SLURM allocation of {cfg.nodes} nodes (no SLURM_JOB_ID/srun)")
    return srun_command(cfg, env["SLURM_JOB_ID"])


def parse_args(argv: list[str] | None) -> tuple[LaunchConfig, bool]:
    parser = argparse.ArgumentParser(prog="dm-launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="dm-train YAML config")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (more than one: inside a SLURM allocation)")
    parser.add_argument("--gpus-per-node", "--procs-per-node", dest="procs", type=int, default=1,
                        help="training processes per node (one per GPU; gloo processes without a GPU)")
    parser.add_argument("--port", type=int, help="rendezvous port (default: derived from the SLURM job id)")
    parser.add_argument("--node-task", action="store_true",
                        help="internal: one node's task of a multi-node launch (the srun that dm-launch starts passes "
                        "it; not for use by hand)")
    parser.add_argument("train_args", nargs="*", help="after --: further dm-train arguments")
    args = parser.parse_args(argv)
    cfg = LaunchConfig(config=args.config, nodes=args.nodes, procs_per_node=args.procs, port=args.port,
                       train_args=args.train_args)
    return cfg, args.node_task


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, node_task = parse_args(argv)
        env = dict(os.environ)
        command = node_command(cfg, env) if node_task else plan(cfg, env)
        if command[0] == "srun":
            env = allocation_env(env)
    except (ValueError, subprocess.CalledProcessError) as err:
        print(f"dm-launch: error: {err}", file=sys.stderr)
        return 2
    print("dm-launch:", " ".join(command), file=sys.stderr, flush=True)
    # exec, not a child: SLURM's signals (time limit, scancel, requeue) reach the trainer directly.
    os.execvpe(command[0], command, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
