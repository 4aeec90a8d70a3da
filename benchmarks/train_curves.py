"""Merge ``train_bench.py`` results into one record per method, with a loss-curve figure.

A device call has a time limit, so the four 200-step stability runs may come from more than one call (same machine
kind, same preset). For each method this keeps the row that finished (return code 0) with the most steps, writes the
merged JSON (each row names the file it came from), a Markdown table (tokens/s, speed relative to ``bf16``, MFU,
peak memory, losses) and a seaborn figure of the loss curves (all steps, and the last quarter zoomed in)::

    python benchmarks/train_curves.py RUN1.json RUN2.json --out benchmarks/results/h200_stability/stability.json
"""

import argparse
import json
import sys
from pathlib import Path

from deltamatch.atomic import atomic_path, write_json, write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_bench import markdown_table  # noqa: E402


def pick_rows(results: list[dict]) -> list[dict]:
    """Per method (first-seen order), the finished row with the most steps; a method with none keeps its best try."""
    best: dict[str, dict] = {}
    for result in results:
        for row in result["results"]:
            row = {**row, "source": result["_source"], "date": result["date"], "commit": result["commit"]}
            key = (row["returncode"] == 0, row["steps_done"])
            old = best.get(row["method"])
            if old is None or key > (old["returncode"] == 0, old["steps_done"]):
                best[row["method"]] = row
    rows = list(best.values())
    bf16 = best.get("bf16", {}).get("tokens_per_s")
    for row in rows:
        row["speedup_vs_bf16"] = row["tokens_per_s"] / bf16 if bf16 and row.get("tokens_per_s") else None
    return rows


def plot_curves(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd
    import seaborn as sns
    from matplotlib import pyplot as plt

    frame = pd.DataFrame([{"method": r["method"], "step": i + 1, "loss": loss}
                          for r in rows for i, loss in enumerate(r["loss_curve"])])
    last = int(frame["step"].max())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    sns.lineplot(frame, x="step", y="loss", hue="method", ax=axes[0], linewidth=1)
    sns.lineplot(frame[frame["step"] > 0.75 * last], x="step", y="loss", hue="method", ax=axes[1], linewidth=1,
                 legend=False)
    axes[0].set(xlabel="optimizer step", ylabel="training loss (nats/token)", title="all steps")
    axes[1].set(xlabel="optimizer step", ylabel="training loss (nats/token)", title="last quarter")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="train_bench.py JSON results")
    parser.add_argument("--out", type=Path, required=True, help="merged JSON; the .md and .png go beside it")
    args = parser.parse_args(argv)
    results = []
    for path in args.results:
        result = json.loads(path.read_text())
        if result.get("benchmark") != "train_bench":
            parser.error(f"{path} is not a train_bench.py result (its 'benchmark' is {result.get('benchmark')!r})")
        results.append({**result, "_source": str(path)})
    presets = {r["preset"] for r in results}
    if len(presets) != 1:
        parser.error(f"the results come from different presets {sorted(presets)}; merge runs of one preset only")
    rows = pick_rows(results)
    merged = {"benchmark": "train_curves", "preset": presets.pop(), "machine": results[0]["machine"],
              "config": results[0]["config"], "results": rows}
    write_json(args.out, merged)
    header = f"# {merged['preset']} on {merged['machine'].get('gpu', merged['machine'].get('cpu'))}\n\n"
    sources = "\n".join(f"- `{r['method']}`: {r['date'][:16]} UTC, commit {r['commit']}, {Path(r['source']).name}"
                        for r in rows)
    write_text(args.out.with_suffix(".md"), f"{header}{markdown_table(rows)}\n\nRuns:\n{sources}\n")
    plot_curves(rows, args.out.with_suffix(".png"))
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
