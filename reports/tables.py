"""The report's tables: our numbers beside the paper's, as tidy pandas frames written to CSV.

Every comparison table has the columns ``paper``, ``ours`` (mean over seeds), ``difference`` (ours − paper),
``paper_scale`` (the paper's model), ``our_scale`` (the model we measured) and ``seeds`` (how many of our runs the mean
covers), keyed by what the artefact is about (method and metric; plus variant, layers). A row exists for every number
either side has: the paper's values we did not measure show ``ours`` empty, and ours without a paper value show
``paper`` empty. ``scale_of`` maps our size names onto the paper's scales (the embedded default compares ``tiny``
with 1.67B); sizes it does not name are compared with the paper scale of the same name.
"""

from __future__ import annotations

import pandas as pd

from deltamatch.kernels.methods import METHODS
from deltamatch.reports.inputs import RUN_KEYS
from deltamatch.reports.paper import paper_values

COMPARE = ["paper", "ours", "difference", "paper_scale", "our_scale", "seeds"]
METHOD_ORDER = list(METHODS)


def paper_scale(size: str, scale_of: dict[str, str]) -> str:
    return scale_of.get(size, size)


def run_metrics(summaries: pd.DataFrame, evals: pd.DataFrame, aliases: dict[str, str]) -> pd.DataFrame:
    """Long rows per run: run keys, metric, value — validation CE from the summaries, everything from the evals.
    ``aliases`` renames our metric names to the paper's (``dm_ruler_8k`` -> ``ruler_8k``)."""
    val = summaries[RUN_KEYS].assign(metric="val_ce", value=summaries["val_ce"])
    scores = evals[[*RUN_KEYS, "metric", "value"]]
    long = pd.concat([val, scores], ignore_index=True)
    long["metric"] = long["metric"].replace(aliases)
    return long


