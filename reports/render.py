"""One page, HTML and Markdown, from the report's table CSVs and figure PNGs: for each artefact the paper's claim,
our numbers beside the paper's with the difference, and the scale each side was measured at.

The page opens with where our numbers come from (``scale_note``, from the config) and, when any table compares ours
at another scale than the paper's, a plain sentence saying so.
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from deltamatch.atomic import write_text
from deltamatch.reports.paper import FLAGS, load_paper
from deltamatch.reports.tables import NO_HOPPER, RECORDED


@dataclass(frozen=True)
class Section:
    title: str
    """Heading on the page."""
    about: str
    """One paragraph: what the artefact is and what the paper measured it on."""
    claim_key: str
    """``artefact`` of the paper's claims shown in this section."""


SECTIONS: dict[str, Section] = {
    "main_1p67b": Section("Main table", "Validation cross-entropy, the evaluation suites and RULER per attention "
                          "method. Paper: 1.67B hybrid (18 GDN + 6 GQA), 30B Nemotron-CC tokens, two seeds. "
                          "commonsense_max_task_gap_to_bf16 is derived: the largest |matched − bf16| over the "
                          "commonsense tasks, in points, beside the paper's \"within one point\".", "main"),
    "scale": Section("Scale table", "Validation cross-entropy and suite averages at each model size. Paper: 569M, "
                     "1.67B and 5.29B.", "scale"),
    "figure1_loss": Section("Figure 1: training loss", "Training loss per method at the main size.", "figure1"),
    "figure4_gain": Section("Figure 4: gain concentration over training", "The last attention layer's largest key "
                            "RMSNorm gain and the share of the largest channel in Σ_c (g_q,c·g_k,c)². The paper's "
                            "over 99% is the share of a few channels, a different statistic: ours, one channel's "
                            "share, can only be smaller.", "figure4"),
    "figure5_scales": Section("Figure 5: gains and loss at two scales", "Training loss and the largest QK-norm "
                              "channel gain over training at two model sizes. Paper: 569M and 5.29B; ours stand beside "
                              "the paper scale named by the config's report.figure5_scale_of.", "figure5"),
    "table9_probes": Section("Table 9: row-sum residual per layer", "Normalised row-sum residual |Σ_j dS_ij| / "
                             "Σ_j |dS_ij| of each δ on one checkpoint's activations, before and after the dS cast, "
                             "and the key-gradient column-sum share. A model with a single attention layer shows it in both "
                             "summary rows.", "table9"),
    "ablations": Section("Ablations", "Validation cross-entropy of each variant and each method's gap to BF16 of "
                         "the same variant.", "ablations"),
    "kernel_latency": Section("Kernel", "Ahead-of-time build check of the Triton kernels (FP8 wgmma per matmul), "
                              "forward+backward latency and backward memory on a Hopper GPU, and (section paper) the "
                              "paper's kernel statements beside ours: Delta-Matching's fwd+bwd time over the BF16 "
                              "baselines' at head dim 128, and our backward's peak extra memory beside the paper's "
                              "B·H·N² dS workspace.", "kernel"),
    "sweep": Section("Random-head sweep", "Distance from the softmax-gradient invariant on random attention heads, "
                     "against the logit spread. The paper has no such experiment: beside the row-sum residuals stand "
                     "the orders of magnitude its Table 9 reports for the same measures on a trained 1.67B "
                     "checkpoint's activations (layers 3-19).", "sweep"),
}


def _number(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.2e}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.5g}"


def formatted(table: pd.DataFrame) -> pd.DataFrame:
    """Strings for the page: 5 significant digits, '—' for a missing value, '≈'/'≤'/'≥' where the paper is
    approximate or gives an upper or a lower bound; a missing note is left blank."""
    out = pd.DataFrame(index=table.index)
    for column in table.columns:
        if column in FLAGS:
            continue
        values = table[column]
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            out[column] = [("—" if v is None or (isinstance(v, float) and math.isnan(v)) else _number(float(v)))
                           for v in values]
        else:
            out[column] = [("" if column == "note" else "—") if pd.isna(v) else str(v) for v in values]
    for flag, mark in (("approx", "≈ "), ("bound", "≤ "), ("at_least", "≥ ")):
        if flag in table and "paper" in out:
            hit = table[flag].fillna(False).astype(bool) & table["paper"].notna()
            out.loc[hit, "paper"] = mark + out.loc[hit, "paper"]
    return out


def scale_sentence(tables: dict[str, pd.DataFrame]) -> str | None:
    """Say plainly when ours were measured at other scales than the paper's; None when every row matches."""
    pairs = set()
    for table in tables.values():
        if {"our_scale", "paper_scale", "ours", "paper"} <= set(table.columns):
            both = table.dropna(subset=["ours", "paper"])
            pairs |= {(o, p) for o, p in zip(both["our_scale"], both["paper_scale"]) if o != p}
    if not pairs:
        return None
    listed = "; ".join(f"ours at {o} beside the paper's {p}" for o, p in sorted(pairs))
    return (f"Our numbers were NOT measured at the paper's scale ({listed}). The differences below compare a "
            "miniature with the paper; read them as directions and orders of magnitude, not as a reproduction verdict.")


