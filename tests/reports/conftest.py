"""Synthetic pipeline outputs laid out as the pipeline lays them out, with known numbers the tests recompute."""

import json

import numpy as np
import pandas as pd
import pytest

METHODS = ["bf16", "stale", "matched"]
SEEDS = [0, 1]
STEPS = 40


def _write_run(root, variant, size, method, seed, rng):
    run = root / "runs" / variant / size / method / f"s{seed}"
    run.mkdir(parents=True)
    records = []
    for step in range(1, STEPS + 1):
        loss = 6.0 * np.exp(-step / 10) + 2.0 + rng.normal(0, 0.05) + (0.3 if method == "stale" else 0.0)
        records.append({"kind": "train", "step": step, "tokens": step * 512, "loss": loss, "lr": 1e-3,
                        "grad_norm": 1.0, "tokens_per_s": 100.0, "peak_mem_bytes": 0})
        if step % 10 == 0:
            for layer in (3, 7):
                k_gain = 1.0 + (step / 10 if method == "stale" and layer == 7 else 0.0) + rng.uniform(0, 0.1)
                records.append({"kind": "gain", "step": step, "layer": layer, "concentration": rng.uniform(0.1, 1),
                                "top_channels": [0, 1], "q_gain_max": rng.uniform(0.5, 1.5), "k_gain_max": k_gain})
    records.append({"kind": "val", "step": STEPS, "loss": 2.5})
    # A resumed run logs again the steps after its last checkpoint: the later record of a step is the one that counts.
    last_train = [r for r in records if r["kind"] == "train"][-1]
    records.append({**last_train, "loss": last_train["loss"] + 1.0})
    with open(run / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    val_ce = 2.0 + {"bf16": 0.0, "stale": 0.4, "matched": 0.01}[method] + 0.01 * seed + (0.1 if variant != "base" else 0)
    summary = {"final_val_loss": val_ce, "steps": STEPS, "tokens": STEPS * 512, "method": method, "size": size,
               "seed": seed, "wall_s": 1.0}
    (run / "summary.json").write_text(json.dumps(summary))
    return run, val_ce, records


def _write_eval(root, variant, size, method, seed, rng):
    path = root / "evals" / variant / size / method / f"s{seed}" / "offline.json"
    path.parent.mkdir(parents=True)
    tasks = {"dm_lastword": {"acc": rng.uniform(0.2, 0.6)}, "dm_ruler_8k": {"8192": rng.uniform(0, 1)},
             "heldout": {"word_perplexity": rng.uniform(100, 200)}}
    average = (tasks["dm_lastword"]["acc"] + tasks["dm_ruler_8k"]["8192"]) / 2
    result = {"checkpoint": str(path.parent / "final"), "suite": "offline", "lm_eval_version": "0.4.13",
              "tasks": tasks, "average": average,
              "metric_per_task": {"dm_lastword": "acc", "dm_ruler_8k": "8192", "heldout": None}}
    path.write_text(json.dumps(result))
    return path, result


@pytest.fixture
def synthetic(tmp_path):
    """A results folder: base × tiny × METHODS × SEEDS, a `nope` variant, evals, probes, sweep and kernel files."""
    rng = np.random.default_rng(0)
    root = tmp_path / "results" / "syn"
    runs, evals = [], []
    for variant in ("base", "nope"):
        for method in METHODS:
            for seed in SEEDS:
                run, val_ce, records = _write_run(root, variant, "tiny", method, seed, rng)
                path, result = _write_eval(root, variant, "tiny", method, seed, rng)
                runs.append({"variant": variant, "method": method, "seed": seed, "val_ce": val_ce,
                             "summary": str(run / "summary.json"), "records": records})
                evals.append({"variant": variant, "method": method, "seed": seed, "path": str(path),
                              "result": result})
    probes = pd.DataFrame([{"layer": layer, "delta": delta, "before_cast": rng.uniform(1e-8, 1e-2),
                            "after_cast": rng.uniform(1e-4, 1e-2), "dk_colsum": rng.uniform(1e-4, 1e-1)}
                           for layer in (3, 7, 11) for delta in ("stale", "consistent", "matched")])
    (root / "probes" / "base" / "tiny" / "bf16").mkdir(parents=True)
    probes_path = root / "probes" / "base" / "tiny" / "bf16" / "s0.csv"
    probes.to_csv(probes_path, index=False)
    sweep = pd.DataFrame([{"inputs": fam, "spread": s, "method": m, "metric": metric, "value": rng.uniform(1e-6, 1e-1)}
                          for fam in ("gaussian", "outlier") for s in (1.0, 2.0) for m in ("stale", "matched")
                          for metric in ("rowsum_before_cast", "rowsum_after_cast", "dk_colsum", "relerr_o")])
    (root / "sweep").mkdir()
    sweep.to_csv(root / "sweep" / "sweep.csv", index=False)
    kernel = root / "kernel"
    (kernel / "bench").mkdir(parents=True)
    (kernel / "check.jsonl").write_text("".join(json.dumps({"name": n, "head_dim": 128, "matmuls": 2, "dots": 2,
                                                           "fp8_wgmma_dots": 2, "other_mma": 0, "ok": True}) + "\n"
                                                for n in ("fwd", "bwd_dq")))
    (kernel / "bench" / "hardware.json").write_text(json.dumps({"hopper": False, "device": None, "capability": None}))
    return {"root": root, "runs": pd.DataFrame(runs), "evals": evals, "probes": probes, "probes_path": probes_path,
            "sweep": sweep}
