"""dm-launch's choice of command, without a cluster (the live runs are in test_slurm_training.py)."""

from __future__ import annotations

import sys

import pytest

from deltamatch.models.train import launch


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_dir: x\n")
    return str(path)


def test_one_process_runs_the_trainer_itself(config):
    cfg = launch.LaunchConfig(config=config)
    assert launch.plan(cfg, {}) == [sys.executable, "-m", "deltamatch.models.train.cli", "--config", config]


def test_one_node_several_processes_uses_standalone_torchrun(config):
    cfg = launch.LaunchConfig(config=config, procs_per_node=4, train_args=["--run-dir", "r"])
    cmd = launch.plan(cfg, {"SLURM_JOB_ID": "7"})  # one node needs no srun, even inside an allocation
    assert cmd[:5] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"]
    assert cmd[-4:] == ["--config", config, "--run-dir", "r"]


def test_several_nodes_need_an_allocation(config, monkeypatch):
    cfg = launch.LaunchConfig(config=config, nodes=2)
    with pytest.raises(ValueError, match="SLURM allocation"):
        launch.plan(cfg, {})
    monkeypatch.setattr(launch.shutil, "which", lambda name: "/usr/bin/srun")
    cmd = launch.plan(cfg, {"SLURM_JOB_ID": "12345"})
    assert cmd[0] == "srun" and "--nodes=2" in cmd and "--ntasks-per-node=1" in cmd and "--overlap" in cmd
    assert "--node-task" in cmd and f"--port={launch.BASE_PORT + 2345}" in cmd


def test_allocation_env_drops_the_step_but_keeps_the_job():
    env = {"SLURM_JOB_ID": "5", "SLURM_NNODES": "1", "SLURM_NODELIST": "n1", "SRUN_DEBUG": "3", "PATH": "/bin",
           "SLURM_CONF": "/etc/slurm/slurm.conf"}
    assert launch.allocation_env(env) == {"SLURM_JOB_ID": "5", "PATH": "/bin", "SLURM_CONF": "/etc/slurm/slurm.conf"}


def test_node_task_outside_a_step_is_an_error(config):
    cfg = launch.LaunchConfig(config=config, nodes=2)
    with pytest.raises(ValueError, match="SLURM_"):
        launch.node_command(cfg, {})


@pytest.mark.parametrize("argv, message", [
    (["--config", "/nonexistent.yaml"], "no such file"),
    (["--nodes", "0"], "--nodes"),
    (["--gpus-per-node", "0"], "--gpus-per-node"),
])
def test_bad_arguments_exit_2_naming_the_problem(config, capsys, argv, message):
    if argv[0] != "--config":
        argv = ["--config", config, *argv]
    assert launch.main(argv) == 2
    assert message in capsys.readouterr().err
