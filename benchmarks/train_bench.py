"""Trainer throughput: tokens/s and peak memory of ``dm-train`` end to end, per attention method.

Two presets:

- ``cpu``: the ``tiny`` model on the offline corpus, seq 256, batch 8, on this machine's CPU cores.
- ``h200``: the ``569M`` hybrid (vocab 32000) at 8K context, batch 1, bf16 autocast, on one H200 — ``bf16`` against
  ``matched`` attention. The issue's target is matched >= 1.1x bf16 end to end (the paper reports no end-to-end
  speedup). Run on the GPU machine:

      python benchmarks/train_bench.py h200 --out benchmarks/results/train_569m_h200.json

Each method is a separate ``dm-train`` process (fresh CUDA allocator, so peak memory is its own) without the final
checkpoint and export (only the steps are timed); a NaN stops it with status 3 and ``--timeout`` bounds it, and either
way the steps it finished are still reported. Throughput is the median of the per-step ``tokens_per_s`` records after
the preset's warm-up steps (compilation, autotuning), with the min/max and the 1-minute load average after the run: on
a shared CPU machine other jobs move these numbers more than the attention method does. The JSON result (date, commit,
machine, first/last training loss and final validation loss per method) is rewritten after every method.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

PRESETS = {
    "cpu": {
        "methods": ["bf16", "matched"],
        "data": {"corpus": {"max_bytes": 4_000_000}},
        "run": {"model": {"size": "tiny"}, "data": {"seq_len": 256},
                "train": {"steps": 12, "micro_batch": 8, "device": "cpu", "threads": os.cpu_count() or 1}},
        "skip": 3,
    },
    "h200": {
        "methods": ["bf16", "matched"],
        "data": {"corpus": {"max_bytes": 4_000_000}},  # ~1M tokens: 120 windows of 8K, enough for 15 steps
        "run": {"model": {"size": "569M", "overrides": {"vocab_size": 32000}}, "data": {"seq_len": 8192},
                "train": {"steps": 15, "micro_batch": 1, "device": "cuda", "bf16_autocast": True}},
        "skip": 5,
    },
}


def machine() -> dict:
    """Where the numbers come from."""
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count()}
    try:
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line)
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def commit() -> str:
    try:
        return subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_method(preset: dict, method: str, data_dir: Path, work: Path, timeout: float | None) -> dict:
    run = json.loads(json.dumps(preset["run"]))  # deep copy
    run.update(run_dir=str(work / method), seed=0)
    run["model"]["attn_method"] = method
    run["data"]["dir"] = str(data_dir)
    run["train"]["progress"] = False
    run["metrics"] = {"probe_every": 0, "val_every": 0, "val_batches": 1}
    run["checkpoint"] = {"every": 0, "keep": 1}
    run["train"].update(final_export=False, on_nonfinite="raise")  # time the steps, not a multi-GB save
    config = work / f"{method}.yaml"
    config.write_text(yaml.safe_dump(run))
    try:
        returncode = subprocess.run([sys.executable, "-m", "deltamatch.models.train.cli", "--config", str(config)],
                                    timeout=timeout).returncode
    except subprocess.TimeoutExpired:  # the steps it finished are still timed below
        returncode = f"timed out after {timeout:g} s"
    metrics_file = work / method / "metrics.jsonl"
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
    train = [r for r in records if r["kind"] == "train"]
    val = [r["loss"] for r in records if r["kind"] == "val"]
    row = {"method": method, "returncode": returncode, "steps_done": len(train),
           "first_loss": train[0]["loss"] if train else None, "last_loss": train[-1]["loss"] if train else None,
           "final_val_loss": val[-1] if val else None}
    steps = train[preset["skip"]:]
    if steps:
        rates = [r["tokens_per_s"] for r in steps]
        row.update(tokens_per_s=statistics.median(rates), tokens_per_s_min=min(rates), tokens_per_s_max=max(rates),
                   peak_mem_bytes=max(r["peak_mem_bytes"] for r in steps), steps_timed=len(steps),
                   tokens_per_step=steps[0]["tokens"] // steps[0]["step"])
    row["loadavg_1m_after"] = os.getloadavg()[0]
    return row


def write_result(args, preset: dict, rows: list[dict]) -> None:
    """Write the JSON result atomically, with each method's speed relative to ``bf16`` where both have one."""
    bf16 = next((r.get("tokens_per_s") for r in rows if r["method"] == "bf16"), None)
    for r in rows:
        if bf16 and r.get("tokens_per_s"):
            r["speedup_vs_bf16"] = r["tokens_per_s"] / bf16
    result = {"benchmark": "train_bench", "preset": args.preset, "date": datetime.datetime.now(datetime.UTC).isoformat(),
              "commit": commit(), "machine": machine(), "config": preset, "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_name(f".{args.out.name}.tmp")
    tmp_out.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp_out, args.out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("--methods", nargs="+", help="override the preset's methods")
    parser.add_argument("--steps", type=int, help="override the preset's optimizer steps")
    parser.add_argument("--timeout", type=float, help="seconds per method before it is stopped and recorded so")
    args = parser.parse_args(argv)
    preset = json.loads(json.dumps(PRESETS[args.preset]))
    if args.steps:
        preset["run"]["train"]["steps"] = args.steps
        preset["skip"] = min(preset["skip"], args.steps - 1)
    with tempfile.TemporaryDirectory(prefix="train_bench") as tmp:
        work = Path(tmp)
        data_cfg = work / "data.yaml"
        data_cfg.write_text(yaml.safe_dump({"out_dir": str(work / "data"), **preset["data"]}))
        subprocess.run([sys.executable, "-m", "deltamatch.models.data.cli", "--config", str(data_cfg)], check=True)
        rows = []
        for method in args.methods or preset["methods"]:
            rows.append(run_method(preset, method, work / "data", work, args.timeout))
            write_result(args, preset, rows)  # after every method: a later one that dies leaves the earlier ones
    import pandas as pd

    print(pd.DataFrame(rows).to_string(index=False))
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
