"""Reading the pipeline's outputs into tidy frames: one row per (run, metric) or per (run, step, ...).

The pipeline lays every per-run output out under the run tag ``<variant>/<size>/<method>/s<seed>``
(``results/<name>/runs/<tag>/summary.json``, ``results/<name>/evals/<tag>/<suite>.json``). The variant is read back
from that path; size, method and seed come from the files themselves (``summary.json``), or from the path where a file
does not carry them (eval results). A file outside that layout is a ``ValueError`` naming it.

Units follow the paper: accuracies and RULER scores in percent (lm-eval reports fractions), cross-entropies and
perplexities as they are.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

RUN_TAG = re.compile(r"(?P<variant>[^/]+)/(?P<size>[^/]+)/(?P<method>[^/]+)/s(?P<seed>\d+)")
RUN_KEYS = ["variant", "size", "method", "seed"]
# Metrics that are not fractions of correct answers: kept as they are, never shown in percent.
NOT_PERCENT = ("perplexity", "bits_per_byte", "loss", "ppl")


def run_tag(path: str | Path, anchor: str) -> dict[str, object]:
    """``variant``, ``size``, ``method``, ``seed`` from a path ``.../<anchor>/<variant>/<size>/<method>/s<seed>/...``."""
    text = Path(path).as_posix()
    match = re.search(rf"(?:^|/){anchor}/{RUN_TAG.pattern}(?:/|\.|$)", text)
    if match is None:
        raise ValueError(f"{path}: not under {anchor}/<variant>/<size>/<method>/s<seed>/ (the pipeline's layout)")
    tag = match.groupdict()
    tag["seed"] = int(tag["seed"])
    return tag


def _read_json(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"missing input file: {path}")
    return json.loads(path.read_text(encoding="utf-8"))


# Which kinds of mixer a run's ``backends`` record groups under each column: the linear-attention layers and the
# softmax-attention layers (the ones the method's attention runs in).
MIXERS = {"gdn_backend": ("gdn", "kda", "mamba2"), "attention_backend": ("gqa", "mla")}
SUMMARY_COLUMNS = [*RUN_KEYS, "val_ce", "steps", "tokens", "diverged_at_step", "wall_s", *MIXERS, "run_dir"]


def _backend(summary: dict, mixers: tuple[str, ...]) -> str:
    found = [b["backend"] for b in summary.get("backends", []) if b.get("mixer") in mixers]
    return ",".join(dict.fromkeys(found)) if found else "not recorded"


def load_summaries(paths: list[str]) -> pd.DataFrame:
    """One row per run: variant, size, method, seed, val_ce, steps, tokens, diverged_at_step (the step a run stopped
    at because its loss was not finite, else empty), wall_s (the trainer's wall time), gdn_backend and
    attention_backend (what trained each kind of mixer, from the run's ``backends``), run_dir."""
    rows = []
    for path in paths:
        summary = _read_json(path)
        tag = run_tag(path, "runs")
        for key in ("size", "method", "seed"):
            if key in summary and str(summary[key]) != str(tag[key]):
                raise ValueError(f"{path}: {key} {summary[key]!r} disagrees with its folder ({tag[key]!r})")
        if "final_val_loss" not in summary:
            raise ValueError(f"{path}: no final_val_loss")
        rows.append({**tag, "val_ce": float(summary["final_val_loss"]), "steps": summary.get("steps"),
                     "tokens": summary.get("tokens"), "diverged_at_step": summary.get("diverged_at_step"),
                     "wall_s": summary.get("wall_s"), "run_dir": str(Path(path).parent),
                     **{column: _backend(summary, mixers) for column, mixers in MIXERS.items()}})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _in_percent(metric: str) -> bool:
    return not any(word in metric for word in NOT_PERCENT)


def load_evals(paths: list[str]) -> pd.DataFrame:
    """Long rows: run keys, suite, metric, value. A task's averaged metric is named ``<task>``, any other reported
    metric ``<task>:<metric>``, the suite average ``<suite>_avg``."""
    rows = []
    for path in paths:
        result = _read_json(path)
        for key in ("suite", "tasks", "average"):
            if key not in result:
                raise ValueError(f"{path}: eval result has no {key!r}")
        tag, suite = run_tag(path, "evals"), result["suite"]
        averaged = result.get("metric_per_task", {})
        for task, metrics in result["tasks"].items():
            for metric, value in metrics.items():
                if value is None or isinstance(value, str):
                    continue
                name = task if averaged.get(task) == metric else f"{task}:{metric}"
                rows.append({**tag, "suite": suite, "metric": name,
                             "value": float(value) * (100.0 if _in_percent(metric) else 1.0)})
        if result["average"] is not None:
            rows.append({**tag, "suite": suite, "metric": f"{suite}_avg", "value": 100.0 * float(result["average"])})
    return pd.DataFrame(rows, columns=[*RUN_KEYS, "suite", "metric", "value"])


def load_metrics(summaries: pd.DataFrame, kinds: tuple[str, ...] = ("train", "gain", "val")) -> pd.DataFrame:
    """Every ``metrics.jsonl`` record of the given kinds beside each run's summary, with the run keys added.

    A resumed run may repeat steps it had logged before it was interrupted; the last record of a step wins.
    """
    frames = []
    for run in summaries.itertuples(index=False):
        path = Path(run.run_dir) / "metrics.jsonl"
        if not path.is_file():
            raise ValueError(f"missing input file: {path}")
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        frame = pd.DataFrame([r for r in records if r.get("kind") in kinds])
        if frame.empty:
            continue
        for key in RUN_KEYS:
            frame[key] = getattr(run, key)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=[*RUN_KEYS, "kind", "step"])
    frame = pd.concat(frames, ignore_index=True)
    dedup = [*RUN_KEYS, "kind", "step"] + [c for c in ("layer", "delta") if c in frame]
    return frame.drop_duplicates(subset=dedup, keep="last").reset_index(drop=True)


def _read_table(path: str, columns: set[str], what: str) -> pd.DataFrame:
    if not Path(path).is_file():
        raise ValueError(f"missing input file: {path}")
    frame = pd.read_csv(path)
    missing = columns - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: {what} table lacks columns {sorted(missing)}")
    return frame


def load_probes(path: str) -> pd.DataFrame:
    """Table 9 rows from ``dm-probe``: layer, delta, before_cast, after_cast, dk_colsum."""
    return _read_table(path, {"layer", "delta", "before_cast", "after_cast", "dk_colsum"}, "probe")


def load_sweep(path: str) -> pd.DataFrame:
    """The random-head sweep's long table: inputs, spread, method, metric, value."""
    return _read_table(path, {"inputs", "spread", "method", "metric", "value"}, "sweep")


# The first line under a dm-kernel-bench Markdown title: "date 2026-11-29 10:12 UTC, commit 6452f11, GPU NVIDIA H200,
# torch 2.11.0+cu130; ..." (kernels/bench.py writes it into kernel_bench.md and kernel_memory.md).
BENCH_HEADER = re.compile(
    r"^date (?P<date>[^,]+), commit (?P<commit>[^,]+), GPU (?P<gpu>[^,]+), torch (?P<torch>[^;,\s]+)", re.MULTILINE)


def bench_provenance(markdown: str | Path) -> dict[str, str]:
    """``date``, ``commit``, ``gpu``, ``torch`` from the header of a dm-kernel-bench Markdown file."""
    path = Path(markdown)
    if not path.is_file():
        raise ValueError(f"missing input file: {path} (the recorded numbers' date, commit and GPU)")
    match = BENCH_HEADER.search(path.read_text(encoding="utf-8"))
    if match is None:
        raise ValueError(f"{path}: no 'date ..., commit ..., GPU ..., torch ...' header line "
                         "(dm-kernel-bench writes one)")
    return {k: v.strip() for k, v in match.groupdict().items()}


def load_recorded_kernel(folder: str | Path) -> dict | None:
    """Kernel measurements a Hopper GPU recorded earlier (``kernel_bench.csv``/``.md``, ``kernel_memory.csv``/``.md``,
    ``kernel_profile.csv``/``.md`` as dm-kernel-bench writes them): ``{"bench", "memory", "profile", "provenance":
    {"bench", ...}}`` with each table's provenance read from its Markdown header (a table not recorded: None, no
    provenance); None when the folder holds no ``kernel_bench.csv``."""
    folder = Path(folder)
    found: dict = {"bench": None, "memory": None, "profile": None, "provenance": {}}
    for key, stem in (("bench", "kernel_bench"), ("memory", "kernel_memory"), ("profile", "kernel_profile")):
        if (folder / f"{stem}.csv").is_file():
            found[key] = pd.read_csv(folder / f"{stem}.csv")
            found["provenance"][key] = bench_provenance(folder / f"{stem}.md")
    return found if found["bench"] is not None else None


# What a recorded run's provenance.json must say: where, when, at which commit, and how it was run.
PROVENANCE_KEYS = ("date", "gpu", "commit", "config", "command")


@dataclass
class RecordedRun:
    """A pipeline run recorded earlier on another machine (a GPU), kept under ``benchmarks/results/``: its
    ``provenance.json`` and the pipeline's results folder beside it as ``results/`` (run summaries, metrics, probes,
    Snakemake's benchmark TSVs; no checkpoints)."""

    folder: Path
    provenance: dict
    runs: pd.DataFrame
    """``load_summaries`` rows of its runs."""
    probes: pd.DataFrame | None
    probe_size: str | None


def load_recorded_run(folder: str | Path) -> RecordedRun:
    """Read a recorded pipeline run (:class:`RecordedRun`); a folder without the provenance or the run summaries is a
    ``ValueError`` naming what is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"recorded run: no folder {folder}")
    provenance = _read_json(folder / "provenance.json")
    missing = [key for key in PROVENANCE_KEYS if not provenance.get(key)]
    if missing:
        raise ValueError(f"{folder / 'provenance.json'}: lacks {missing} (where, when and how the run was recorded)")
    root = folder / "results"
    paths = sorted(str(p) for p in root.glob("runs/*/*/*/s*/summary.json"))
    if not paths:
        raise ValueError(f"{root}: no runs/<variant>/<size>/<method>/s<seed>/summary.json")
    probed = sorted(root.glob("probes/*/*/*/s*.csv"))
    probes = load_probes(str(probed[0])) if probed else None
    return RecordedRun(folder, provenance, load_summaries(paths), probes,
                       run_tag(probed[0], "probes")["size"] if probed else None)
