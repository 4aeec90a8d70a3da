"""``dm-report``: build one table, one figure, or the whole report page from the pipeline's outputs.

    dm-report table main --runs R/summary.json ... --evals E.json ... --out tables/main_1p67b.csv
    dm-report table scale|ablations (same inputs)      dm-report table probes --probes P.csv --size tiny --out ...
    dm-report table kernel --check C.jsonl --bench DIR [--recorded benchmarks/results] --out ...
    dm-report table sweep --sweep S.csv --out ...
    dm-report table gains --runs R/summary.json ... [--gain-window 6000] --out tables/gains.csv
    dm-report figure figure1_loss|figure4_gain|figure5_scales --runs ... [--gain-window 6000] --out F.png --values F.csv
    dm-report figure figure1_final --runs ... --evals ... --out F.png --values F.csv
    dm-report figure figure4_effects --runs ... [--gain-window 6000] --out F.png --values F.csv
    dm-report figure context_gap --runs R/summary.json ... (one variant's runs) --out F.png --values F.csv
    dm-report figure sweep --sweep S.csv --out F.png --values F.csv
    dm-report figure kernel --kernel-table tables/kernel_latency.csv --out F.png --values F.csv
    dm-report render --inputs tables/*.csv figures/* --name NAME --scale-note TEXT --html H --markdown M [--claims C]
    dm-report table recorded_run|recorded_probes --recorded-run DIR --out ...
    dm-report figure recorded_run --recorded-run DIR --out F.png --values F.csv
    dm-report all --results results/NAME [--recorded DIR] [--recorded-run DIR] [--figure5-scale-of tiny=569M]
                                                  (every artefact from a finished results folder, without Snakemake)

``--scale-of tiny=1.67B`` says which paper scale each of our sizes stands beside (for Figure 5, whose paper values
are at 569M and 5.29B, the pipeline passes its own mapping); ``--alias dm_ruler_8k=ruler_8k`` renames our metric
names to the paper's. ``--gain-window`` is the number of training steps over which gains are read (the paper's
Figures 4 and 5: the first 6,000; a shorter run is read at its end, and the numbers say which step). ``--recorded
DIR`` names kernel measurements a Hopper GPU recorded earlier (dm-kernel-bench's files): the kernel table shows them,
labelled with their GPU, date and commit, when this run measured nothing. ``--recorded-run DIR`` names a whole GPU
pipeline run recorded earlier (``benchmarks/results/h200_pipeline/<date>``: its ``provenance.json`` and results
folder), shown in a section of its own and labelled as not measured by this run. Every output is written
atomically. The tables and figures, with their inputs and options, are the registry ``reports/artefacts.py``; each
is built by its function in ``reports/builders.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from deltamatch.atomic import atomic_path
from deltamatch.reports import artefacts, builders, figures, tables
from deltamatch.reports.builders import Inputs
from deltamatch.reports.inputs import load_evals, load_probes, load_recorded_run, load_summaries, load_sweep
from deltamatch.reports.paper import PAPER_YAML, load_paper
from deltamatch.reports.render import render


def write_csv(path: str | Path, frame: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def pairs(words: list[str] | None, option: str) -> dict[str, str]:
    out = {}
    for word in words or []:
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{option}: expected KEY=VALUE, got {word!r}")
        out[key] = value
    return out


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paper", default=str(PAPER_YAML), help="the paper's values (reports/paper_reported.yaml)")
    parser.add_argument("--scale-of", nargs="*", default=[], metavar="OURS=PAPER",
                        help="which paper scale each of our sizes is compared with")
    parser.add_argument("--alias", nargs="*", default=[], metavar="OURS=PAPER", help="metric names to rename")


def _window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gain-window", type=int, default=tables.GAIN_WINDOW, metavar="STEPS",
                        help="read gains at / over the first STEPS training steps, or the run's end if it is shorter "
                        f"(default {tables.GAIN_WINDOW}, the paper's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dm-report", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    table = sub.add_parser("table", help="build one table (CSV)")
    table.add_argument("name", choices=list(artefacts.of_kind("table")), help="which table")
    table.add_argument("--runs", nargs="*", default=[], help="summary.json of each run")
    table.add_argument("--evals", nargs="*", default=[], help="dm-eval result JSON files")
    table.add_argument("--probes", help="dm-probe CSV (table probes)")
    table.add_argument("--size", help="our size of the probed checkpoint (table probes)")
    table.add_argument("--check", help="dm-kernel-check JSON lines (table kernel)")
    table.add_argument("--bench", help="dm-kernel-bench folder with hardware.json (table kernel)")
    table.add_argument("--recorded", help="folder of recorded dm-kernel-bench files, shown when this run measured "
                       "nothing (table kernel)")
    table.add_argument("--sweep", help="dm-sweep CSV (table sweep)")
    table.add_argument("--recorded-run", help="folder of a GPU pipeline run recorded earlier, with its "
                       "provenance.json (tables recorded_run, recorded_probes)")
    table.add_argument("--out", required=True, help="CSV file to write")
    _common(table)
    _window(table)

    figure = sub.add_parser("figure", help="draw one figure (PNG) and its numbers (CSV)")
    figure.add_argument("name", choices=list(artefacts.of_kind("figure")), help="which figure")
    figure.add_argument("--runs", nargs="*", default=[], help="summary.json of each run (metrics.jsonl beside it)")
    figure.add_argument("--evals", nargs="*", default=[], help="dm-eval result JSON files (figure figure1_final)")
    figure.add_argument("--sweep", help="dm-sweep CSV (figure sweep)")
    figure.add_argument("--kernel-table", help="the kernel table CSV (figure kernel)")
    figure.add_argument("--recorded-run", help="folder of a GPU pipeline run recorded earlier (figure recorded_run)")
    figure.add_argument("--out", required=True, help="PNG to write")
    figure.add_argument("--values", required=True, help="CSV of the numbers the paper states, beside ours")
    _common(figure)
    _window(figure)

    page = sub.add_parser("render", help="render the page (HTML and Markdown) from tables and figures")
    page.add_argument("--inputs", nargs="+", required=True, help="tables/*.csv, figures/*.png and figures/*.csv")
    page.add_argument("--name", required=True, help="config name shown in the title")
    page.add_argument("--scale-note", required=True, help="where and at what scale our numbers were measured")
    page.add_argument("--html", required=True, help="HTML page to write")
    page.add_argument("--markdown", required=True, help="Markdown page to write")
    page.add_argument("--claims", help="also write the claims table (CSV) here")
    page.add_argument("--paper", default=str(PAPER_YAML), help="the paper's reported values (YAML)")

    whole = sub.add_parser("all", help="every table and figure and the page from a finished results folder")
    whole.add_argument("--results", required=True, help="results/<name>")
    whole.add_argument("--scale-note", default="", help="where and at what scale our numbers were measured")
    whole.add_argument("--figure5-scale-of", nargs="*", default=[], metavar="OURS=PAPER",
                       help="for Figure 5 only, on top of --scale-of (its paper values are at 569M and 5.29B)")
    whole.add_argument("--recorded", help="folder of recorded dm-kernel-bench files (see table kernel)")
    whole.add_argument("--recorded-run", help="folder of a GPU pipeline run recorded earlier, shown in its own "
                       "section (see table recorded_run)")
    _common(whole)
    _window(whole)

    for choice in sub._choices_actions:  # `dm-report NAME --help` opens with the line `dm-report --help` gives NAME
        sub.choices[choice.dest].description = choice.help
    return parser


# The options that name each input group's files (the first is what an error says is missing).
NEEDS = {"probes": ("probes", "size"), "kernel": ("check", "bench"), "sweep": ("sweep",),
         "kernel_table": ("kernel_table",), "recorded_run": ("recorded_run",)}


def inputs_from_args(artefact: artefacts.Artefact, args) -> Inputs:
    """The artefact's inputs, loaded from the files its command line names."""
    missing = [f"--{name.replace('_', '-')}" for group in artefact.inputs for name in NEEDS.get(group, ())
               if not getattr(args, name, None)]
    if missing:
        raise ValueError(f"{artefact.kind} {artefact.cli_name} needs {' and '.join(missing)}")
    found = Inputs(scale_of=pairs(args.scale_of, "--scale-of"), aliases=pairs(args.alias, "--alias"),
                   gain_window=args.gain_window)
    if "runs" in artefact.inputs:
        found.runs = load_summaries(args.runs)
    if "evals" in artefact.inputs:
        found.evals = load_evals(args.evals)
    if "probes" in artefact.inputs:
        found.probes, found.size = load_probes(args.probes), args.size
    if "kernel" in artefact.inputs:
        found.check, found.bench, found.recorded = args.check, args.bench, args.recorded
    if "sweep" in artefact.inputs:
        found.sweep = load_sweep(args.sweep)
    if "kernel_table" in artefact.inputs:
        if not Path(args.kernel_table).is_file():
            raise ValueError(f"missing input file: {args.kernel_table}")
        found.kernel_table = pd.read_csv(args.kernel_table)
    if "recorded_run" in artefact.inputs:
        found.recorded_run = load_recorded_run(args.recorded_run)
    return found


