"""The report's tables: our numbers beside the paper's, as tidy pandas frames written to CSV.

Every comparison table has the columns ``paper``, ``ours`` (mean over seeds), ``difference`` (ours − paper),
``paper_scale`` (the paper's model), ``our_scale`` (the model we measured) and ``seeds`` (how many of our runs the mean
covers), keyed by what the artefact is about (method and metric; plus variant, layers). A row exists for every number
either side has: the paper's values we did not measure show ``ours`` empty, and ours without a paper value show
``paper`` empty. ``scale_of`` maps our size names onto the paper's scales (the embedded default compares ``tiny``
with 1.67B); sizes it does not name are compared with the paper scale of the same name. The sweep and the kernel's
``paper`` section follow the same pattern without ``seeds`` (ours are random heads, and GPU timings); their
``our_scale`` says so ("random heads", the GPU). Where the paper states a bound the flag ``bound`` (≤) or
``at_least`` (≥) is set, and ``note`` says where its number is another statistic than ours.
"""

from __future__ import annotations

import re

import pandas as pd

from deltamatch.methods import METHODS
from deltamatch.reports.inputs import RUN_KEYS
from deltamatch.reports.paper import FLAGS, paper_values

COMPARE = ["paper", "ours", "difference", "paper_scale", "our_scale", "seeds"]
# Why a row has no difference although both sides have a number (``difference_note``).
NOT_COMPARABLE = "not comparable"
METHOD_ORDER = list(METHODS)


def paper_scale(size: str, scale_of: dict[str, str]) -> str:
    return scale_of.get(size, size)


def run_metrics(summaries: pd.DataFrame, evals: pd.DataFrame, aliases: dict[str, str]) -> pd.DataFrame:
    """Long rows per run: run keys, metric, value — validation CE from the summaries (and ``diverged_at_step`` for a
    run that stopped on a non-finite loss: its CE is that of its last finite weights), everything from the evals.
    ``aliases`` renames our metric names to the paper's (``dm_ruler_8k`` -> ``ruler_8k``)."""
    val = summaries[RUN_KEYS].assign(metric="val_ce", value=summaries["val_ce"])
    stopped = summaries[summaries["diverged_at_step"].notna()]
    diverged = stopped[RUN_KEYS].assign(metric="diverged_at_step", value=stopped["diverged_at_step"])
    scores = evals[[*RUN_KEYS, "metric", "value"]]
    long = pd.concat([frame for frame in (val, diverged, scores) if not frame.empty], ignore_index=True)
    long["metric"] = long["metric"].replace(aliases)
    return long


