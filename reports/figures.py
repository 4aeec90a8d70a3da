"""The paper's figures redrawn from our runs (seaborn, Agg backend), each with a small table of the numbers the paper
states about it, beside ours.

- Figure 1: training loss curves per method (main size). Numbers: final and peak training loss.
- Figure 4: the last attention layer's largest key RMSNorm gain and its gain concentration over training.
- Figure 5: training loss and the largest QK-norm channel gain at two scales.
- Random-head sweep: row-sum residuals and key-gradient column sums against the logit spread.

Definitions of the stated numbers (ours; the paper reads them off its curves): ``final_train_loss`` is the mean
training loss over the last 10% of logged steps; ``peak_train_loss`` the largest logged loss after the first 10% (the
initial descent is no spike); ``k_gain_max`` and ``concentration`` the last attention layer's values at the last
logged step; ``gain_max`` the largest query or key channel gain of any layer at any logged step.
"""

from __future__ import annotations

import pandas as pd

from deltamatch.atomic import atomic_path
from deltamatch.reports.inputs import RUN_KEYS
from deltamatch.reports.paper import paper_values
from deltamatch.reports.tables import METHOD_ORDER, compare, paper_scale, seed_means

TAIL = 0.1


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
        rows += [(*keys, "final_train_loss", final), (*keys, "peak_train_loss", peak)]
    return pd.DataFrame(rows, columns=[*RUN_KEYS, "metric", "value"])


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
    numbers = seed_means(_with_scale(loss_numbers(train), scale_of), ["paper_scale", "method", "metric"])
    return fig, compare(numbers, paper_values(paper, "figure1"), ["paper_scale", "method", "metric"])


def figure_gain(metrics: pd.DataFrame, paper: pd.DataFrame, scale_of: dict[str, str]):
    """Figure 4: the last attention layer's largest key gain and its gain concentration over training."""
    import seaborn as sns

    _pyplot()  # selects the headless backend before seaborn draws
    gain = last_layer_gains(records(metrics, "gain"))
    long = gain.melt(id_vars=[*RUN_KEYS, "step"], value_vars=["k_gain_max", "concentration"], var_name="quantity")
    grid = sns.relplot(data=long, x="step", y="value", hue="method", hue_order=_methods(long), col="quantity",
                       kind="line", errorbar=None, facet_kws={"sharey": False}, height=3.6, aspect=1.1)
    grid.set_titles("{col_name}")
    grid.figure.suptitle("Figure 4: last attention layer (key gain, gain concentration)", y=1.04)
    final = gain.sort_values("step").groupby(RUN_KEYS, sort=False).tail(1)
    numbers = final.melt(id_vars=RUN_KEYS, value_vars=["k_gain_max", "concentration"], var_name="metric")
    numbers = seed_means(_with_scale(numbers, scale_of), ["paper_scale", "method", "metric"])
    return grid, compare(numbers, paper_values(paper, "figure4"), ["paper_scale", "method", "metric"])


def figure_scales(metrics: pd.DataFrame, paper: pd.DataFrame, scale_of: dict[str, str]):
    """Figure 5: training loss and the largest channel gain over training, one column per size."""
    import seaborn as sns

    train = records(metrics, "train").sort_values("step")
    train["value"] = smoothed(train, "loss")
    gain = records(metrics, "gain")
    gain["value"] = gain[["q_gain_max", "k_gain_max"]].max(axis=1)
    gain = gain.groupby([*RUN_KEYS, "step"], as_index=False)["value"].max()
    long = pd.concat([train[[*RUN_KEYS, "step", "value"]].assign(quantity="training loss"),
                      gain.assign(quantity="largest channel gain")], ignore_index=True)
    grid = sns.relplot(data=long, x="step", y="value", hue="method", hue_order=_methods(long), row="quantity",
                       col="size", kind="line", errorbar=None, facet_kws={"sharey": False}, height=3.2, aspect=1.2)
    grid.set_titles("{row_name}, {col_name}")
    grid.figure.suptitle("Figure 5: loss and gains at two scales", y=1.03)
    gain_max = gain.groupby(RUN_KEYS, as_index=False)["value"].max().assign(metric="gain_max")
    numbers = pd.concat([loss_numbers(records(metrics, "train")), gain_max], ignore_index=True)
    numbers = seed_means(_with_scale(numbers, scale_of), ["paper_scale", "method", "metric"])
    return grid, compare(numbers, paper_values(paper, "figure5"), ["paper_scale", "method", "metric"])


def figure_sweep(sweep: pd.DataFrame):
    """The random-head sweep: each residual measure against the logit spread, per input family and method."""
    import seaborn as sns

    shown = sweep[sweep["metric"].isin(["rowsum_before_cast", "rowsum_after_cast", "dk_colsum"])]
    grid = sns.relplot(data=shown, x="spread", y="value", hue="method", hue_order=_methods(shown), col="metric",
                       row="inputs", kind="line", marker="o", errorbar=None, height=3.0, aspect=1.1)
    grid.set(yscale="log")
    grid.set_titles("{row_name}: {col_name}")
    grid.figure.suptitle("Random-head sweep: distance from the softmax-gradient invariant", y=1.03)
    numbers = shown.groupby(["inputs", "method", "metric"], sort=False, as_index=False)["value"].max()
    return grid, numbers.rename(columns={"value": "max_over_spreads"})
