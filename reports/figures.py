"""The paper's figures redrawn from our runs (seaborn, Agg backend), each with a small table of the numbers the paper
states about it, beside ours.

- Figure 1: training loss curves per method (main size). Numbers: final and peak training loss.
- Figure 4: the last attention layer's largest key RMSNorm gain and its gain concentration over training.
- Figure 5: training loss and the largest QK-norm channel gain at two scales.
- Random-head sweep: row-sum residuals and key-gradient column sums against the logit spread.

Definitions of the stated numbers (ours; the paper reads them off its curves): ``final_train_loss`` is the mean
training loss over the last 10% of logged steps; ``peak_train_loss`` the largest logged loss after the first 10% (the
initial descent is no spike); ``train_loss_rise`` the final loss minus the lowest mean over any window of 10% of the
logged steps after the first 10% (how far a loss "climbs" back; 0 for a loss still falling); ``k_gain_max`` and ``concentration`` the last attention layer's values at the last
logged step within the gain window; ``gain_max`` the largest query or key channel gain of any layer at any logged
step within the window.

The gain window is the paper's: its Figures 4 and 5 read the gains over the first 6,000 steps. ``GAIN_WINDOW`` is the
default (``dm-report --gain-window``, the config's ``report.gain_window_steps``); a run shorter than the window is
read at its end, and the numbers' ``window`` column says which step was read.
"""

from __future__ import annotations

import pandas as pd

from deltamatch.atomic import atomic_path
from deltamatch.reports.inputs import RUN_KEYS
from deltamatch.reports.paper import paper_values
from deltamatch.reports.tables import GAIN_WINDOW, METHOD_ORDER, TAIL, compare, in_window, paper_scale, seed_means


def _pyplot():
    # Chosen when a figure is drawn, not at import: headless machines (CI, cluster nodes) have no display.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _methods(frame: pd.DataFrame) -> list[str]:
    present = set(frame["method"])
    return [m for m in METHOD_ORDER if m in present] + sorted(present - set(METHOD_ORDER))