def build(artefact: artefacts.Artefact, found: Inputs, paper: pd.DataFrame):
    """Run the artefact's builder (``builders.<name>``): a frame for a table, ``(figure, numbers)`` for a figure."""
    return getattr(builders, artefact.builder)(found, paper)


def write_artefact(artefact: artefacts.Artefact, built, out: str | Path, values: str | Path | None = None) -> None:
    if artefact.kind == "table":
        write_csv(out, built)
    else:
        figures.save_figure(built[0], str(out))
        write_csv(values, built[1])


def _results_inputs(root: Path, args) -> dict:
    """What ``dm-report all`` finds in a results folder, per input group and run set (None: not there)."""
    summaries = load_summaries(sorted(str(p) for p in root.glob("runs/*/*/*/s*/summary.json")))
    evals = load_evals(sorted(str(p) for p in root.glob("evals/*/*/*/s*/*.json")))
    base = summaries[summaries["variant"] == "base"]
    if base.empty:
        raise ValueError(f"{root}: no runs/base/<size>/<method>/s<seed>/summary.json")
    main_size = base["size"].iloc[0]  # the main size is the first size of the base variant; Figure 5 shows every one
    base_evals = evals[evals["variant"] == "base"]
    probes = sorted(root.glob("probes/base/*/*/s*.csv"))[:1]
    kernel = (root / "kernel" / "check.jsonl").is_file() and (root / "kernel" / "bench").is_dir()
    return {
        "runs": {"main": (base[base["size"] == main_size], base_evals[base_evals["size"] == main_size]),
                 "scale": (base, base_evals), "figure5": (base, base_evals), "all": (summaries, evals),
                 "context": None},
        "probes": (load_probes(str(probes[0])), probes[0].parent.parent.name) if probes else None,
        "kernel": (str(root / "kernel" / "check.jsonl"), str(root / "kernel" / "bench"), args.recorded)
        if kernel else None,
        "sweep": load_sweep(str(root / "sweep" / "sweep.csv")) if (root / "sweep" / "sweep.csv").is_file() else None,
        "recorded_run": load_recorded_run(args.recorded_run) if args.recorded_run else None,
    }


