"""One function per report artefact (named by its entry in ``artefacts.py``): loaded inputs in, a table or a figure out.

Tables return a frame; figures return ``(figure, numbers)``. The inputs arrive loaded (``Inputs``): ``dm-report`` reads
them from the files named on its command line, ``dm-report all`` from a results folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from deltamatch.reports import figures, tables
from deltamatch.reports.inputs import RecordedRun, load_metrics, load_recorded_kernel

METRIC_KINDS = ("train", "gain", "val", "residual")


@dataclass
class Inputs:
    """What an artefact's builder reads; only the groups its registry entry names are filled."""

    runs: pd.DataFrame | None = None
    """Run summaries (``load_summaries``); their ``metrics.jsonl`` is read beside them."""
    evals: pd.DataFrame | None = None
    """dm-eval results (``load_evals``)."""
    probes: pd.DataFrame | None = None
    """dm-probe rows (``load_probes``)."""
    size: str | None = None
    """Our size of the probed checkpoint."""
    check: str | None = None
    """dm-kernel-check JSON lines."""
    bench: str | None = None
    """dm-kernel-bench folder (with hardware.json)."""
    recorded: str | None = None
    """Folder of recorded dm-kernel-bench files, shown when this run timed nothing."""
    sweep: pd.DataFrame | None = None
    """dm-sweep rows (``load_sweep``)."""
    kernel_table: pd.DataFrame | None = None
    """The kernel table (for the kernel figure)."""
    recorded_run: RecordedRun | None = None
    """A pipeline run recorded earlier on a GPU (``load_recorded_run``), shown in its own section."""
    scale_of: dict[str, str] = field(default_factory=dict)
    """Which paper scale each of our sizes stands beside."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Our metric names -> the paper's."""
    gain_window: int = tables.GAIN_WINDOW
    """Training steps over which gains are read."""


def main_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    return tables.main_table(i.runs, i.evals, paper, i.scale_of, i.aliases)


def scale_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    return tables.scale_table(i.runs, i.evals, paper, i.scale_of, i.aliases)


def ablation_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    return tables.ablation_table(i.runs, i.evals, paper, i.scale_of, i.aliases)


def gain_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    return tables.gain_table(figures.records(load_metrics(i.runs), "gain"), i.gain_window)


def probe_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    return tables.probe_table(i.probes, i.size, paper, i.scale_of)


def sweep_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    return tables.sweep_table(i.sweep, paper)


def kernel_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    return kernel_from_files(i.check, i.bench, paper, i.recorded)


def figure1_loss(i: Inputs, paper: pd.DataFrame):
    return figures.figure_loss(load_metrics(i.runs), paper, i.scale_of)


def figure1_final(i: Inputs, paper: pd.DataFrame):
    evals = i.evals.assign(metric=i.evals["metric"].replace(i.aliases)) if i.aliases else i.evals
    return figures.figure_final(i.runs, evals)


def figure4_gain(i: Inputs, paper: pd.DataFrame):
    return figures.figure_gain(load_metrics(i.runs), paper, i.scale_of, i.gain_window)


def figure4_effects(i: Inputs, paper: pd.DataFrame):
    return figures.figure_effects(load_metrics(i.runs, METRIC_KINDS), i.gain_window)


def figure5_scales(i: Inputs, paper: pd.DataFrame):
    return figures.figure_scales(load_metrics(i.runs), paper, i.scale_of, i.gain_window)


def context_gap(i: Inputs, paper: pd.DataFrame):
    return figures.figure_context_gap(load_metrics(i.runs))


def figure_sweep(i: Inputs, paper: pd.DataFrame):
    return figures.figure_sweep(i.sweep)


def figure_kernel(i: Inputs, paper: pd.DataFrame):
    return figures.figure_kernel(i.kernel_table)


def kernel_from_files(check_path: str, bench_dir: str, paper: pd.DataFrame | None = None,
                      recorded_dir: str | None = None) -> pd.DataFrame:
    """The kernel table from the pipeline's files; ``recorded_dir``'s measurements stand in where no Hopper GPU ran
    the bench (labelled as recorded, with their GPU, date and commit)."""
    bench = Path(bench_dir)
    if not Path(check_path).is_file():
        raise ValueError(f"missing input file: {check_path}")
    if not (bench / "hardware.json").is_file():
        raise ValueError(f"missing input file: {bench / 'hardware.json'}")
    check = pd.read_json(check_path, lines=True)
    optional = {name: pd.read_csv(bench / f"{name}.csv") if (bench / f"{name}.csv").is_file() else None
                for name in ("kernel_bench", "kernel_memory", "kernel_profile")}
    hw = json.loads((bench / "hardware.json").read_text())
    if recorded_dir is not None and not Path(recorded_dir).is_dir():
        raise ValueError(f"--recorded: no folder {recorded_dir}")
    recorded = load_recorded_kernel(recorded_dir) if recorded_dir and optional["kernel_bench"] is None else None
    return tables.kernel_table(check, optional["kernel_bench"], optional["kernel_memory"], hw, paper, recorded,
                               profile=optional["kernel_profile"])


def run_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    return tables.run_table(i.runs, load_metrics(i.runs, ("train", "gain")))


def recorded_run_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    """The run table of a recorded GPU run, every row labelled with where and when it was recorded."""
    run = i.recorded_run
    table = tables.run_table(run.runs, load_metrics(run.runs, ("train", "gain")))
    return table.assign(source=tables.recorded_label(run.provenance))


def recorded_probe_table(i: Inputs, paper: pd.DataFrame) -> pd.DataFrame:
    """Table 9 of the recorded run's probed checkpoint beside the paper's values (at the paper's 1.67B)."""
    run = i.recorded_run
    if run.probes is None:
        raise ValueError(f"{run.folder}: the recorded run probed no checkpoint (no results/probes/.../s<seed>.csv)")
    table = tables.probe_table(run.probes, run.probe_size, paper, {})
    return table.assign(source=tables.recorded_label(run.provenance))


def figure_recorded_run(i: Inputs, paper: pd.DataFrame):
    run = i.recorded_run
    return figures.figure_recorded_run(load_metrics(run.runs, ("train", "gain")), run.probes,
                                       tables.recorded_label(run.provenance))
