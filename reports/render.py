"""One page, HTML and Markdown, from the report's table CSVs and figure PNGs.

The page opens with where our numbers come from (``scale_note``, from the config), then the claims table
(``claims.py``: each of the paper's statements, its value and ours, the scale and hardware of each, a verdict), then a
table of contents, then one section per artefact: the training results first (main, scale, Figures 1/4/5, gains,
Table 9, ablations), then the random-head sweep, then the kernel. The HTML is self-contained (figures are embedded
as base64 data URIs, long tables are folded and also offered as CSV downloads), so it can be mailed or attached as one
file. The kernel section shows a throughput figure, the reference shape, memory and each method's GPU time by kernel
as small tables; its full table is a linked CSV.

Cells: a number the paper does not give reads "not in paper"; one we did not measure "not measured" (or the reason
``ours_note`` gives); a NaN we measured "NaN (why)"; a difference between unlike statistics or scales "not
comparable (scale|bound|statistic)".
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from deltamatch.atomic import atomic_path, write_text
from deltamatch.reports import artefacts
from deltamatch.reports.artefacts import parts_of
from deltamatch.reports.claims import VERDICTS, claims_table
from deltamatch.reports.paper import FLAGS, load_paper
from deltamatch.reports.tables import NO_HOPPER, RECORDED

# Columns that say what a row is about, not what was measured: empty reads as "any" / "none", not as NaN.
KEY_COLUMNS = {"seeds", "seq_len", "head_dim", "heads", "batch", "causal", "spread", "layer", "window"}
# Tables longer than this are folded on the HTML page (and offered as CSV); the Markdown shows them whole.
FOLD_ROWS = 24


@dataclass(frozen=True)
class Section:
    title: str
    """Heading on the page."""
    about: str
    """One paragraph: what the artefact is and what the paper measured it on."""
    claim_key: str
    """``artefact`` of the paper's claims shown in this section."""
    parts: tuple[str, ...] = ()
    """Further table/figure stems shown in this section (beyond the section's own name)."""


def sections() -> dict[str, Section]:
    """The page's sections in order, from the artefact registry (``artefacts.ARTEFACTS``): one per artefact that heads
    one, with the stems shown beside it."""
    return {a.name: Section(a.title, a.about, a.claim_key, parts_of(a.name))
            for a in artefacts.ARTEFACTS if a.heads_section}
VERDICT_COLOURS = {"reproduced": "#d4edda", "consistent at smaller scale": "#e2f0d9",
                   "consistent on other hardware": "#e2f0d9", "not seen at smaller scale": "#fff3cd",
                   "contradicted": "#f8d7da", "not comparable": "#e9ecef", "not measured here": "#f1f3f5"}


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if float(value).is_integer() and abs(value) < 1e12:  # counts (steps, tokens) exactly, never rounded
        return str(int(value))
    return f"{value:.2e}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.5g}"


def _note(table: pd.DataFrame, column: str) -> pd.Series:
    return table[column].fillna("").astype(str) if column in table else pd.Series("", index=table.index)


def formatted(table: pd.DataFrame) -> pd.DataFrame:
    """Strings for the page: 5 significant digits; '≈'/'≤'/'≥' where the paper is approximate or gives an upper or a
    lower bound; ``paper`` empty reads "not in paper", ``ours`` empty "not measured" (or ``ours_note``'s reason), a
    NaN we measured "NaN (reason)", a difference left out ``difference_note``'s "not comparable (...)"; any other
    missing number "NaN". Never a dash: a blank cell would hide which of these it is."""
    out = pd.DataFrame(index=table.index)
    ours_note, diff_note = _note(table, "ours_note"), _note(table, "difference_note")
    for column in table.columns:
        if column in FLAGS or column in ("ours_note", "difference_note"):
            continue
        values = table[column]
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            cells = []
            for i, v in values.items():
                missing = v is None or (isinstance(v, float) and math.isnan(v))
                if not missing:
                    cells.append(_number(float(v)))
                elif column == "paper":
                    cells.append("not in paper")
                elif column == "ours":
                    note = ours_note[i]
                    cells.append(f"NaN ({note})" if note.startswith("NaN") else (note or "not measured"))
                elif column == "difference":
                    cells.append(diff_note[i])
                else:
                    cells.append("" if column in KEY_COLUMNS else "NaN")
            out[column] = cells
        else:
            out[column] = ["" if pd.isna(v) else str(v) for v in values]
    for flag, mark in (("approx", "≈ "), ("bound", "≤ "), ("at_least", "≥ ")):
        if flag in table and "paper" in out:
            hit = table[flag].fillna(False).astype(bool) & table["paper"].notna()
            out.loc[hit, "paper"] = mark + out.loc[hit, "paper"]
    empty = [c for c in out.columns if c not in ("paper", "ours") and (out[c] == "").all()]
    return out.drop(columns=empty)


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
    return (f"Our numbers were NOT measured at the paper's scale ({listed}). Differences are computed only where "
            "the statistic and the scale match; read the rest as directions and orders of magnitude, not as a "
            "reproduction verdict.")