def build_all(args) -> int:
    """The whole report from a results folder laid out by the pipeline, without Snakemake: every registered artefact
    whose inputs are there, in page order; one that cannot be built from them is left out, saying why on stderr."""
    root, paper = Path(args.results), load_paper(args.paper)[0]
    report, outputs = root / "report", []
    found = _results_inputs(root, args)
    scale_of, aliases = pairs(args.scale_of, "--scale-of"), pairs(args.alias, "--alias")
    mappings = {"figure5_mapping": {**scale_of, **pairs(args.figure5_scale_of, "--figure5-scale-of")}}
    built_tables: dict[str, pd.DataFrame] = {}
    for artefact in artefacts.ARTEFACTS:
        mapping = next((mappings[o] for o in artefact.options if o in mappings), scale_of)
        inputs = Inputs(scale_of=mapping, aliases=aliases, gain_window=args.gain_window)
        if artefact.runs is not None:
            if found["runs"][artefact.runs] is None:
                continue
            inputs.runs, inputs.evals = found["runs"][artefact.runs]
        if "probes" in artefact.inputs:
            if found["probes"] is None:
                continue
            inputs.probes, inputs.size = found["probes"]
        if "kernel" in artefact.inputs:
            if found["kernel"] is None:
                continue
            inputs.check, inputs.bench, inputs.recorded = found["kernel"]
        if "sweep" in artefact.inputs:
            if found["sweep"] is None:
                continue
            inputs.sweep = found["sweep"]
        if "kernel_table" in artefact.inputs:
            if "kernel_latency" not in built_tables:
                continue
            inputs.kernel_table = built_tables["kernel_latency"]
        if "recorded_run" in artefact.inputs:
            if found["recorded_run"] is None:
                continue
            inputs.recorded_run = found["recorded_run"]
        try:
            built = build(artefact, inputs, paper)
        except ValueError as err:
            print(f"dm-report all: left out {artefact.kind} {artefact.name}: {err}", file=sys.stderr)
            continue
        folder = report / ("tables" if artefact.kind == "table" else "figures")
        if artefact.kind == "table":
            built_tables[artefact.name] = built
            outputs.append(str(folder / f"{artefact.name}.csv"))
            write_artefact(artefact, built, outputs[-1])
        else:
            outputs.extend([str(folder / f"{artefact.name}.png"), str(folder / f"{artefact.name}.csv")])
            write_artefact(artefact, built, outputs[-2], outputs[-1])
    render(outputs, root.name, args.scale_note or "(scale not stated)", str(report / "index.html"),
           str(report / "report.md"), args.paper, str(report / "claims.csv"))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "render":
            render(args.inputs, args.name, args.scale_note, args.html, args.markdown, args.paper, args.claims)
        elif args.command == "all":
            return build_all(args)
        else:
            paper, _, _ = load_paper(args.paper)
            artefact = artefacts.get(args.command, args.name)
            built = build(artefact, inputs_from_args(artefact, args), paper)
            write_artefact(artefact, built, args.out, getattr(args, "values", None))
    except ValueError as err:
        print(f"dm-report: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
