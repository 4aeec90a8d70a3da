"""One GPU against two with the same global batch: loss agreement, tokens/s per GPU, scaling, and checkpoints that
move between rank counts (torchrun + FSDP2 + DCP, the paper config's path).

Four ``dm-train`` runs of one config, each a fresh process group:

- ``1gpu``: one rank, ``grad_accum = 2a``; ``2gpu``: two ranks, ``grad_accum = a`` (same global batch and data order);
- ``2to1``: two ranks for the first half of the steps, then one rank resumes the DCP checkpoint and finishes;
- ``1to2``: the reverse.

Reported: max |loss(2gpu) - loss(1gpu)| over the steps (bf16 noise is the bar), median tokens/s per GPU after the
warm-up steps and the scaling efficiency ``tok/s(2gpu) / (2 x tok/s(1gpu))`` (target >= 0.90), rank 0's peak memory,
and each resumed run's last loss against the uninterrupted run's. JSON, a markdown table and a seaborn figure of the
loss curves go next to ``--out``. Presets: ``h200x2`` (the 569M hybrid at 8K, micro-batch 4, on ``nvidia-h200-x2``;
set ``NCCL_NVLS_ENABLE=0`` there) and ``cpu`` (the tiny model on two gloo processes, to exercise the script).

    python benchmarks/scaling_bench.py h200x2 --out benchmarks/results/scaling_569m_h200x2.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from deltamatch.atomic import write_json, write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_bench import commit, machine  # noqa: E402

PRESETS = {
    "cpu": {"data": {"corpus": {"max_bytes": 2_000_000}},
            "run": {"model": {"size": "tiny", "attn_method": "matched"}, "data": {"seq_len": 128},
                    "train": {"steps": 8, "micro_batch": 2, "device": "cpu", "threads": 1}},
            "accum": 1, "skip": 2},
    "h200x2": {"data": {"corpus": {"max_bytes": 8_000_000}},
               "run": {"model": {"size": "569M", "attn_method": "matched", "overrides": {"vocab_size": 32000}},
                       "data": {"seq_len": 8192}, "optim": {"lr": 3.0e-4},
                       "schedule": {"kind": "constant", "warmup_steps": 20},
                       "train": {"steps": 100, "micro_batch": 4, "device": "cuda", "bf16_autocast": True}},
               "accum": 1, "skip": 10},
}


def dm_train(config: dict, path: Path, nproc: int, allow_change: bool = False) -> int:
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "deltamatch.models.train.cli", "--config", str(path)]
    if allow_change:
        cmd.append("--allow-config-change")
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, env=env).returncode


def run(preset: dict, name: str, ranks: list[int], data_dir: Path, work: Path) -> dict:
    """``ranks`` [n] trains all steps on n ranks; [n, m] trains the first half on n, the rest resumed on m."""
    steps, accum = preset["run"]["train"]["steps"], preset["accum"]
    returncodes = []
    for part, nproc in enumerate(ranks):
        cfg = json.loads(json.dumps(preset["run"]))
        cfg.update(run_dir=str(work / name), seed=0)
        cfg["data"]["dir"] = str(data_dir)
        cfg["train"].update(grad_accum=accum * 2 // nproc, progress=False, final_export=False,
                            steps=steps if part == len(ranks) - 1 else steps // 2)
        cfg["metrics"] = {"probe_every": 0, "val_every": 0, "val_batches": 1}
        cfg["checkpoint"] = {"every": steps // 2, "keep": 1}
        returncodes.append(dm_train(cfg, work / f"{name}_{part}.yaml", nproc, allow_change=part > 0))
    records = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in records if r["kind"] == "train"}
    timed = [train[s] for s in sorted(train) if s > preset["skip"]]
    row = {"run": name, "ranks": ranks, "returncodes": returncodes, "steps_done": len(train),
           "loss": {s: train[s]["loss"] for s in sorted(train)}}
    if len(ranks) == 1 and timed:
        row.update(tokens_per_s_per_gpu=statistics.median(r["tokens_per_s"] for r in timed) / ranks[0],
                   peak_mem_gib_rank0=max(r["peak_mem_bytes"] for r in timed) / 2**30)
    return row


def summarise(rows: dict[str, dict]) -> dict:
    one, two = rows["1gpu"], rows["2gpu"]
    common = sorted(set(one["loss"]) & set(two["loss"]))
    summary = {"max_abs_dloss_2gpu_vs_1gpu": max(abs(one["loss"][s] - two["loss"][s]) for s in common)
               if common else None}
    if one.get("tokens_per_s_per_gpu") and two.get("tokens_per_s_per_gpu"):
        summary["scaling_efficiency"] = two["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"]
    last = max(one["loss"]) if one["loss"] else None
    for name in ("2to1", "1to2"):
        if last in rows[name]["loss"]:
            summary[f"last_loss_{name}_minus_1gpu"] = rows[name]["loss"][last] - one["loss"][last]
    return summary


def write(args, rows: dict[str, dict], summary: dict) -> None:
    import pandas as pd
    import seaborn as sns

    result = {"benchmark": "scaling_bench", "preset": args.preset, "commit": commit(), "machine": machine(),
              "date": datetime.datetime.now(datetime.UTC).isoformat(), "summary": summary, "runs": list(rows.values())}
    write_json(args.out, result)
    table = pd.DataFrame([{k: v for k, v in r.items() if k != "loss"} for r in rows.values()])
    write_text(args.out.with_suffix(".md"),
        f"# scaling_bench {args.preset} — {result['date'][:10]}, commit {result['commit']}\n\n"
        f"{table.to_markdown(index=False, floatfmt='.4g')}\n\n{json.dumps(summary, indent=1)}\n")
    curves = pd.DataFrame([{"run": r["run"], "step": int(s), "loss": v} for r in rows.values()
                           for s, v in r["loss"].items()])
    if not curves.empty:
        plot = sns.relplot(data=curves, x="step", y="loss", hue="run", kind="line", height=3.5, aspect=1.6)
        plot.set_axis_labels("optimizer step", "training loss (nats/token)")
        plot.savefig(args.out.with_suffix(".png"), dpi=120)
    print(table.to_string(index=False))
    print(json.dumps(summary, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, required=True, help="JSON results file (.md and .png beside it)")
    parser.add_argument("--steps", type=int, help="override the preset's optimizer steps (even)")
    parser.add_argument("--method", help="override the preset's attention method")
    args = parser.parse_args(argv)
    preset = json.loads(json.dumps(PRESETS[args.preset]))
    if args.steps:
        preset["run"]["train"]["steps"] = args.steps
    if args.method:
        preset["run"]["model"]["attn_method"] = args.method
    with tempfile.TemporaryDirectory(prefix="scaling_bench") as tmp:
        work = Path(tmp)
        (work / "data.yaml").write_text(yaml.safe_dump({"out_dir": str(work / "data"), **preset["data"]}))
        subprocess.run([sys.executable, "-m", "deltamatch.models.data.cli", "--config", str(work / "data.yaml")],
                       check=True)
        rows = {name: run(preset, name, ranks, work / "data", work)
                for name, ranks in (("1gpu", [1]), ("2gpu", [2]), ("2to1", [2, 1]), ("1to2", [1, 2]))}
    summary = summarise(rows)
    write(args, rows, summary)
    return 0 if all(rc == 0 for r in rows.values() for rc in r["returncodes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