def kernel_sentence(table: pd.DataFrame | None) -> str | None:
    if table is None:
        return None
    if "status" in table and table["status"].astype(str).str.contains(NO_HOPPER).any():
        head = (f"{NO_HOPPER[0].upper()}{NO_HOPPER[1:]} on the machine that ran this pipeline: the build check "
                "compiled the kernels ahead of time for sm_90a")
        sources = table["source"].dropna().astype(str) if "source" in table else pd.Series(dtype=str)
        recorded = sorted(set(sources[sources.str.contains(RECORDED)]))
        if recorded:
            return (f"{head}, and this run measured no latency or memory. The latency and memory numbers below were "
                    + "; ".join(recorded) + ".")
        return f"{head}, but no latency was measured."
    return None


def build_sentence(table: pd.DataFrame) -> str | None:
    """The kernel build check in one sentence: how many kernels, and whether every matmul is an FP8 wgmma."""
    build = table[table["section"] == "build"] if "section" in table else table.iloc[0:0]
    if build.empty:
        return None
    ok = build["ok"].astype(str).eq("True").sum() if "ok" in build else None
    text = f"Build check: {len(build)} kernels compiled ahead of time for sm_90a"
    if ok is not None:
        text += f"; {ok} of {len(build)} pass (every matmul an FP8 wgmma where FP8, registers cover the SASS)"
    return text + "."


def collect(inputs: list[str]) -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame], dict[str, Path],
                                        dict[str, Path]]:
    """Split the report's files into tables (tables/*.csv), figure numbers (figures/*.csv), images (*.png), and the
    paths of the CSVs (for links)."""
    tables, numbers, images, paths = {}, {}, {}, {}
    for name in inputs:
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"missing input file: {path}")
        if path.suffix == ".png":
            images[path.stem] = path
        elif path.suffix == ".csv":
            target = numbers if path.parent.name == "figures" else tables
            target[path.stem] = pd.read_csv(path)
            paths[path.stem if target is tables else f"figures/{path.stem}"] = path
        else:
            raise ValueError(f"{path}: the report takes .csv tables and .png figures only")
    return tables, numbers, images, paths


PROFILE_TOP = 4
"""Kernels named per method in the page's profile summary (the full list is in the kernel table's CSV)."""