def kernel_sentence(table: pd.DataFrame | None) -> str | None:
    if table is None:
        return None
    if "status" in table and table["status"].astype(str).str.contains(NO_HOPPER).any():
        head = (f"{NO_HOPPER[0].upper()}{NO_HOPPER[1:]} on the machine that ran this pipeline: the build check below "
                "compiled the kernels ahead of time for sm_90a")
        sources = table["source"].dropna().astype(str) if "source" in table else pd.Series(dtype=str)
        recorded = sorted(set(sources[sources.str.contains(RECORDED)]))
        if recorded:
            return (f"{head}, and this run measured no latency or memory. The latency and memory numbers below were "
                    + "; ".join(recorded) + ".")
        return f"{head}, but no latency was measured."
    return None


def collect(inputs: list[str]) -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame], dict[str, Path]]:
    """Split the report's files into tables (tables/*.csv), figure numbers (figures/*.csv) and images (*.png)."""
    tables, numbers, images = {}, {}, {}
    for name in inputs:
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"missing input file: {path}")
        if path.suffix == ".png":
            images[path.stem] = path
        elif path.suffix == ".csv":
            target = numbers if path.parent.name == "figures" else tables
            target[path.stem] = pd.read_csv(path)
        else:
            raise ValueError(f"{path}: the report takes .csv tables and .png figures only")
    return tables, numbers, images


def _blocks(name, tables, numbers, images, claims):
    """(kind, payload) blocks of one section, in page order; kind is 'p', 'table' or 'img'."""
    section = SECTIONS.get(name, Section(name, "", name))
    blocks = [("h2", section.title), ("p", section.about)]
    for text in claims[claims["artefact"] == section.claim_key]["text"]:
        blocks.append(("claim", text))
    if name == "kernel_latency":
        sentence = kernel_sentence(tables.get(name))
        if sentence:
            blocks.append(("p", sentence))
    if name in images:
        blocks.append(("img", images[name]))
    for frame in (tables.get(name), numbers.get(name)):
        if frame is not None:
            blocks.append(("table", formatted(frame)))
    return blocks


def render(inputs: list[str], name: str, scale_note: str, html_path: str, markdown_path: str,
           paper_path: str | None = None) -> None:
    """Write the report page twice: ``html_path`` and ``markdown_path``."""
    tables, numbers, images = collect(inputs)
    _, claims, citation = load_paper(paper_path) if paper_path else load_paper()
    order = [n for n in SECTIONS if n in tables or n in numbers or n in images]
    order += sorted((set(tables) | set(numbers) | set(images)) - set(order))
    head = [("h1", f"deltamatch report: {name}"), ("note", scale_note.strip())]
    sentence = scale_sentence({**tables, **numbers})
    if sentence:
        head.append(("note", sentence))
    head.append(("p", "Columns: paper = the paper's value (≈ read off a figure, ≤ a bound it states); ours = mean "
                      "over our seeds; difference = ours − paper; paper_scale / our_scale = the model each side "
                      "was measured at; seeds = our runs in the mean. Accuracies and RULER scores are in percent."))
    blocks = head + [b for n in order for b in _blocks(n, tables, numbers, images, claims)]
    blocks += [("h2", "Citation"), ("pre", citation)]
    write_text(markdown_path, _markdown(blocks, Path(markdown_path).parent))
    write_text(html_path, _html(blocks, name, Path(html_path).parent))


def _markdown(blocks, base: Path) -> str:
    out = []
    for kind, payload in blocks:
        if kind == "h1":
            out.append(f"# {payload}")
        elif kind == "h2":
            out.append(f"## {payload}")
        elif kind == "note":
            out.append(f"> **{payload}**")
        elif kind == "claim":
            out.append(f"*Paper:* {payload}")
        elif kind == "img":
            out.append(f"![{payload.stem}]({os.path.relpath(payload, base)})")
        elif kind == "table":
            out.append(payload.to_markdown(index=False))
        elif kind == "pre":
            out.append(f"```bibtex\n{payload.strip()}\n```")
        else:
            out.append(payload)
    return "\n\n".join(out) + "\n"


def _html(blocks, name: str, base: Path) -> str:
    body = []
    for kind, payload in blocks:
        if kind == "table":
            body.append(payload.to_html(index=False, border=0, classes="numbers"))
        elif kind == "img":
            body.append(f'<img src="{html.escape(os.path.relpath(payload, base))}" alt="{payload.stem}">')
        elif kind == "pre":
            body.append(f"<pre>{html.escape(payload.strip())}</pre>")
        else:
            tag = {"h1": "h1", "h2": "h2", "note": 'p class="note"', "claim": 'p class="claim"'}.get(kind, "p")
            prefix = "<b>Paper:</b> " if kind == "claim" else ""
            body.append(f"<{tag}>{prefix}{html.escape(payload)}</{tag.split()[0]}>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
             ".note{background:#fff3cd;border-left:4px solid #e0a800;padding:.6em}.claim{color:#555}"
             "table.numbers{border-collapse:collapse;font-size:90%;margin:1em 0}"
             "table.numbers td,table.numbers th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
             "img{max-width:100%}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>deltamatch report: {html.escape(name)}"
            f"</title><style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