def seed_means(long: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Mean over seeds per ``keys``; ``seeds`` counts the runs averaged, ``our_scale`` lists the sizes measured.

    A NaN in any run makes the mean NaN (never silently the mean of the others), and ``ours_note`` says how many of
    the runs gave NaN, so the page can show "NaN" with its reason instead of a blank.
    """
    grouped = long.groupby(keys, sort=False, dropna=False)
    means = grouped.agg(ours=("value", lambda v: v.mean(skipna=False)), seeds=("seed", "nunique"),
                        our_scale=("size", lambda s: ",".join(sorted(set(s)))),
                        _nan=("value", lambda v: int(v.isna().sum())), _n=("value", "size")).reset_index()
    means["ours_note"] = [f"NaN in {k} of {n} runs' results" if k else "" for k, n in zip(means["_nan"], means["_n"])]
    return means.drop(columns=["_nan", "_n"])


def comparable_difference(table: pd.DataFrame) -> pd.DataFrame:
    """``difference`` = ours − paper only where both measure the same statistic at the same scale; elsewhere it is
    empty and ``difference_note`` says why (another scale or hardware, a bound the paper states, or another
    statistic, which the paper value's ``note`` describes). Rows where either side has no number get neither."""
    both = table["ours"].notna() & table["paper"].notna() if "ours" in table else pd.Series(False, table.index)
    reasons = pd.Series("", index=table.index, dtype=object)
    if "our_scale" in table and "paper_scale" in table:
        other = table["our_scale"].astype(str) != table["paper_scale"].astype(str)
        reasons[other] = f"{NOT_COMPARABLE} (scale)"
    for flag in ("bound", "at_least"):
        if flag in table:
            reasons[(reasons == "") & table[flag].fillna(False).astype(bool)] = f"{NOT_COMPARABLE} (bound)"
    if "note" in table:
        reasons[(reasons == "") & table["note"].fillna("").astype(str).str.len().gt(0)] = \
            f"{NOT_COMPARABLE} (statistic)"
    reasons[~both] = ""
    out = table.copy()
    out["difference"] = (out["ours"] - out["paper"]).where(both & (reasons == ""))
    out["difference_note"] = reasons
    return out


def compare(ours: pd.DataFrame, paper: pd.DataFrame, keys: list[str], on: list[str] | None = None) -> pd.DataFrame:
    """Outer join with the difference ours − paper where comparable (:func:`comparable_difference`); rows sorted by
    ``keys``, methods in the registry's order.

    The join is on ``on`` (default ``keys``): a paper value keyed by fewer columns than ours (a claim about every
    shape, every input family) stands beside each of our rows that share its ``on`` keys. The paper's ``note`` column
    comes along only where one of its values has a note.
    """
    on = keys if on is None else on
    flags = [c for c in ("paper_scale", *FLAGS) if c in paper and c not in on]
    if "note" in paper and paper["note"].fillna("").astype(str).str.len().gt(0).any():
        flags.append("note")
    paper = paper[[*on, "paper", *flags]]
    table = ours.merge(paper, on=on, how="outer")
    table["difference"] = table["ours"] - table["paper"]  # placed here, filled by comparable_difference
    order = {}
    if "metric" in table:  # validation CE first, then what the paper reports, then ours alone
        ranked = ["val_ce", *paper["metric"].drop_duplicates(), *sorted(set(table["metric"]))]
        order["metric"] = {m: i for i, m in enumerate(dict.fromkeys(ranked))}
    if "method" in table:
        order["method"] = {m: i for i, m in enumerate(METHOD_ORDER)}
    sort = [f"_{k}" if k in order else k for k in keys if k != "method"] + (["_method"] if "method" in order else [])
    table = table.assign(**{f"_{k}": table[k].map(rank) for k, rank in order.items()})
    table = table.sort_values(sort, kind="stable").drop(columns=[f"_{k}" for k in order])
    table = comparable_difference(table)
    extra = [c for c in table.columns if c not in keys and c not in COMPARE]
    return table[[*keys, *(c for c in COMPARE if c not in keys and c in table), *extra]].reset_index(drop=True)


TASK_GAP = "commonsense_max_task_gap_to_bf16"


def task_gap(evals: pd.DataFrame, suite: str = "commonsense", method: str = "matched",
             reference: str = "bf16") -> pd.DataFrame:
    """The largest |method − reference| over the suite's tasks (each task's averaged metric, mean over seeds, in
    points): the paper's "every commonsense task within one point of BF16" as one number. One row (method, metric,
    ours, seeds, our_scale), or none where either method lacks the suite."""
    rows = evals[(evals["suite"] == suite) & evals["method"].isin([method, reference])]
    rows = rows[~rows["metric"].str.contains(":") & ~rows["metric"].str.endswith("_avg")]  # tasks' averaged metrics
    means = rows.groupby(["metric", "method"])["value"].mean().unstack("method")
    if method not in means or reference not in means or means[[method, reference]].dropna().empty:
        return pd.DataFrame(columns=["method", "metric", "ours", "seeds", "our_scale"])
    gaps = (means[method] - means[reference]).abs().dropna()
    seeds = rows.groupby("method")["seed"].nunique()
    return pd.DataFrame([{"method": method, "metric": TASK_GAP, "ours": gaps.max(),
                          "seeds": int(min(seeds[method], seeds[reference])),
                          "our_scale": ",".join(sorted(set(rows["size"])))}])


def main_table(summaries, evals, paper, scale_of, aliases) -> pd.DataFrame:
    """Main table: per method, validation CE and every eval metric of the main-size runs, beside the paper's 1.67B;
    plus the derived check ``commonsense_max_task_gap_to_bf16`` (:func:`task_gap`) beside the paper's "within one
    point"."""
    sizes = sorted(set(summaries["size"]))
    if len(sizes) != 1:
        raise ValueError(f"the main table takes the runs of one size, got {sizes}")
    ours = seed_means(run_metrics(summaries, evals, aliases), ["method", "metric"])
    gap = task_gap(evals)
    ours = pd.concat([ours, gap], ignore_index=True) if not gap.empty else ours
    table = compare(ours, paper_values(paper, "main"), ["method", "metric"])
    table["paper_scale"] = table["paper_scale"].fillna(paper_scale(sizes[0], scale_of))
    return table


def scale_table(summaries, evals, paper, scale_of, aliases) -> pd.DataFrame:
    """Scale table: validation CE and suite averages at each size, beside the paper's 569M / 1.67B / 5.29B."""
    long = run_metrics(summaries, evals, aliases)
    theirs = paper_values(paper, "scale")
    keep = long["metric"].isin(set(theirs["metric"]) | {"val_ce", "diverged_at_step"}) | long["metric"].str.endswith("_avg")
    long = long[keep].assign(paper_scale=lambda f: f["size"].map(lambda s: paper_scale(s, scale_of)))
    ours = seed_means(long, ["paper_scale", "method", "metric"])
    return compare(ours, theirs, ["paper_scale", "metric", "method"])


def ablation_table(summaries, evals, paper, scale_of, aliases) -> pd.DataFrame:
    """Ablations: per variant, each method's validation CE and its gap to BF16 of the same variant and size (the
    paper's stale-δ CE gaps), plus the eval metrics the paper reports for ablations (RULER-64K)."""
    long = run_metrics(summaries, evals, aliases)
    theirs = paper_values(paper, "ablations")
    long = long[long["metric"].isin(set(theirs["metric"]) | {"val_ce", "diverged_at_step"})]
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
    """Table 9: the row-sum residual of each δ, one row per real attention layer and per summary the paper gives.

    ``layers`` is ``last`` for the last attention layer, ``layer <i>`` for each other one, and ``all_but_last`` the
    mean over every layer but the last (only where there are two or more layers); ``layer_ids`` names the layers
    each row covers, so no layer is shown twice under another name. A model with a single attention layer (the tiny
    default) has only its ``last`` row: the paper's ``all_but_last`` rows stand with ``ours`` empty and
    ``ours_note`` saying why.
    """
    measures = ["before_cast", "after_cast", "dk_colsum"]
    long = probes.melt(id_vars=["layer", "delta"], value_vars=measures, var_name="metric", value_name="value")
    long = long.rename(columns={"delta": "method"})
    last = long["layer"].max()
    others = long[long["layer"] != last]
    groups = [long[long["layer"] == last].assign(layers="last", layer_ids=str(last))]
    if not others.empty:
        ids = ",".join(str(i) for i in sorted(set(others["layer"])))
        groups.append(others.assign(layers="all_but_last", layer_ids=ids))
        if others["layer"].nunique() > 1:
            groups.append(others.assign(layers=others["layer"].map(lambda i: f"layer {i}"),
                                        layer_ids=others["layer"].astype(str)))
    long = pd.concat(groups, ignore_index=True).assign(size=size, seed=0)
    ours = seed_means(long, ["layers", "layer_ids", "method", "metric"])
    theirs = paper_values(paper, "table9")
    table = compare(ours, theirs, ["layers", "method", "metric"])
    table["paper_scale"] = table["paper_scale"].fillna(paper_scale(size, scale_of))
    table["seeds"] = table["seeds"].where(table["ours"].notna())
    if others.empty:
        alone = table["ours"].isna() & (table["layers"] == "all_but_last")
        table.loc[alone, "ours_note"] = f"not measured: the {size} model has one attention layer (layer {last})"
    columns = ["layers", "layer_ids", *(c for c in table.columns if c not in ("layers", "layer_ids"))]
    return table[columns]


# The paper reads its gains (Figures 4 and 5) over the first 6,000 steps.
GAIN_WINDOW = 6000


def in_window(gain: pd.DataFrame, window: int) -> pd.DataFrame:
    """The gain records at steps ≤ ``window``."""
    if window <= 0:
        raise ValueError(f"gain window must be a positive number of steps, got {window}")
    return gain[gain["step"] <= window]


def gain_table(gain: pd.DataFrame, window: int = GAIN_WINDOW) -> pd.DataFrame:
    """Gain metrics of every run (every variant, size and method), read as Figure 4 reads them: ``k_gain_max`` and
    ``concentration`` of the last attention layer at the last logged step ≤ ``window``, and ``gain_max`` the largest
    query or key gain of any layer at any step ≤ ``window``. Mean over seeds; ``read_at`` says which step was read."""
    keys = ["variant", "size", "method"]
    inside = in_window(gain, window)
    if inside.empty:
        return pd.DataFrame(columns=[*keys, "k_gain_max", "concentration", "gain_max", "read_at", "seeds"])
    rows = []
    for run_keys, run in inside.groupby(RUN_KEYS, sort=False):
        step = run["step"].max()
        last = run[(run["step"] == step) & (run["layer"] == run["layer"].max())].iloc[-1]
        total = gain[(gain[RUN_KEYS] == pd.Series(run_keys, index=RUN_KEYS)).all(axis=1)]["step"].max()
        rows.append({**dict(zip(RUN_KEYS, run_keys)), "k_gain_max": last["k_gain_max"],
                     "concentration": last["concentration"],
                     "gain_max": run[["q_gain_max", "k_gain_max"]].to_numpy().max(),
                     "read_at": f"step {int(step)}" + (" (run end)" if total <= window else f" of {int(total)}")})
    per_run = pd.DataFrame(rows)
    out = per_run.groupby(keys, sort=False).agg(
        k_gain_max=("k_gain_max", "mean"), concentration=("concentration", "mean"), gain_max=("gain_max", "mean"),
        read_at=("read_at", lambda r: "; ".join(sorted(set(r)))), seeds=("seed", "nunique")).reset_index()
    return out.assign(window=window)


SWEEP_SCALE = "random heads"


def sweep_table(sweep: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The random-head sweep, one row per (metric, inputs, spread, method). The paper has no such experiment; beside
    the row-sum residuals stand the orders of magnitude it reports for the same measures on real activations (Table
    9's layers 3-19 of its 1.67B checkpoint, artefact ``sweep``), with ``our_scale`` saying ours are random heads."""
    ours = sweep.rename(columns={"value": "ours"}).assign(our_scale=SWEEP_SCALE)
    keys = ["metric", "inputs", "spread", "method"]
    return compare(ours[[*keys, "ours", "our_scale"]], paper_values(paper, "sweep"), keys, on=["method", "metric"])


NO_HOPPER = "no Hopper GPU"
RECORDED = "not measured by this run"
# The paper's latency statements are about head dim 128; its memory statement is the backward's dS workspace,
# B·H·N² bytes, stated at the shape its metric name gives.
CLAIM_HEAD_DIM = 128
LATENCY_BASELINES = ("sdpa_cudnn_bf16", "sdpa_flash_bf16", "fa4_cute_bf16")
FA3_CLASS = "fa4_cute_bf16"
"""dm-kernel-bench's FA3-class BF16 baseline (flash-attn-4's CuTe-DSL sm90 kernels: FlashAttention-3's Hopper design,
not FA3's own build), which stands for the paper's FlashAttention-3 BF16."""
FA3_CLASS_NOTE = "FA3-class: flash-attn-4's CuTe-DSL sm90 kernels (FlashAttention-3's Hopper design), not FA3's build"
WORKSPACE = re.compile(r"ds_workspace_gib_b(?P<batch>\d+)_h(?P<heads>\d+)_n(?P<seq_len>\d+)")
WORKSPACE_FORMULA = ("kernel repository (not the paper): its E4M3 dS workspace alone, B·H·N² bytes by its formula at "
                     "our shape (a lower bound on its backward's extra memory); ours: the whole backward's measured "
                     "peak extra memory")


def ds_workspace_gib(batch: int, heads: int, seq_len: int) -> float:
    """The paper's backward dS workspace: one E4M3 byte per score, B·H·N² bytes, in GiB."""
    return batch * heads * seq_len**2 / 2**30


def recorded_source(provenance: dict) -> str:
    """The label of numbers read from recorded files instead of measured by this run (with the config that produced
    them, where the provenance names one)."""
    config = f" ({provenance['config']})" if provenance.get("config") else ""
    return (f"recorded on {provenance['gpu']} on {provenance['date']} at commit {provenance['commit']}{config}, "
            f"{RECORDED}")


def kernel_claims(bench: pd.DataFrame | None, memory: pd.DataFrame | None, paper: pd.DataFrame,
                  gpu: str | None) -> pd.DataFrame:
    """The paper's kernel statements beside ours, one row per statement and measured shape.

    Latency (head dim 128): Delta-Matching's fwd+bwd time over each baseline's, per (seq_len, causal); the paper says
    above 1 against cuDNN BF16 and below 1 against FlashAttention-3 BF16, for which ours is the FA3-class
    :data:`FA3_CLASS` where it ran (``sdpa_flash_bf16`` is PyTorch's flash backend, FA2, shown without a paper value).
    Memory (``backward_extra_gib``):
    our backward's peak extra memory (the memory bench runs B = 1) beside the paper's dS workspace, a lower bound on
    its backward's extra memory: as stated at its shape, and by its formula B·H·N² bytes at each shape we measured.
    """
    theirs = paper_values(paper, "kernel")
    keys = ["metric", "seq_len", "causal", "method"]
    ratios = []
    if bench is not None and {"method", "head_dim", "seq_len", "causal", "fwd_bwd_ms"} <= set(bench):
        timed = bench[(bench["head_dim"] == CLAIM_HEAD_DIM) & bench["fwd_bwd_ms"].notna()]
        per = {m: timed[timed["method"] == m].set_index(["seq_len", "causal"])["fwd_bwd_ms"]
               for m in ("matched", *LATENCY_BASELINES)}
        for baseline in LATENCY_BASELINES:
            ratio = (per["matched"] / per[baseline]).dropna()
            name = "fa3_bf16" if baseline == FA3_CLASS else baseline
            ratios += [{"metric": f"fwd_bwd_ms_over_{name}_hd{CLAIM_HEAD_DIM}", "seq_len": n, "causal": c,
                        "method": "matched", "ours": r} for (n, c), r in ratio.items()]
    latency = theirs[theirs["metric"].str.startswith("fwd_bwd_ms_over_")]
    parts = [compare(pd.DataFrame(ratios, columns=[*keys, "ours"]), latency, keys, on=["method", "metric"])]

    stated = {tuple(int(v) for v in WORKSPACE.fullmatch(r.metric).group("batch", "heads", "seq_len")): r
              for r in theirs.itertuples() if WORKSPACE.fullmatch(r.metric)}
    measured = {}
    if stated and memory is not None and {"method", "seq_len", "heads", "peak_extra_backward_gib"} <= set(memory):
        rows = memory[(memory["method"] == "matched") & memory["peak_extra_backward_gib"].notna()]
        measured = {(1, int(r.heads), int(r.seq_len)): float(r.peak_extra_backward_gib) for r in rows.itertuples()}
    rows = []
    for shape in sorted(set(stated) | set(measured)):
        said = stated.get(shape)
        paper_row = ({"paper": said.paper, "paper_scale": said.paper_scale, "note": said.note} if said else
                     {"paper": ds_workspace_gib(*shape), "paper_scale": next(iter(stated.values())).paper_scale,
                      "note": WORKSPACE_FORMULA})
        rows.append({"metric": "backward_extra_gib", "seq_len": shape[2], "method": "matched", "batch": shape[0],
                     "heads": shape[1], "ours": measured.get(shape, float("nan")), **paper_row, "at_least": True})
    if rows:
        memory_rows = pd.DataFrame(rows)
        parts.append(memory_rows.assign(difference=memory_rows["ours"] - memory_rows["paper"]))
    table = pd.concat(parts, ignore_index=True).assign(head_dim=CLAIM_HEAD_DIM)
    table["our_scale"] = table["ours"].notna().map({True: gpu, False: None})
    fa3 = table["metric"].str.contains("fa3")
    table["ours_note"] = table.get("ours_note", pd.Series("", index=table.index)).fillna("").astype(str)
    table.loc[fa3 & table["ours"].notna(), "ours_note"] = FA3_CLASS_NOTE
    table.loc[fa3 & table["ours"].isna(), "ours_note"] = (f"not measured: the FA3-class baseline ({FA3_CLASS}, "
                                                         "flash-attn-4) did not run")
    return comparable_difference(table)


def kernel_table(check: pd.DataFrame, bench: pd.DataFrame | None, memory: pd.DataFrame | None,
                 hardware: dict, paper: pd.DataFrame | None = None, recorded: dict | None = None,
                 profile: pd.DataFrame | None = None) -> pd.DataFrame:
    """The kernel's build check, its latency and backward memory where a Hopper GPU measured them, and the paper's
    kernel statements beside ours.

    ``section`` says which: ``build`` (one row per compiled kernel: its FP8 wgmma count against its matmuls, other
    MMAs, registers, spills), ``latency`` (per method and shape, with ``speedup_vs_cudnn_bf16``: SDPA cuDNN BF16's
    fwd+bwd time over this method's, and ``speedup_vs_fa3_class`` the FA3-class baseline's where it ran), ``memory``,
    ``profile`` (``profile``: per method, each kernel's GPU time in one fwd+bwd at the reference shape), ``paper`` (the
    paper's values and ours, :func:`kernel_claims`) and ``status`` (what was not measured, and why). Without a Hopper
    GPU, ``recorded`` (``{"bench", "memory", "profile", "provenance"}``: frames and ``{gpu, date, commit}`` of each,
    from files a Hopper GPU wrote earlier) stands in for the measurements, every such row labelled in ``source`` with
    where, when and at which commit it was recorded.
    """
    parts = [check.assign(section="build")]
    hopper = bool(hardware.get("hopper"))
    device = hardware.get("device") or "no CUDA device"
    sources = {name: f"measured by this run on {device}" for name in ("bench", "memory", "profile")}
    gpu = device
    if not hopper and recorded:
        bench, memory, profile = recorded.get("bench"), recorded.get("memory"), recorded.get("profile")
        sources = {name: recorded_source(recorded["provenance"][name]) for name in ("bench", "memory", "profile")
                   if name in recorded.get("provenance", {})}
        gpu = recorded["provenance"]["bench"]["gpu"] if "bench" in sources else None
    if bench is not None and not bench.empty:
        bench = bench.copy()
        if "fwd_bwd_ms" in bench:
            shape = ["head_dim", "seq_len", "causal"]
            for baseline, column in (("sdpa_cudnn_bf16", "speedup_vs_cudnn_bf16"), (FA3_CLASS, "speedup_vs_fa3_class")):
                ref = bench[bench["method"] == baseline][[*shape, "fwd_bwd_ms"]].dropna()
                if column == "speedup_vs_fa3_class" and ref.empty:
                    continue  # flash-attn-4 did not run: no column of NaN
                bench = bench.merge(ref.rename(columns={"fwd_bwd_ms": "_ref"}), on=shape, how="left")
                bench[column] = bench.pop("_ref") / bench["fwd_bwd_ms"]
        parts.append(bench.assign(section="latency", source=sources.get("bench")))
    if memory is not None and not memory.empty:
        parts.append(memory.assign(section="memory", source=sources.get("memory")))
    if profile is not None and not profile.empty:
        parts.append(profile.assign(section="profile", source=sources.get("profile")))
    if paper is not None:
        claims = kernel_claims(bench, memory, paper, gpu)
        which = claims["metric"].eq("backward_extra_gib").map({True: "memory", False: "bench"})
        claims["source"] = [sources.get(w) if pd.notna(o) else None for w, o in zip(which, claims["ours"])]
        parts.append(claims.assign(section="paper"))
    if not hopper:
        status = f"{NO_HOPPER} ({device}): latency not measured by this run"
        if recorded and sources:
            status += "; the latency and memory rows are " + sources.get("bench", sources.get("memory"))
        parts.append(pd.DataFrame([{"section": "status", "status": status}]))
    table = pd.concat(parts, ignore_index=True)
    return table[["section", *(c for c in table.columns if c != "section")]]


# Steps left out of a run's throughput: the first steps compile the kernels (and on a GPU autotune Triton's).
WARM_STEPS = 10
# The share of a run's last logged steps its final training loss is the mean of (Figure 1's statistic too).
TAIL = 0.1


def recorded_label(provenance: dict) -> str:
    """The source of a recorded pipeline run's numbers: GPU, date, short commit and config."""
    return recorded_source({**provenance, "commit": provenance["commit"][:7]})


def _median(frame: pd.DataFrame, column: str) -> float:
    return frame[column].median() if column in frame else float("nan")


def run_table(runs: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per run: which implementation trained each kind of mixer (the run's ``backends``), steps and tokens,
    the final training loss (mean of the last 10% of steps) and validation CE, throughput (median tokens/s and MFU
    over the steps after the first ``WARM_STEPS``), peak memory (the CUDA allocator's peak on a GPU, the process's
    resident set on a CPU), the trainer's wall time, and the last attention layer's largest key gain and gain
    concentration at the last logged step. A column no run
    records (MFU on a CPU) is left out rather than shown as NaN."""
    rows, by_run = [], dict(tuple(metrics.groupby(RUN_KEYS, sort=False))) if not metrics.empty else {}
    for run in runs.itertuples(index=False):
        mine = by_run.get(tuple(getattr(run, key) for key in RUN_KEYS), metrics.iloc[0:0])
        train = mine[mine["kind"] == "train"].sort_values("step")
        if train.empty:
            raise ValueError(f"{run.run_dir}: no 'train' records in metrics.jsonl")
        warm = train[train["step"] > WARM_STEPS] if len(train) > WARM_STEPS else train
        gain = mine[mine["kind"] == "gain"]
        last = gain[gain["layer"] == gain["layer"].max()].sort_values("step").tail(1) if not gain.empty else gain
        peak = train["peak_mem_bytes"].max() if "peak_mem_bytes" in train else float("nan")
        rows.append({
            **{key: getattr(run, key) for key in RUN_KEYS}, "gdn_backend": run.gdn_backend,
            "attention_backend": run.attention_backend, "steps": run.steps, "tokens": run.tokens,
            "final_train_loss": train["loss"].iloc[-max(1, int(len(train) * TAIL)):].mean(), "val_ce": run.val_ce,
            "tokens_per_s": _median(warm, "tokens_per_s"), "mfu_percent": 100 * _median(warm, "mfu"),
            "peak_gib": peak / 2**30 if peak > 0 else float("nan"), "wall_s": run.wall_s,
            "key_gain_last_layer": last["k_gain_max"].iloc[0] if not last.empty else float("nan"),
            "concentration_last_layer": last["concentration"].iloc[0] if not last.empty else float("nan"),
        })
    table = pd.DataFrame(rows)
    optional = ["mfu_percent", "peak_gib", "key_gain_last_layer", "concentration_last_layer"]
    table = table.drop(columns=[c for c in optional if table[c].isna().all()])
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    return table.sort_values(RUN_KEYS, key=lambda c: c.map(order) if c.name == "method" else c,
                             kind="stable").reset_index(drop=True)