def profile_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The kernel table's ``profile`` rows, one line per method: its kernels' GPU time per fwd+bwd step and its
    :data:`PROFILE_TOP` longest kernels with their times (ms)."""
    rows = table[table["section"] == "profile"] if "section" in table else table.iloc[0:0]
    if rows.empty or "ms_per_step" not in rows:
        return pd.DataFrame(columns=["method", "ms_per_step", "longest_kernels"])
    rows = rows.dropna(subset=["ms_per_step"])
    out = []
    for method, kernels in rows.groupby("method", sort=False):
        kernels = kernels.sort_values("ms_per_step", ascending=False)
        out.append({"method": method, "ms_per_step": round(kernels["ms_per_step"].sum(), 3),  # CUPTI's µs
                    "longest_kernels": "; ".join(f"{k} {ms:.3f}" for k, ms in
                                                 zip(kernels["kernel"], kernels["ms_per_step"].head(PROFILE_TOP)))})
    return pd.DataFrame(out)


def _kernel_blocks(table: pd.DataFrame, numbers: pd.DataFrame | None, path: Path | None):
    blocks = []
    sentence = kernel_sentence(table)
    if sentence:
        blocks.append(("p", sentence))
    build = build_sentence(table)
    if build:
        blocks.append(("p", build))
    if numbers is not None and not numbers.empty:
        blocks += [("h3", "Reference shape: head dim 128, N = 8192, causal"), ("table", numbers)]
    memory = table[table["section"] == "memory"] if "section" in table else table.iloc[0:0]
    if not memory.empty:
        keep = [c for c in ("method", "seq_len", "heads", "head_dim", "causal", "peak_extra_backward_gib")
                if c in memory]
        blocks += [("h3", "Backward memory (peak extra GiB, B = 1)"), ("table", memory[keep])]
    profile = profile_summary(table)
    if not profile.empty:
        blocks += [("h3", "GPU time of one fwd+bwd by kernel (ms; head dim 128, N = 8192, causal, B·H = 64; CUPTI)"),
                   ("table", profile)]
    paper = table[table["section"] == "paper"] if "section" in table else table.iloc[0:0]
    if not paper.empty:
        keep = [c for c in ("metric", "seq_len", "causal", "method", "paper", "ours", "difference", "paper_scale",
                            "our_scale", "note", "ours_note", "difference_note", *FLAGS) if c in paper]
        blocks += [("h3", "The paper's kernel statements (and its kernel repository's dS workspace) beside ours"), ("table", paper[keep])]
    if path is not None:
        blocks.append(("link", (path, f"Full kernel table ({len(table)} rows: build check, every shape and method)")))
    return blocks


def _blocks(name, tables, numbers, images, paths, claims):
    """(kind, payload) blocks of one section, in page order."""
    section = sections().get(name, Section(name, "", name))
    blocks = [("h2", (name, section.title)), ("p", section.about)]
    for text in claims[claims["artefact"] == section.claim_key]["text"]:
        blocks.append(("claim", text))
    stems = (name, *section.parts)
    for stem in stems:
        if stem in images:
            blocks.append(("img", images[stem]))
    if name == "kernel_latency" and name in tables:
        return blocks + _kernel_blocks(tables[name], numbers.get("kernel"), paths.get(name))
    source = recorded_source_of([tables[s] for s in stems if s in tables])
    if source:  # a recorded run's section: said once, above its figure, instead of on every row
        blocks.insert(2, ("note", f"These numbers were {source}."))
    for stem in stems:
        for frame, key in ((tables.get(stem), stem), (numbers.get(stem), f"figures/{stem}")):
            if frame is not None:
                frame = frame.drop(columns="source") if source and "source" in frame else frame
                blocks.append(("table", frame) if len(frame) <= FOLD_ROWS else ("fold", (frame, paths.get(key))))
    return blocks


def recorded_source_of(frames: list[pd.DataFrame]) -> str | None:
    """The one ``source`` of a section whose tables were all recorded elsewhere ("recorded on <GPU> on <date> at
    commit <c> ..., not measured by this run"); None when any row was measured by this run or sources differ."""
    sources = {str(v) for f in frames for v in (f["source"] if "source" in f else [None])}
    if len(sources) != 1:
        return None
    (source,) = sources
    return source if RECORDED in source else None


def render(inputs: list[str], name: str, scale_note: str, html_path: str, markdown_path: str,
           paper_path: str | None = None, claims_path: str | None = None) -> None:
    """Write the report page twice: ``html_path`` and ``markdown_path``; the claims table also to ``claims_path``."""
    tables, numbers, images, paths = collect(inputs)
    _, claims, citation = load_paper(paper_path) if paper_path else load_paper()
    verdicts = claims_table(claims, {**tables, **numbers})
    if claims_path:
        with atomic_path(claims_path) as tmp:
            verdicts.to_csv(tmp, index=False)
    shown = {*tables, *numbers, *images}
    page = sections()
    order = [n for n in page if n in shown]
    owned = {p for s in page.values() for p in s.parts}
    order += sorted(shown - set(order) - owned)
    head = [("h1", f"deltamatch report: {name}"), ("note", scale_note.strip())]
    sentence = scale_sentence({**tables, **numbers})
    if sentence:
        head.append(("note", sentence))
    head += [("h2", ("claims", "Claims: the paper's statements and ours")), ("p", verdict_summary(verdicts)),
             ("claims", verdicts),
             ("toc", [(n, page.get(n, Section(n, "", n)).title) for n in order]),
             ("p", "Columns: paper = the paper's value (≈ read off a figure, ≤ / ≥ a bound it states); ours = mean "
                   "over our seeds; difference = ours − paper, only where both are the same statistic at the same "
                   "scale; paper_scale / our_scale = the model (or GPU) each side was measured at; seeds = our runs "
                   "in the mean. Accuracies and RULER scores are in percent.")]
    blocks = head + [b for n in order for b in _blocks(n, tables, numbers, images, paths, claims)]
    blocks += [("h2", ("citation", "Citation")), ("pre", citation)]
    write_text(markdown_path, _markdown(blocks, Path(markdown_path).parent))
    write_text(html_path, _html(blocks, name, Path(html_path).parent))


def verdict_summary(verdicts: pd.DataFrame) -> str:
    """One sentence: how many claims got each verdict, in the order of ``claims.VERDICTS``."""
    counts = verdicts["verdict"].value_counts()
    parts = [f"{int(counts[v])} {v}" for v in VERDICTS if v in counts]
    return f"{len(verdicts)} claims: " + ", ".join(parts) + "."


def _claims_shown(verdicts: pd.DataFrame) -> pd.DataFrame:
    return verdicts[["claim", "source", "paper", "paper_scale", "ours", "our_scale", "verdict", "why"]]


def _markdown(blocks, base: Path) -> str:
    out = []
    for kind, payload in blocks:
        if kind == "h1":
            out.append(f"# {payload}")
        elif kind == "h2":
            out.append(f"## {payload[1]}")
        elif kind == "h3":
            out.append(f"### {payload}")
        elif kind == "note":
            out.append(f"> **{payload}**")
        elif kind == "claim":
            out.append(f"*Paper:* {payload}")
        elif kind == "img":
            out.append(f"![{payload.stem}]({os.path.relpath(payload, base)})")
        elif kind in ("table", "fold"):
            frame = payload if kind == "table" else payload[0]
            out.append(formatted(frame).to_markdown(index=False))
        elif kind == "claims":
            out.append(_claims_shown(payload).to_markdown(index=False))
        elif kind == "toc":
            out.append("\n".join(f"- [{title}](#{_slug(title)})" for _, title in payload))
        elif kind == "link":
            out.append(f"[{payload[1]}]({os.path.relpath(payload[0], base)})")
        elif kind == "pre":
            out.append(f"```bibtex\n{payload.strip()}\n```")
        else:
            out.append(payload)
    return "\n\n".join(out) + "\n"


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _csv_link(path: Path | None, text: str) -> str:
    if path is None:
        return ""
    return (f'<p class="link"><a download="{html.escape(path.name)}" href="{_data_uri(path, "text/csv")}">'
            f"{html.escape(text)}</a> (CSV, {html.escape(path.name)})</p>")


# A cell with more text than this wraps (left-aligned); shorter ones never break inside a word.
LONG_CELL = 18


def _table_html(frame: pd.DataFrame) -> str:
    shown = formatted(frame)

    def cell(tag: str, text: str) -> str:
        long = ' class="long"' if len(text) > LONG_CELL else ""
        return f"<{tag}{long}>{html.escape(text)}</{tag}>"

    head = "".join(cell("th", str(c)) for c in shown.columns)
    rows = "".join("<tr>" + "".join(cell("td", str(v)) for v in row) + "</tr>" for row in shown.itertuples(index=False))
    return f'<table class="numbers"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def key_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a long table that stay in view when it is folded: those with a paper value, validation CE, suite
    averages, a diverged run, and every NaN we measured (a NaN is never folded away)."""
    keep = pd.Series(False, index=frame.index)
    if "paper" in frame:
        keep |= frame["paper"].notna()
    if "metric" in frame:
        metric = frame["metric"].astype(str)
        keep |= metric.isin(["val_ce", "diverged_at_step"]) | metric.str.endswith("_avg")
    if "ours_note" in frame:
        keep |= frame["ours_note"].fillna("").astype(str).str.startswith("NaN")
    return frame[keep]


def _claims_html(verdicts: pd.DataFrame) -> str:
    rows = []
    for r in verdicts.itertuples(index=False):
        colour = VERDICT_COLOURS.get(r.verdict, "#fff")
        source = "" if r.source == "paper" else f'<br><span class="src">source: {html.escape(r.source)}</span>'
        anchor = next((n for n, s in sections().items() if s.claim_key == r.section), None)
        where = f' <a href="#{anchor}">§</a>' if anchor else ""
        rows.append(
            f"<tr><td class=\"text\">{html.escape(r.claim)}{source}{where}</td><td class=\"text\">{html.escape(r.paper)}"
            f"<br><span class=\"src\">{html.escape(r.paper_scale)}</span></td><td class=\"text\">"
            f"{html.escape(r.ours or 'not measured')}<br><span class=\"src\">"
            f"{html.escape(r.our_scale)}</span></td><td class=\"verdict\" style=\"background:{colour}\">"
            f"<b>{html.escape(r.verdict)}</b><br><span class=\"src\">{html.escape(r.why)}</span></td></tr>")
    return ('<table class="claims"><thead><tr><th>claim</th><th>paper (scale, hardware)</th><th>ours (scale)</th>'
            "<th>verdict (rule)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _html(blocks, name: str, base: Path) -> str:
    body = []
    for kind, payload in blocks:
        if kind == "table":
            body.append(_table_html(payload))
        elif kind == "fold":
            frame, path = payload
            key = key_rows(frame)
            if 0 < len(key) <= 2 * FOLD_ROWS:
                body.append(f"<p>The rows with a paper value, the averages and any NaN ({len(key)} of {len(frame)}):"
                            f"</p>{_table_html(key)}")
            body.append(f"<details><summary>All {len(frame)} rows (show)</summary>{_table_html(frame)}</details>"
                        + _csv_link(path, "the same table as CSV"))
        elif kind == "claims":
            body.append(_claims_html(payload))
        elif kind == "toc":
            items = "".join(f'<li><a href="#{anchor}">{html.escape(title)}</a></li>' for anchor, title in payload)
            body.append(f'<nav class="toc"><b>Contents</b><ol>{items}'
                        '<li><a href="#citation">Citation</a></li></ol></nav>')
        elif kind == "img":
            body.append(f'<img src="{_data_uri(payload, "image/png")}" alt="{html.escape(payload.stem)}">')
        elif kind == "link":
            body.append(_csv_link(*payload))
        elif kind == "pre":
            body.append(f"<pre>{html.escape(payload.strip())}</pre>")
        elif kind == "h2":
            body.append(f'<h2 id="{payload[0]}">{html.escape(payload[1])}</h2>')
        else:
            tag = {"h1": "h1", "h3": "h3", "note": 'p class="note"', "claim": 'p class="claim"'}.get(kind, "p")
            prefix = "<b>Paper:</b> " if kind == "claim" else ""
            body.append(f"<{tag}>{prefix}{html.escape(payload)}</{tag.split()[0]}>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.4}"
             ".note{background:#fff3cd;border-left:4px solid #e0a800;padding:.6em}.claim{color:#555}"
             "table{border-collapse:collapse;font-size:80%;margin:1em 0;max-width:100%}"
             "td,th{padding:2px 6px;border-bottom:1px solid #ddd;vertical-align:top}th{overflow-wrap:anywhere}"
             "table.numbers td{text-align:right;white-space:nowrap}"
             "table.numbers td.long,table.numbers th.long{white-space:normal;text-align:left;min-width:8em}"
             "table.claims td.text{text-align:left;overflow-wrap:anywhere}.src{color:#666;font-size:90%}"
             "table.claims td.verdict{min-width:11em}nav.toc{background:#f6f8fa;padding:.5em 1em}"
             "img{max-width:100%}details{margin:1em 0}pre{white-space:pre-wrap}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>deltamatch report: {html.escape(name)}"
            f"</title><style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