def save_figure(grid_or_fig, path) -> None:
    fig = getattr(grid_or_fig, "figure", grid_or_fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    _pyplot().close(fig)


def smoothed(frame: pd.DataFrame, column: str) -> pd.Series:
    """Rolling mean per run over about 5% of its logged steps (the curves are per-step noisy)."""
    def smooth(series: pd.Series) -> pd.Series:
        return series.rolling(max(1, len(series) // 20), min_periods=1).mean()

    return frame.groupby(RUN_KEYS, sort=False)[column].transform(smooth)


def loss_numbers(train: pd.DataFrame) -> pd.DataFrame:
    """Per run: final_train_loss and peak_train_loss as long rows (run keys, metric, value)."""
    rows = []
    for keys, run in train.sort_values("step").groupby(RUN_KEYS, sort=False):
        n = len(run)
        head = max(1, int(n * TAIL))
        final = run["loss"].iloc[-max(1, int(n * TAIL)):].mean()
        peak = run["loss"].iloc[head:].max() if n > head else run["loss"].iloc[-1]
        # over the same 10% windows as the final loss: per-step noise alone never reads as a climb
        smooth = run["loss"].rolling(max(1, int(n * TAIL)), min_periods=max(1, int(n * TAIL))).mean()
        lowest = smooth.iloc[head:].min() if n > head else smooth.iloc[-1]
        lowest = final if pd.isna(lowest) else min(lowest, final)
        rows += [(*keys, "final_train_loss", final), (*keys, "peak_train_loss", peak),
                 (*keys, "train_loss_rise", final - lowest)]
    return pd.DataFrame(rows, columns=[*RUN_KEYS, "metric", "value"])


def window_label(gain: pd.DataFrame, window: int) -> pd.Series:
    """Per run (all its gain records): the step the window reads, 'step 180 (run end, within window 6000)' for a run
    shorter than the window, 'step 6000 (window 6000 of 28610 steps)' for a longer one."""
    steps = gain.groupby(RUN_KEYS, sort=False)["step"]
    last, read = steps.max(), gain[gain["step"] <= window].groupby(RUN_KEYS, sort=False)["step"].max()
    return pd.Series({key: (f"step {int(read[key])} (run end, within window {window})" if last[key] <= window
                            else f"step {int(read[key])} (window {window} of {int(last[key])} steps)")
                      for key in read.index}, dtype=object).rename_axis(RUN_KEYS)


def last_layer_gains(gain: pd.DataFrame) -> pd.DataFrame:
    """The gain records of each run's last attention layer (the layer the paper's Figure 4 shows)."""
    last = gain.groupby(RUN_KEYS, sort=False)["layer"].transform("max")
    return gain[gain["layer"] == last]


def records(metrics: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The ``kind`` records (train, gain) of the runs; none at all is an error naming what to change."""
    found = metrics[metrics["kind"] == kind] if "kind" in metrics else metrics.iloc[0:0]
    if found.empty:
        hint = " (is metrics.probe_every 0 in the train config?)" if kind == "gain" else ""
        raise ValueError(f"no '{kind}' records in the runs' metrics.jsonl{hint}")
    return found.copy()


def _with_scale(numbers: pd.DataFrame, scale_of: dict[str, str]) -> pd.DataFrame:
    return numbers.assign(paper_scale=numbers["size"].map(lambda s: paper_scale(s, scale_of)))


def figure_loss(metrics: pd.DataFrame, paper: pd.DataFrame, scale_of: dict[str, str]):
    """Figure 1: training loss against tokens, one line per method. Returns (figure, numbers table)."""
    import seaborn as sns

    plt = _pyplot()
    train = records(metrics, "train")
    train["smoothed loss"] = smoothed(train.sort_values("step"), "loss")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(data=train, x="tokens", y="smoothed loss", hue="method", hue_order=_methods(train), ax=ax,
                 errorbar=None)
    sizes = ",".join(sorted(set(train["size"])))
    ax.set_title(f"Figure 1: training loss (ours: {sizes}; paper: 1.67B)")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("training loss (nats/token, smoothed)")
    numbers = seed_means(_with_scale(loss_numbers(train), scale_of), ["paper_scale", "method", "metric"])
    return fig, compare(numbers, paper_values(paper, "figure1"), ["paper_scale", "method", "metric"])


def _windowed(numbers: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """The ``window`` column: the step each run was read at (one label per row, runs of one group joined)."""
    keyed = numbers.merge(labels.rename("window").reset_index(), on=RUN_KEYS, how="left")
    return keyed


def _seed_means_windowed(numbers: pd.DataFrame, scale_of: dict[str, str]) -> pd.DataFrame:
    keys = ["paper_scale", "method", "metric"]
    scaled = _with_scale(numbers, scale_of)
    means = seed_means(scaled, keys)
    windows = scaled.groupby(keys, sort=False)["window"].agg(lambda w: "; ".join(sorted(set(w)))).reset_index()
    return means.merge(windows, on=keys, how="left")


def figure_gain(metrics: pd.DataFrame, paper: pd.DataFrame, scale_of: dict[str, str], window: int = GAIN_WINDOW):
    """Figure 4: the last attention layer's largest key gain and its gain concentration over training, read at the
    last logged step within the first ``window`` steps (the paper's 6,000) or at the run's end if it is shorter."""
    import seaborn as sns

    _pyplot()  # selects the headless backend before seaborn draws
    every = last_layer_gains(records(metrics, "gain"))
    gain = in_window(every, window)
    long = gain.melt(id_vars=[*RUN_KEYS, "step"], value_vars=["k_gain_max", "concentration"], var_name="quantity")
    long["quantity"] = long["quantity"].map({"k_gain_max": "largest key RMSNorm gain",
                                             "concentration": "largest channel's share of Σ_c (g_q,c·g_k,c)²"})
    grid = sns.relplot(data=long, x="step", y="value", hue="method", hue_order=_methods(long), col="quantity",
                       kind="line", errorbar=None, facet_kws={"sharey": False}, height=3.4, aspect=1.2)
    grid.set_titles("{col_name}")
    grid.set_axis_labels("training step", "gain / share (dimensionless)")
    grid.figure.suptitle(f"Figure 4: last attention layer, steps ≤ {window} (paper at 1.67B: stale key gain ≈ 5.5)",
                         y=1.04)
    for ax in grid.axes.flat[:1]:
        ax.axhline(5.5, color="grey", ls=":", lw=1)
        ax.annotate("paper stale ≈ 5.5 (1.67B)", (0.02, 0.96), xycoords="axes fraction", va="top", fontsize=8)
    final = gain.sort_values("step").groupby(RUN_KEYS, sort=False).tail(1)
    numbers = final.melt(id_vars=RUN_KEYS, value_vars=["k_gain_max", "concentration"], var_name="metric")
    numbers = _seed_means_windowed(_windowed(numbers, window_label(every, window)), scale_of)
    return grid, compare(numbers, paper_values(paper, "figure4"), ["paper_scale", "method", "metric"])


def figure_scales(metrics: pd.DataFrame, paper: pd.DataFrame, scale_of: dict[str, str], window: int = GAIN_WINDOW):
    """Figure 5: training loss and the largest channel gain over training, one column per size; ``gain_max`` is the
    largest gain within the first ``window`` steps (or the whole run if it is shorter)."""
    import seaborn as sns

    train = records(metrics, "train").sort_values("step")
    train["value"] = smoothed(train, "loss")
    every = records(metrics, "gain")
    gain = in_window(every, window)
    gain["value"] = gain[["q_gain_max", "k_gain_max"]].max(axis=1)
    gain = gain.groupby([*RUN_KEYS, "step"], as_index=False)["value"].max()
    long = pd.concat([train[[*RUN_KEYS, "step", "value"]].assign(quantity="training loss"),
                      gain.assign(quantity="largest channel gain")], ignore_index=True)
    grid = sns.relplot(data=long, x="step", y="value", hue="method", hue_order=_methods(long), row="quantity",
                       col="size", kind="line", errorbar=None, facet_kws={"sharey": False}, height=3.2, aspect=1.2)
    grid.set_titles("{row_name}, {col_name}")
    grid.set_axis_labels("training step", "")
    for (quantity, _), ax in grid.axes_dict.items():
        ax.set_ylabel("loss (nats/token)" if quantity == "training loss" else "gain (dimensionless)")
        if quantity != "training loss":
            ax.axhline(1.7, color="grey", ls=":", lw=1)
    grid.figure.suptitle(f"Figure 5: loss and gains (gains: steps ≤ {window}; dotted: the paper's 569M range top, ≈ 1.7)",
                         y=1.03)
    gain_max = gain.groupby(RUN_KEYS, as_index=False)["value"].max().assign(metric="gain_max")
    losses = loss_numbers(records(metrics, "train"))
    losses = losses[losses["metric"] != "train_loss_rise"].assign(window="whole run")
    gain_max = _windowed(gain_max, window_label(every, window))
    numbers = _seed_means_windowed(pd.concat([losses, gain_max], ignore_index=True), scale_of)
    return grid, compare(numbers, paper_values(paper, "figure5"), ["paper_scale", "method", "metric"])


def figure_sweep(sweep: pd.DataFrame):
    """The random-head sweep: each residual measure against the logit spread, per input family and method."""
    import seaborn as sns

    shown = sweep[sweep["metric"].isin(["rowsum_before_cast", "rowsum_after_cast", "dk_colsum"])]
    grid = sns.relplot(data=shown, x="spread", y="value", hue="method", hue_order=_methods(shown), col="metric",
                       row="inputs", kind="line", marker="o", errorbar=None, height=3.0, aspect=1.1)
    grid.set(yscale="log")
    grid.set_titles("{row_name}: {col_name}")
    grid.set_axis_labels("logit spread (std of the scores)", "normalised residual (dimensionless)")
    # the paper's Table 9 (1.67B checkpoint, layers 3-19) before / after the cast, as dotted lines per method colour
    table9 = {"rowsum_before_cast": {"stale": 1.1e-2, "consistent": 2.5e-3, "matched": 1.4e-7},
              "rowsum_after_cast": {"stale": 1.2e-2, "consistent": 3.9e-3, "matched": 2.7e-3}}
    palette = dict(zip(_methods(shown), sns.color_palette(n_colors=len(_methods(shown)))))
    for (_, metric), ax in grid.axes_dict.items():
        for method, value in table9.get(metric, {}).items():
            if method in palette:
                ax.axhline(value, color=palette[method], ls=":", lw=1)
    grid.figure.suptitle("Random-head sweep: distance from the softmax-gradient invariant (dotted: the paper's "
                         "Table 9 on a 1.67B checkpoint)", y=1.03)
    numbers = shown.groupby(["inputs", "method", "metric"], sort=False, as_index=False)["value"].max()
    return grid, numbers.rename(columns={"value": "max_over_spreads"})


# The kernel figure's reference shape: the paper's latency statements are at head dim 128; N = 8192 is the paper's
# training context.
REFERENCE_SHAPE = {"head_dim": 128, "seq_len": 8192, "causal": True}


def figure_kernel(kernel: pd.DataFrame):
    """Kernel throughput: TFLOP/s (FlashAttention's FLOP count) against N per method, forward and forward+backward,
    one panel per head dim, from the kernel table's ``latency`` rows (this run's or the recorded Hopper numbers).
    Numbers: every method at the reference shape, with cuDNN BF16's fwd+bwd time over its own (and the FA3-class
    baseline's, where it ran)."""
    import seaborn as sns

    _pyplot()
    latency = kernel[kernel["section"] == "latency"] if "section" in kernel else kernel.iloc[0:0]
    latency = latency.dropna(subset=["fwd_tflops", "fwd_bwd_tflops"], how="all") if not latency.empty else latency
    if latency.empty:  # no Hopper GPU ran the bench and nothing was recorded: say so in the figure's place
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "No kernel latency measured: no Hopper GPU ran the bench and no recorded numbers were given",
                ha="center", va="center", fontsize=9)
        return fig, pd.DataFrame(columns=["method", "head_dim", "seq_len", "causal", "fwd_bwd_ms"])
    long = latency.melt(id_vars=["method", "head_dim", "seq_len", "causal"], value_vars=["fwd_tflops", "fwd_bwd_tflops"],
                        var_name="pass", value_name="TFLOP/s")
    long["pass"] = long["pass"].map({"fwd_tflops": "forward", "fwd_bwd_tflops": "forward+backward"})
    long["head_dim"] = pd.to_numeric(long["head_dim"]).astype(int)
    long["mask"] = long["causal"].astype(str).isin(["True", "true", "1", "1.0"]).map({True: "causal",
                                                                                       False: "non-causal"})
    grid = sns.relplot(data=long, x="seq_len", y="TFLOP/s", hue="method", hue_order=_methods(long), style="mask",
                       col="head_dim", row="pass", kind="line", marker="o", errorbar=None, height=2.9, aspect=1.15)
    lengths = sorted(set(pd.to_numeric(long["seq_len"]).astype(int)))
    grid.set(xscale="log")
    for ax in grid.axes.flat:
        ax.minorticks_off()
        ax.set_xticks(lengths, [f"{n // 1024}K" for n in lengths])
    grid.set_titles("{row_name}, head dim {col_name}")
    grid.set_axis_labels("sequence length N (tokens)", "TFLOP/s")
    source = ", ".join(sorted(set(latency["source"].dropna().astype(str)))) if "source" in latency else ""
    grid.figure.suptitle(f"Kernel throughput ({source})" if source else "Kernel throughput", y=1.03, fontsize=9)
    ref = latency[(pd.to_numeric(latency["head_dim"]) == REFERENCE_SHAPE["head_dim"])
                  & (pd.to_numeric(latency["seq_len"]) == REFERENCE_SHAPE["seq_len"])
                  & latency["causal"].astype(str).isin(["True", "true", "1", "1.0"])]
    columns = [c for c in ("method", "head_dim", "seq_len", "causal", "fwd_ms", "fwd_bwd_ms", "fwd_tflops",
                           "fwd_bwd_tflops", "speedup_vs_cudnn_bf16", "speedup_vs_fa3_class", "error") if c in ref]
    numbers = ref[columns].copy()
    if "error" in numbers:
        if numbers["error"].isna().all():
            numbers = numbers.drop(columns="error")
        else:
            numbers["error"] = numbers["error"].fillna("").astype(str).str.slice(0, 60)
    return grid, numbers.reset_index(drop=True)


def figure_final(summaries: pd.DataFrame, evals: pd.DataFrame):
    """Figure 1 (right): validation loss and the downstream suite averages per method, as bars (mean over seeds;
    each seed a dot). Numbers: the same means."""
    import seaborn as sns

    plt = _pyplot()
    val = summaries[RUN_KEYS].assign(quantity="validation CE (nats/token)", value=summaries["val_ce"])
    downstream = evals[evals["metric"].str.endswith("_avg")][RUN_KEYS + ["metric", "value"]]
    downstream = downstream.rename(columns={"metric": "quantity"})
    downstream["quantity"] = downstream["quantity"] + " (%)"
    long = pd.concat([val, downstream], ignore_index=True)
    panels = list(dict.fromkeys(long["quantity"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels) + 0.6, 3.4), squeeze=False)
    for ax, quantity in zip(axes[0], panels):
        data = long[long["quantity"] == quantity]
        order = _methods(data)
        sns.barplot(data=data, x="method", y="value", order=order, errorbar=None, ax=ax, color="#9ecae1")
        sns.stripplot(data=data, x="method", y="value", order=order, ax=ax, color="black", size=3)
        ax.set_title(quantity, fontsize=9)
        ax.set_xlabel("attention method")
        ax.set_ylabel(quantity)
        ax.tick_params(axis="x", rotation=30)
        if quantity.startswith("validation"):
            low, high = data["value"].min(), data["value"].max()
            ax.set_ylim(low - 0.5 * (high - low + 0.01), high + 0.5 * (high - low + 0.01))
    sizes = ",".join(sorted(set(long["size"])))
    fig.suptitle(f"Figure 1 (right): final validation loss and downstream averages (ours: {sizes}; paper: 1.67B)",
                 fontsize=9)
    fig.tight_layout()
    numbers = long.groupby(["quantity", "method"], sort=False).agg(
        ours=("value", lambda v: v.mean(skipna=False)), seeds=("seed", "nunique"),
        our_scale=("size", lambda s: ",".join(sorted(set(s))))).reset_index()
    return fig, numbers


# The paper's context extension: the stale gap exceeds 0.01 only after about 19,000 steps.
GAP_THRESHOLD = 0.01


def figure_context_gap(metrics: pd.DataFrame):
    """Context extension: each method's validation-loss gap to BF16 over training steps (mean over seeds at each
    logged validation step). Numbers: per method, the first step where the gap exceeds 0.01 (the paper: stale after
    about 19,000 steps) and the gap at the last step."""
    import seaborn as sns

    plt = _pyplot()
    val = records(metrics, "val")
    means = val.groupby(["method", "step"], as_index=False)["loss"].mean()
    if "bf16" not in set(means["method"]):
        raise ValueError("the context-extension gap needs a bf16 run of the same variant")
    ref = means[means["method"] == "bf16"].set_index("step")["loss"]
    gaps = means[means["method"] != "bf16"].copy()
    gaps["gap to bf16"] = gaps["loss"] - gaps["step"].map(ref)
    gaps = gaps.dropna(subset=["gap to bf16"])
    fig, ax = plt.subplots(figsize=(7, 3.8))
    sns.lineplot(data=gaps, x="step", y="gap to bf16", hue="method", hue_order=_methods(gaps), marker="o", ax=ax)
    ax.axhline(GAP_THRESHOLD, color="grey", ls=":", lw=1)
    ax.set_xlabel("training step (context-extension phase)")
    ax.set_ylabel("validation CE − bf16's (nats/token)")
    ax.set_title("Context extension: gap to BF16 over steps (paper: stale > 0.01 only after ≈ 19,000 steps)",
                 fontsize=9)
    rows = []
    for method, run in gaps.sort_values("step").groupby("method", sort=False):
        above = run[run["gap to bf16"] > GAP_THRESHOLD]
        rows.append({"method": method, "first_step_gap_above_0.01": above["step"].min() if not above.empty else None,
                     "last_step": run["step"].max(), "gap_at_last_step": run["gap to bf16"].iloc[-1],
                     "paper": 19000.0 if method == "stale" else None})
    return fig, pd.DataFrame(rows)


def figure_effects(metrics: pd.DataFrame, window: int = GAIN_WINDOW, delta: str = "stale"):
    """Figure 4, left and middle: what the stale δ's error does to a step, measured on each run's own activations in
    its last attention layer (``residual`` records, models/instrument.py: delta_error_effects). Left: the shares of
    attention rows it sharpens and flattens over training. Middle: per QK channel, how consistently heads and
    sequences agree on the direction it pushes that channel's gain, at the last probe within the window.
    Numbers: per method, the mean sharpened/flattened shares and the median push consistency at that probe."""
    import seaborn as sns

    plt = _pyplot()
    found = records(metrics, "residual")
    if "sharpened" not in found:
        raise ValueError("the runs' residual records carry no sharpened/flattened shares (trained before "
                         "models/instrument.py: delta_error_effects was recorded)")
    found = found[(found["delta"] == delta) & found["sharpened"].notna()]
    found = in_window(last_layer_gains(found), window)
    fig, (left, middle) = plt.subplots(1, 2, figsize=(11, 3.8))
    shares = found.melt(id_vars=[*RUN_KEYS, "step"], value_vars=["sharpened", "flattened"], var_name="effect")
    sns.lineplot(data=shares, x="step", y="value", hue="method", hue_order=_methods(shares), style="effect",
                 errorbar=None, ax=left)
    left.set_xlabel("training step")
    left.set_ylabel("share of attention rows")
    left.set_title(f"rows the {delta}-δ error sharpens / flattens", fontsize=9)
    last = found.sort_values("step").groupby(RUN_KEYS, sort=False).tail(1)
    per_channel = last[[*RUN_KEYS, "push_consistency_per_channel"]].explode("push_consistency_per_channel")
    per_channel["channel"] = per_channel.groupby(RUN_KEYS, sort=False).cumcount()
    per_channel["consistency"] = per_channel["push_consistency_per_channel"].astype(float)
    sns.lineplot(data=per_channel, x="channel", y="consistency", hue="method", hue_order=_methods(per_channel),
                 errorbar=None, marker=".", ax=middle)
    middle.set_xlabel("QK channel")
    middle.set_ylabel("push consistency (0..1)")
    middle.set_title(f"per-channel push consistency of the {delta}-δ error (last probe, steps ≤ {window})", fontsize=9)
    fig.suptitle("Figure 4 (left, middle): the stale δ's error on each run's last attention layer", fontsize=10)
    fig.tight_layout()
    numbers = found.groupby(RUN_KEYS, sort=False)[["sharpened", "flattened"]].mean().reset_index()
    numbers = numbers.merge(last[[*RUN_KEYS, "push_consistency", "step"]], on=RUN_KEYS, how="left")
    return fig, numbers.rename(columns={"step": "push_read_at_step"}).assign(delta=delta)


def figure_recorded_run(metrics: pd.DataFrame, probes: pd.DataFrame | None, label: str):
    """A recorded GPU run: training loss per method, and (where it probed a checkpoint) Table 9's row-sum residual
    per attention layer before and after the dS cast. ``label`` (where and when it was recorded) is the title.
    Numbers: each method's final and peak training loss and its rise (the residuals are the section's probe table)."""
    import seaborn as sns

    plt = _pyplot()
    train = records(metrics, "train").sort_values("step")
    panels = 1 + (probes is not None)
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    sns.lineplot(data=train, x="step", y="loss", hue="method", hue_order=_methods(train), ax=axes[0, 0],
                 errorbar=None)
    axes[0, 0].set_xlabel("optimizer step")
    axes[0, 0].set_ylabel("training loss (nats/token)")
    axes[0, 0].set_title("training loss per method")
    numbers = loss_numbers(train)
    if probes is not None:
        long = probes.melt(id_vars=["layer", "delta"], value_vars=["before_cast", "after_cast"], var_name="when",
                           value_name="residual")
        long["series"] = long["delta"] + ", " + long["when"].str.replace("_", " ")
        sns.barplot(data=long, x="layer", y="residual", hue="series", ax=axes[0, 1], errorbar=None)
        axes[0, 1].set_yscale("log")
        axes[0, 1].set_xlabel("attention layer")
        axes[0, 1].set_ylabel("row-sum residual |Σ_j dS_ij| / Σ_j |dS_ij|")
        axes[0, 1].set_title("Table 9 on the probed checkpoint (paper, 1.67B: stale 1.1e-2, matched 1.4e-7)")
        sns.move_legend(axes[0, 1], "upper left", bbox_to_anchor=(1.01, 1), fontsize=7, title=None)
    fig.suptitle(label, fontsize=9)
    fig.tight_layout()
    return fig, numbers
