"""The claims table at the top of the report: each of the paper's statements, its value, ours, where each side was
measured, and a verdict.

A claim (``claims`` in ``paper_reported.yaml``) is checked by the function registered here under its ``id``; the check
reads only the report's own tables (the CSVs of ``tables.py`` and the figures' numbers), so a claim's "ours" is always
a number the page shows elsewhere. Verdicts:

- ``reproduced``: measured at the paper's scale (or on the paper's hardware class) and agreeing;
- ``consistent at smaller scale``: measured below the paper's scale, pointing the same way by the stated rule;
- ``consistent on other hardware``: a kernel statement checked on another Hopper GPU than the paper's;
- ``not seen at smaller scale``: measured below the paper's scale, not pointing the same way (no contradiction:
  the paper's effects grow with scale and training length);
- ``contradicted``: measured at the paper's scale and disagreeing;
- ``not comparable``: ours is another quantity than the paper's (the ``why`` says which);
- ``not measured here``: this configuration has no run or measurement for it.

Every verdict comes with ``why``: the rule applied and the numbers it used. One seed gives no seed-to-seed spread,
so the tolerances below are stated, not estimated.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

REPRODUCED = "reproduced"
SMALLER = "consistent at smaller scale"
OTHER_HARDWARE = "consistent on other hardware"
NOT_SEEN = "not seen at smaller scale"
CONTRADICTED = "contradicted"
NOT_COMPARABLE = "not comparable"
NOT_MEASURED = "not measured here"
VERDICTS = (REPRODUCED, SMALLER, OTHER_HARDWARE, NOT_SEEN, CONTRADICTED, NOT_COMPARABLE, NOT_MEASURED)

PAPER_SIZES = ("569M", "1.67B", "5.29B", "2.58B-gqa")
# |matched − bf16| validation CE counted as parity: the paper's largest |gap| (0.0025 nats) at its scales; at smaller
# scales (short runs, one seed) 0.01 nats.
PARITY_TOL = {"paper": 0.0025, "smaller": 0.01}
# A loss "climbs" when its rise (final value minus its lowest 10%-window mean after the first 10% of steps) exceeds
# BF16's rise on the same batches by this much.
CLIMB = 0.05
# A gain "runs away" when stale's largest key gain is this many times BF16's; "stays near 1" within this factor.
RUNAWAY, NEAR = 1.5, 1.2

Tables = dict[str, pd.DataFrame]
CHECKS: dict[str, Callable[[Tables], tuple[str, str, str, str]]] = {}


def check(claim_id: str):
    """Register the check of one claim: ``f(tables) -> (ours, our_scale, verdict, why)``."""
    def register(fn):
        CHECKS[claim_id] = fn
        return fn
    return register


def _fmt(value: float, signed: bool = False) -> str:
    if pd.isna(value):
        return "NaN"
    text = f"{value:.2e}" if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5) else f"{value:.4g}"
    return f"+{text}" if signed and value > 0 else text


def _at_paper_scale(scales) -> bool:
    return any(str(s) in PAPER_SIZES for s in scales)


def _verdict(ok: bool, scales) -> str:
    if _at_paper_scale(scales):
        return REPRODUCED if ok else CONTRADICTED
    return SMALLER if ok else NOT_SEEN


def _ours(table: pd.DataFrame | None, **keys) -> pd.DataFrame:
    """The rows of ``table`` with our number matching ``keys`` (empty when the table is absent)."""
    if table is None or "ours" not in table:
        return pd.DataFrame(columns=["ours", "our_scale"])
    nan = table.get("ours_note", pd.Series("", index=table.index)).fillna("").astype(str).str.startswith("NaN")
    rows = table[table["ours"].notna() | nan]  # a NaN we measured counts; a row we did not measure does not
    for key, value in keys.items():
        if key not in rows:
            return rows.iloc[0:0]
        rows = rows[rows[key].isin(value if isinstance(value, (list, tuple, set)) else [value])]
    return rows


def _per_scale(table: pd.DataFrame | None, metric: str, method: str) -> dict[str, float]:
    rows = _ours(table, metric=metric, method=method)
    return {str(s): float(v) for s, v in zip(rows["our_scale"], rows["ours"])}


def _gaps(tables: Tables, method: str) -> dict[str, float]:
    """method − bf16 validation CE per our size (scale table, else the main table)."""
    table = tables.get("scale", tables.get("main_1p67b"))
    ce, ref = _per_scale(table, "val_ce", method), _per_scale(table, "val_ce", "bf16")
    return {s: ce[s] - ref[s] for s in ce if s in ref}


def _listed(values: dict[str, float], signed=True) -> str:
    return "; ".join(f"{_fmt(v, signed)} ({s})" for s, v in values.items())


@check("parity")
def _parity(tables):
    gaps = _gaps(tables, "matched")
    if not gaps:
        return "", "", NOT_MEASURED, "no matched and bf16 runs of one size"
    ok = all(abs(g) <= PARITY_TOL["paper" if s in PAPER_SIZES else "smaller"] for s, g in gaps.items())
    why = (f"|matched − bf16| ≤ {PARITY_TOL['paper']} at the paper's sizes, ≤ {PARITY_TOL['smaller']} below them "
           "(one seed: its spread is not measured)")
    return f"matched − bf16 val CE {_listed(gaps)}", ",".join(gaps), _verdict(ok, gaps), why


@check("stale_gap_grows")
def _stale_gap(tables):
    gaps = _gaps(tables, "stale")
    if len(gaps) < 2:
        ours = f"stale − bf16 val CE {_listed(gaps)}" if gaps else ""
        return ours, ",".join(gaps), NOT_MEASURED, "growth needs two or more sizes; this run has " + (
            "one" if gaps else "none")
    ordered = sorted(gaps, key=lambda s: PAPER_SIZES.index(s) if s in PAPER_SIZES else -1)
    ok = all(gaps[a] < gaps[b] for a, b in zip(ordered, ordered[1:]))
    return (f"stale − bf16 val CE {_listed({s: gaps[s] for s in ordered})}", ",".join(ordered), _verdict(ok, gaps),
            "the gap grows from each size to the next")


@check("consistent_partial")
def _consistent(tables):
    cons, stale = _gaps(tables, "consistent"), _gaps(tables, "stale")
    sizes = [s for s in cons if s in stale]
    if not sizes:
        return "", "", NOT_MEASURED, "no consistent, stale and bf16 runs of one size"
    ok = all(0 < cons[s] < stale[s] for s in sizes)
    ours = f"consistent − bf16 {_listed({s: cons[s] for s in sizes})}; stale − bf16 {_listed({s: stale[s] for s in sizes})}"
    return ours, ",".join(sizes), _verdict(ok, sizes), "0 < consistent's gap < stale's gap"


def _figure_value(tables, name, metric, method):
    rows = _ours(tables.get(name), metric=metric, method=method)
    return (float(rows["ours"].iloc[0]), str(rows["our_scale"].iloc[0])) if not rows.empty else (None, None)


@check("stale_climbs")
def _stale_climbs(tables):
    rise = {m: _figure_value(tables, "figure1_loss", "train_loss_rise", m) for m in ("stale", "bf16", "matched")}
    if rise["stale"][0] is None or rise["bf16"][0] is None:
        return "", "", NOT_MEASURED, "no stale and bf16 training curves"
    ok = rise["stale"][0] - rise["bf16"][0] > CLIMB
    ours = "final − lowest 10%-window training loss: " + "; ".join(
        f"{m} {_fmt(v, True)}" for m, (v, _) in rise.items() if v is not None)
    return ours, rise["stale"][1], _verdict(ok, [rise["stale"][1]]), (
        f"stale's rise exceeds bf16's by > {CLIMB} (the runs share their batches, so batch-to-batch noise cancels)")


@check("cudnn_spike")
def _cudnn(tables):
    peak, scale = _figure_value(tables, "figure1_loss", "peak_train_loss", "cudnn_fp8")
    final, _ = _figure_value(tables, "figure1_loss", "final_train_loss", "cudnn_fp8")
    if peak is None or final is None:
        return "", "", NOT_MEASURED, "no cudnn_fp8 run (it needs cuDNN's FP8 attention on a Hopper GPU)"
    ok = peak > 2 * final
    return (f"cudnn_fp8 peak {_fmt(peak)}, final {_fmt(final)}", scale, _verdict(ok, [scale]),
            "a spike: the peak after the first 10% of steps exceeds twice the final loss")


@check("table9_residuals")
def _table9(tables):
    table = tables.get("table9_probes")
    rows = _ours(table, metric="before_cast")
    if rows.empty:
        return "", "", NOT_MEASURED, "no probe of a checkpoint"
    summary = rows[rows["layers"] == "all_but_last"] if (rows["layers"] == "all_but_last").any() else rows
    by = summary.groupby("method")["ours"].max()
    if not {"stale", "consistent", "matched"} <= set(by.index):
        return "", "", NOT_MEASURED, "the probe lacks a δ kind"
    ok = by["stale"] > by["consistent"] > by["matched"] and by["matched"] < 1e-5
    scale = str(summary["our_scale"].iloc[0])
    ours = "; ".join(f"{m} {_fmt(by[m])}" for m in ("stale", "consistent", "matched"))
    return (ours, f"{scale} checkpoint", _verdict(ok, [scale]),
            "stale > consistent > matched before the cast, matched below 1e-5 (largest over the layers shown)")


@check("gain_runaway")
def _gain_runaway(tables):
    gains = {m: _figure_value(tables, "figure4_gain", "k_gain_max", m) for m in ("stale", "bf16", "matched")}
    if gains["stale"][0] is None or gains["bf16"][0] is None:
        return "", "", NOT_MEASURED, "no gain records of stale and bf16 runs"
    stale, bf16 = gains["stale"][0], gains["bf16"][0]
    matched = gains["matched"][0]
    ok = stale >= RUNAWAY * bf16 and (matched is None or matched <= NEAR * bf16)
    ours = "largest key gain, last attention layer: " + "; ".join(
        f"{m} {_fmt(v)}" for m, (v, _) in gains.items() if v is not None)
    return (ours, gains["stale"][1], _verdict(ok, [gains["stale"][1]]),
            f"stale ≥ {RUNAWAY}× bf16 and matched ≤ {NEAR}× bf16, read in the step window of Figure 4")


@check("concentration")
def _concentration(tables):
    share, scale = _figure_value(tables, "figure4_gain", "concentration", "stale")
    if share is None:
        return "", "", NOT_MEASURED, "no gain records of a stale run"
    if share >= 0.99:
        return f"stale: largest channel's share {_fmt(share)}", scale, _verdict(True, [scale]), \
            "one channel's share ≥ 0.99 implies a few channels' share ≥ 0.99"
    return (f"stale: largest channel's share {_fmt(share)}", scale, NOT_COMPARABLE,
            "ours is one channel's share, a lower bound on the paper's few-channel share; below 0.99 it neither "
            "confirms nor refutes it")


@check("gains_bounded_small")
def _gains_small(tables):
    rows = _ours(tables.get("figure5_scales"), metric="gain_max")
    if rows.empty:
        return "", "", NOT_MEASURED, "no gain records"
    top = rows.groupby("method")["ours"].max()
    ok = bool((top <= 1.7).all())
    scales = sorted(set(rows["our_scale"].astype(str)))
    return ("largest channel gain: " + "; ".join(f"{m} {_fmt(v)}" for m, v in top.items()), ",".join(scales),
            _verdict(ok, scales), "every method's largest gain ≤ 1.7 (the paper's 569M range) in the step window")


@check("downstream_drop")
def _downstream(tables):
    table = tables.get("scale")
    found = []
    for metric in ("ruler_8k", "commonsense_avg"):
        stale, bf16 = _per_scale(table, metric, "stale"), _per_scale(table, metric, "bf16")
        found += [(metric, s, stale[s] - bf16[s]) for s in stale if s in bf16]
    if not found:
        return "", "", NOT_MEASURED, "no RULER-8K or commonsense evaluation of stale and bf16 runs (needs Hub data)"
    ok = all(d < -5 for _, _, d in found)
    scales = sorted({s for _, s, _ in found})
    return ("; ".join(f"{m} stale − bf16 {_fmt(d, True)} ({s})" for m, s, d in found), ",".join(scales),
            _verdict(ok, scales), "stale more than 5 points below bf16")


@check("commonsense_within_one")
def _within_one(tables):
    value, scale = _figure_value(tables, "main_1p67b", "commonsense_max_task_gap_to_bf16", "matched")
    if value is None:
        return "", "", NOT_MEASURED, "no commonsense evaluation of matched and bf16 (needs Hub data)"
    return f"largest |matched − bf16| over tasks {_fmt(value)} points", scale, _verdict(value <= 1.0, [scale]), \
        "every task within 1 point"


def _variants(tables: Tables) -> set[str]:
    table = tables.get("ablations")
    return set(_ours(table)["variant"]) if table is not None and "variant" in table else set()


@check("ablation_gaps")
def _ablations(tables):
    table, wanted = tables.get("ablations"), {"no_qk_norm", "nope", "head_dim_256", "mla", "kda"}
    present = _variants(tables) & wanted
    if not present:
        return "", "", NOT_MEASURED, "none of the variants no_qk_norm, nope, head_dim_256, mla, kda ran"
    gaps = _ours(table, metric="ce_gap_to_bf16", variant=sorted(present))
    ours = "; ".join(f"{v} {m} {_fmt(g, True)}" for v, m, g in zip(gaps["variant"], gaps["method"], gaps["ours"]))
    return ours, ",".join(sorted(set(gaps["our_scale"].astype(str)))), NOT_COMPARABLE, \
        "several statements; read them in the Ablations table"


@check("context_extension")
def _context(tables):
    gap = tables.get("context_gap")
    if gap is None or "stale" not in set(gap.get("method", [])):
        return "", "", NOT_MEASURED, "no context-extension runs of stale and bf16 (report.context_variant)"
    row = gap.set_index("method").loc["stale"]
    first = row["first_step_gap_above_0.01"]
    ours = (f"stale gap > 0.01 first at step {int(first)}" if pd.notna(first) else
            f"stale gap ≤ 0.01 through step {int(row['last_step'])}") + f" (gap at the end {_fmt(row['gap_at_last_step'], True)})"
    return ours, "", NOT_COMPARABLE, ("the step the gap crosses 0.01 depends on the phase's length, learning rate "
                                      "and scale; read the curve in the context-extension section")


@check("gqa_mamba2")
def _gqa_mamba2(tables):
    present = _variants(tables) & {"gqa", "mamba2"}
    if not present:
        return "", "", NOT_MEASURED, "no gqa or mamba2 variant in this configuration"
    return "see the gains table", "", NOT_COMPARABLE, "gain corruption is read per variant in the gains table"


@check("muon")
def _muon(tables):
    if "muon" not in _variants(tables):
        return "", "", NOT_MEASURED, "no muon variant in this configuration"
    gap = _ours(tables.get("ablations"), metric="ce_gap_to_bf16", variant="muon", method="matched")
    if gap.empty:
        return "", "", NOT_MEASURED, "no matched and bf16 muon runs"
    value, scale = float(gap["ours"].iloc[0]), str(gap["our_scale"].iloc[0])
    ok = abs(value) <= PARITY_TOL["paper" if scale in PAPER_SIZES else "smaller"]
    return f"matched − bf16 {_fmt(value, True)}", scale, _verdict(ok, [scale]), "parity tolerance as above"


def _kernel_ratio(tables, baseline):
    rows = _ours(tables.get("kernel_latency"), section="paper", metric=f"fwd_bwd_ms_over_{baseline}_hd128")
    return rows


def _factored(tables, column: str) -> str:
    """matched_factored's (the CUDA kernels') fwd+bwd time over a baseline's at head dim 128, from the latency rows'
    ``column`` (that baseline's time over ours), as text to follow the claim's numbers; "" where not measured."""
    table = tables.get("kernel_latency")
    if table is None or not {"section", "method", "head_dim", column} <= set(table):
        return ""
    rows = table[(table["section"] == "latency") & (table["method"] == "matched_factored")
                 & (table["head_dim"] == 128)][column].dropna()
    if rows.empty:
        return ""
    return f"; matched_factored (the CUDA kernels) {_fmt((1 / rows).min())}–{_fmt((1 / rows).max())}×"


def _latency_claim(tables, rows, baseline: str, column: str, holds, why: str):
    """A latency claim read from matched's fwd+bwd time over ``baseline``'s (``rows``, one a shape): the range, the
    GPU, and the verdict — it holds where ``holds`` is true of every ratio (reproduced on an H100, consistent on other
    hardware), else contradicted; matched_factored's range (``column``) follows."""
    lo, hi = rows["ours"].min(), rows["ours"].max()
    gpu = str(rows["our_scale"].iloc[0])
    verdict = (REPRODUCED if "H100" in gpu else OTHER_HARDWARE) if bool(holds(rows["ours"]).all()) else CONTRADICTED
    return (f"matched / {baseline} fwd+bwd time {_fmt(lo)}–{_fmt(hi)} over {len(rows)} shapes"
            + _factored(tables, column), gpu, verdict, why)


@check("slower_than_cudnn")
def _slower(tables):
    rows = _kernel_ratio(tables, "sdpa_cudnn_bf16")
    if rows.empty:
        return "", "", NOT_MEASURED, "no kernel latency (needs a Hopper GPU or recorded measurements)"
    return _latency_claim(tables, rows, "cuDNN BF16", "speedup_vs_cudnn_bf16", lambda r: r >= 1,
                          "ratio ≥ 1 at every measured head-dim-128 shape")


@check("faster_than_fa3")
def _fa3(tables):
    rows = _kernel_ratio(tables, "fa3_bf16")
    flash = _kernel_ratio(tables, "sdpa_flash_bf16")
    if rows.empty:
        ours = ""
        if not flash.empty:
            ours = (f"no FA3-class run; beside PyTorch's flash BF16 (FA2) matched takes "
                    f"{_fmt(flash['ours'].min())}–{_fmt(flash['ours'].max())}× its time")
        return ours, str(flash["our_scale"].iloc[0]) if not flash.empty else "", NOT_MEASURED, \
            "the FA3-class baseline (flash-attn-4's CuTe-DSL kernels, FlashAttention-3's design) did not run"
    return _latency_claim(tables, rows, "FA3-class BF16", "speedup_vs_fa3_class", lambda r: r < 1,
                          "ratio < 1 at every measured head-dim-128 shape; FA3-class: flash-attn-4's CuTe-DSL sm90 "
                          "kernels (FlashAttention-3's Hopper design); ours are this harness's kernels, not the paper's")


@check("ds_workspace")
def _workspace(tables):
    rows = _ours(tables.get("kernel_latency"), section="paper", metric="backward_extra_gib")
    if rows.empty:
        return "", "", NOT_MEASURED, "no kernel memory measurement"
    ours = "; ".join(f"{_fmt(v)} GiB at N={int(n)}" for v, n in zip(rows["ours"], rows["seq_len"]))
    return (f"matched backward peak extra memory {ours}", str(rows["our_scale"].iloc[0]), NOT_COMPARABLE,
            "our kernel keeps O(B·H·N) extra memory (no N×N workspace); the statement is the kernel repository's, "
            "not the paper's")


def claims_table(claims: pd.DataFrame, tables: Tables) -> pd.DataFrame:
    """One row per claim: id, claim, source, paper, paper_scale, ours, our_scale, verdict, why, section."""
    rows = []
    for claim in claims.itertuples(index=False):
        if claim.id not in CHECKS:
            raise ValueError(f"paper claim {claim.id!r} has no check in reports/claims.py")
        ours, our_scale, verdict, why = CHECKS[claim.id](tables)
        rows.append({"id": claim.id, "claim": claim.text, "source": claim.source, "paper": claim.paper,
                     "paper_scale": claim.scale, "ours": ours, "our_scale": our_scale, "verdict": verdict,
                     "why": why, "section": claim.artefact})
    return pd.DataFrame(rows)
