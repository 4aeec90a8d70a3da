"""Trainer throughput: tokens/s and peak memory of ``dm-train`` end to end, per attention method.

Presets:

- ``cpu``: the ``tiny`` model on the offline corpus, seq 256, batch 8, on this machine's CPU cores.
- ``h200``: the ``569M`` hybrid (vocab 32000) at 8K context, micro-batch 4 (52 GiB peak measured on the H200; the
  paper config's micro-batch), bf16 autocast, on one H200 — ``bf16`` against ``matched`` attention. Targets: bf16
  >= 90k tokens/s, matched >= 1.0x bf16. Run on the GPU machine:

      python benchmarks/train_bench.py h200 --out benchmarks/results/train_569m_h200.json

- ``h200-stability``: the same model and batch trained 200 optimizer steps with each of ``bf16``, ``stale``,
  ``consistent`` and ``matched`` at the paper config's peak rate (AdamW 3e-4) after a short warmup (20 steps; the
  paper's 1,000-step warmup would never reach the peak in 200 steps): every step must be finite. The JSON keeps each
  method's loss curve.

``--size`` and ``--micro-batch`` run another shape (e.g. ``--size 1.67B --micro-batch 2``). Every row carries
tokens/s, MFU (model FLOPs per token from ``deltamatch.models.train.throughput``, over the measured H200 BF16 peak)
and peak memory; a markdown table is written beside the JSON.

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

from deltamatch.atomic import write_json, write_text
from deltamatch.provenance import commit

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
        "data": {"corpus": {"max_bytes": 4_000_000}},  # ~1M tokens: 120 windows of 8K; the loader wraps around
        "run": {"model": {"size": "569M", "overrides": {"vocab_size": 32000}}, "data": {"seq_len": 8192},
                "train": {"steps": 15, "micro_batch": 4, "device": "cuda", "bf16_autocast": True}},
        "skip": 5,
    },
    "h200-stability": {
        "methods": ["bf16", "stale", "consistent", "matched"],
        "data": {"corpus": {"max_bytes": 8_000_000}},
        "run": {"model": {"size": "569M", "overrides": {"vocab_size": 32000}}, "data": {"seq_len": 8192},
                "optim": {"name": "adamw", "lr": 3.0e-4},
                "schedule": {"kind": "constant", "warmup_steps": 20},
                "train": {"steps": 200, "micro_batch": 4, "device": "cuda", "bf16_autocast": True}},
        "skip": 10,
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
           "final_val_loss": val[-1] if val else None,
           "all_finite": all(r["loss"] is not None and r["grad_norm"] is not None for r in train),
           "loss_curve": [r["loss"] for r in train]}
    steps = train[preset["skip"]:]
    if steps:
        rates = [r["tokens_per_s"] for r in steps]
        row.update(tokens_per_s=statistics.median(rates), tokens_per_s_min=min(rates), tokens_per_s_max=max(rates),
                   peak_mem_bytes=max(r["peak_mem_bytes"] for r in steps), steps_timed=len(steps),
                   tokens_per_step=steps[0]["tokens"] // steps[0]["step"])
        if all("mfu" in r for r in steps):
            row["mfu"] = statistics.median(r["mfu"] for r in steps)
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
    write_json(args.out, result)
    write_text(args.out.with_suffix(".md"), f"# train_bench {args.preset} — {result['date'][:10]}, commit "
               f"{result['commit']}, {result['machine'].get('gpu', result['machine'].get('cpu'))}\n\n"
               f"{markdown_table(rows)}\n")


COLUMNS = ["method", "returncode", "steps_done", "all_finite", "first_loss", "last_loss", "final_val_loss",
           "tokens_per_s", "speedup_vs_bf16", "mfu", "peak_mem_bytes"]


def markdown_table(rows: list[dict]) -> str:
    import pandas as pd

    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    frame["peak_mem_bytes"] = frame["peak_mem_bytes"] / 2**30
    return frame.rename(columns={"peak_mem_bytes": "peak_mem_GiB"}).to_markdown(index=False, floatfmt=".4g")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("--methods", nargs="+", help="override the preset's methods")
    parser.add_argument("--steps", type=int, help="override the preset's optimizer steps")
    parser.add_argument("--timeout", type=float, help="seconds per method before it is stopped and recorded so")
    parser.add_argument("--size", help="override the preset's model size (e.g. 1.67B)")
    parser.add_argument("--micro-batch", type=int, help="override the preset's micro-batch")
    args = parser.parse_args(argv)
    preset = json.loads(json.dumps(PRESETS[args.preset]))
    if args.size:
        preset["run"]["model"]["size"] = args.size
    if args.micro_batch:
        preset["run"]["train"]["micro_batch"] = args.micro_batch
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
    print(markdown_table(rows))
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
