"""The trainer on Hopper GPUs: bf16 autocast, the Triton FP8 attention inside a training step, NCCL + FSDP2.

Run on the H200: ``.venv/bin/pytest -q -m gpu tests/models/train/test_train_gpu.py`` (skipped without an sm90 GPU).
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from deltamatch.models.data import cli as data_cli
from deltamatch.models.train.config import RunConfig, parse
from deltamatch.models.train.loop import train

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_data")
    (root / "data.yaml").write_text(yaml.safe_dump({"out_dir": str(root / "data"), "corpus": {"max_bytes": 1_000_000}}))
    assert data_cli.main(["--config", str(root / "data.yaml")]) == 0
    return root / "data"


def _config(data_dir, run_dir, method):
    # head dim 64: the smallest the Triton FP8 kernels run (the tiny default's 32 would be refused on the GPU)
    return {"run_dir": str(run_dir), "model": {"size": "tiny", "attn_method": method, "overrides": {"head_dim": 64}},
            "data": {"dir": str(data_dir), "seq_len": 512},
            "train": {"steps": 6, "micro_batch": 4, "device": "cuda", "bf16_autocast": True, "progress": False},
            "metrics": {"probe_every": 3, "probe_seq_len": 256, "val_every": 0},
            "checkpoint": {"every": 3}}


def _records(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.mark.parametrize("method", ["bf16", "matched", "stale"])
def test_one_gpu_run_trains_and_probes(data_dir, tmp_path, method):
    summary = train(parse(RunConfig, _config(data_dir, tmp_path / method, method)))
    steps = _records(tmp_path / method, "train")
    assert len(steps) == 6 and all(torch.isfinite(torch.tensor(r["loss"])) for r in steps)
    assert steps[-1]["loss"] < steps[0]["loss"] and steps[-1]["peak_mem_bytes"] > 0
    residual = _records(tmp_path / method, "residual")
    assert {r["delta"] for r in residual} == {"stale", "consistent", "matched"}
    assert summary["final_val_loss"] < steps[0]["loss"]
    attention = [e for e in summary["backends"] if e["mixer"] == "gqa"]
    assert attention and attention[0]["backend"] == ("sdpa" if method == "bf16" else "triton")


def test_a_gpu_run_refuses_to_train_through_the_reference_simulation(data_dir, tmp_path):
    cfg = _config(data_dir, tmp_path / "d32", "matched")
    cfg["model"]["overrides"]["head_dim"] = 32  # below the Triton FP8 kernels' head dims: only the reference runs it
    with pytest.raises(ValueError, match="reference simulation"):
        train(parse(RunConfig, cfg))
    cfg["train"]["allow_reference_attention"] = True
    cfg["train"]["steps"] = 1
    assert train(parse(RunConfig, cfg))["backends"][-1]["backend"] == "reference"


def test_a_gpu_run_of_cudnn_fp8_says_why_no_backend_runs_it(data_dir, tmp_path):
    # head dim 64: cuDNN's FP8 attention declines it, and the reference runs cudnn_fp8 only as cudnn_fp8_sim
    with pytest.raises(ValueError, match="no attention backend can run mode='cudnn_fp8'.*runs only D = 128"):
        train(parse(RunConfig, _config(data_dir, tmp_path / "cudnn", "cudnn_fp8")))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_nccl_fsdp2(data_dir, tmp_path):
    cfg = _config(data_dir, tmp_path / "fsdp", "matched")
    cfg["train"]["activation_checkpointing"] = True
    cfg["optim"] = {"name": "muon"}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "deltamatch.models.train.cli", "--config", str(tmp_path / "run.yaml")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_records(tmp_path / "fsdp", "train")) == 6
    assert (tmp_path / "fsdp" / "final" / "config.json").is_file()