def seed_means(long: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Mean over seeds per ``keys``; ``seeds`` counts the runs averaged, ``our_scale`` lists the sizes measured."""
    grouped = long.groupby(keys, sort=False, dropna=False)
    return grouped.agg(ours=("value", "mean"), seeds=("seed", "nunique"),
                       our_scale=("size", lambda s: ",".join(sorted(set(s))))).reset_index()


def compare(ours: pd.DataFrame, paper: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Outer join on ``keys`` with the difference ours − paper; methods in the registry's order."""
    paper = paper[[*keys, "paper", *(c for c in ("paper_scale", "approx", "bound") if c in paper and c not in keys)]]
    table = ours.merge(paper, on=keys, how="outer")
    table["difference"] = table["ours"] - table["paper"]
    order = {}
    if "metric" in table:  # validation CE first, then what the paper reports, then ours alone
        ranked = ["val_ce", *paper["metric"].drop_duplicates(), *sorted(set(table["metric"]))]
        order["metric"] = {m: i for i, m in enumerate(dict.fromkeys(ranked))}
    if "method" in table:
        order["method"] = {m: i for i, m in enumerate(METHOD_ORDER)}
    sort = [f"_{k}" if k in order else k for k in keys if k != "method"] + (["_method"] if "method" in order else [])
    table = table.assign(**{f"_{k}": table[k].map(rank) for k, rank in order.items()})
    table = table.sort_values(sort, kind="stable").drop(columns=[f"_{k}" for k in order])
    extra = [c for c in table.columns if c not in keys and c not in COMPARE]
    return table[[*keys, *(c for c in COMPARE if c not in keys), *extra]].reset_index(drop=True)


def main_table(summaries, evals, paper, scale_of, aliases) -> pd.DataFrame:
    """Main table: per method, validation CE and every eval metric of the main-size runs, beside the paper's 1.67B."""
    sizes = sorted(set(summaries["size"]))
    if len(sizes) != 1:
        raise ValueError(f"the main table takes the runs of one size, got {sizes}")
    ours = seed_means(run_metrics(summaries, evals, aliases), ["method", "metric"])
    table = compare(ours, paper_values(paper, "main"), ["method", "metric"])
    table["paper_scale"] = table["paper_scale"].fillna(paper_scale(sizes[0], scale_of))
    return table


def scale_table(summaries, evals, paper, scale_of, aliases) -> pd.DataFrame:
    """Scale table: validation CE and suite averages at each size, beside the paper's 569M / 1.67B / 5.29B."""
    long = run_metrics(summaries, evals, aliases)
    theirs = paper_values(paper, "scale")
    keep = long["metric"].isin(set(theirs["metric"]) | {"val_ce"}) | long["metric"].str.endswith("_avg")
    long = long[keep].assign(paper_scale=lambda f: f["size"].map(lambda s: paper_scale(s, scale_of)))
    ours = seed_means(long, ["paper_scale", "method", "metric"])
    return compare(ours, theirs, ["paper_scale", "metric", "method"])


def ablation_table(summaries, evals, paper, scale_of, aliases) -> pd.DataFrame:
    """Ablations: per variant, each method's validation CE and its gap to BF16 of the same variant and size (the
    paper's stale-δ CE gaps), plus the eval metrics the paper reports for ablations (RULER-64K)."""
    long = run_metrics(summaries, evals, aliases)
    theirs = paper_values(paper, "ablations")
    long = long[long["metric"].isin(set(theirs["metric"]) | {"val_ce"})]
    long = long.assign(paper_scale=long["size"].map(lambda s: paper_scale(s, scale_of)))
    keys = ["variant", "paper_scale", "method", "metric"]
    ours = seed_means(long, keys)
    ce = ours[ours["metric"] == "val_ce"]
    bf16 = ce[ce["method"] == "bf16"].set_index(["variant", "paper_scale"])["ours"]
    gaps = ce[ce["method"] != "bf16"].copy()
    gaps["ours"] = gaps["ours"] - [bf16.get((v, s), float("nan")) for v, s in zip(gaps["variant"], gaps["paper_scale"])]
    gaps["metric"] = "ce_gap_to_bf16"
    ours = pd.concat([ours, gaps.dropna(subset=["ours"])], ignore_index=True)
    return compare(ours, theirs, ["variant", "paper_scale", "metric", "method"])


def probe_table(probes: pd.DataFrame, size: str, paper, scale_of) -> pd.DataFrame:
    """Table 9: the row-sum residual of each δ per attention layer, and summarised as the paper does: the mean over
    every attention layer but the last, and the last layer alone (a single attention layer counts as both)."""
    measures = ["before_cast", "after_cast", "dk_colsum"]
    long = probes.melt(id_vars=["layer", "delta"], value_vars=measures, var_name="metric", value_name="value")
    long = long.rename(columns={"delta": "method"})
    last = long["layer"].max()
    # A model with one attention layer (the tiny default) has no other layers: that layer stands in both groups.
    others = long[long["layer"] != last] if long["layer"].nunique() > 1 else long
    groups = [long.assign(layers=long["layer"].map(lambda i: f"layer {i}")),
              others.assign(layers="all_but_last"),
              long[long["layer"] == last].assign(layers="last")]
    long = pd.concat(groups, ignore_index=True).assign(size=size, seed=0)
    ours = seed_means(long, ["layers", "method", "metric"])
    theirs = paper_values(paper, "table9")
    table = compare(ours, theirs, ["layers", "method", "metric"])
    table["paper_scale"] = table["paper_scale"].fillna(paper_scale(size, scale_of))
    table["seeds"] = table["seeds"].where(table["ours"].notna())
    return table


def sweep_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """The random-head sweep, one row per (inputs, spread, method), one column per metric. The paper gives no
    numbers for it."""
    wide = sweep.pivot_table(index=["inputs", "spread", "method"], columns="metric", values="value", sort=False)
    return wide.reset_index().rename_axis(columns=None)


NO_HOPPER = "no Hopper GPU"


def kernel_table(check: pd.DataFrame, bench: pd.DataFrame | None, memory: pd.DataFrame | None,
                 hardware: dict) -> pd.DataFrame:
    """The kernel's build check, and its latency and backward memory where a Hopper GPU measured them.

    ``section`` says which: ``build`` (one row per compiled kernel: its FP8 wgmma count against its matmuls, other
    MMAs, registers, spills), ``latency`` (per method and shape, with ``speedup_vs_cudnn_bf16``: SDPA cuDNN BF16's
    fwd+bwd time over this method's), ``memory`` and ``status`` (what was not measured, and why).
    """
    parts = [check.assign(section="build")]
    if bench is not None and not bench.empty:
        bench = bench.copy()
        if "fwd_bwd_ms" in bench:
            shape = ["head_dim", "seq_len", "causal"]
            ref = bench[bench["method"] == "sdpa_cudnn_bf16"][[*shape, "fwd_bwd_ms"]]
            bench = bench.merge(ref.rename(columns={"fwd_bwd_ms": "_ref"}), on=shape, how="left")
            bench["speedup_vs_cudnn_bf16"] = bench.pop("_ref") / bench["fwd_bwd_ms"]
        parts.append(bench.assign(section="latency"))
    if memory is not None and not memory.empty:
        parts.append(memory.assign(section="memory"))
    if not hardware.get("hopper"):
        device = hardware.get("device") or "no CUDA device"
        parts.append(pd.DataFrame([{"section": "status", "status": f"{NO_HOPPER} ({device}): latency not measured"}]))
    table = pd.concat(parts, ignore_index=True)
    return table[["section", *(c for c in table.columns if c != "section")]]
