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
    dm-report all --results results/NAME [--recorded DIR] [--figure5-scale-of tiny=569M]
                                                  (every artefact from a finished results folder, without Snakemake)

``--scale-of tiny=1.67B`` says which paper scale each of our sizes stands beside (for Figure 5, whose paper values
are at 569M and 5.29B, the pipeline passes its own mapping); ``--alias dm_ruler_8k=ruler_8k`` renames our metric
names to the paper's. ``--gain-window`` is the number of training steps over which gains are read (the paper's
Figures 4 and 5: the first 6,000; a shorter run is read at its end, and the numbers say which step). ``--recorded DIR`` names kernel measurements a Hopper GPU recorded earlier (dm-kernel-bench's
files): the kernel table shows them, labelled with their GPU, date and commit, when this run measured nothing. Every
output is written atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from deltamatch.reports import figures, tables
from deltamatch.reports.claims import claims_table
from deltamatch.atomic import atomic_path
from deltamatch.reports.inputs import (load_evals, load_metrics, load_probes, load_recorded_kernel, load_summaries,
                                       load_sweep)
from deltamatch.reports.paper import PAPER_YAML, load_paper
from deltamatch.reports.render import render

RUN_TABLES = {"main": tables.main_table, "scale": tables.scale_table, "ablations": tables.ablation_table}
RUN_FIGURES = {"figure1_loss": figures.figure_loss, "figure4_gain": figures.figure_gain,
               "figure5_scales": figures.figure_scales}
METRIC_KINDS = ("train", "gain", "val", "residual")


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
    table.add_argument("name", choices=[*RUN_TABLES, "probes", "kernel", "sweep", "gains"], help="which table")
    table.add_argument("--runs", nargs="*", default=[], help="summary.json of each run")
    table.add_argument("--evals", nargs="*", default=[], help="dm-eval result JSON files")
    table.add_argument("--probes", help="dm-probe CSV (table probes)")
    table.add_argument("--size", help="our size of the probed checkpoint (table probes)")
    table.add_argument("--check", help="dm-kernel-check JSON lines (table kernel)")
    table.add_argument("--bench", help="dm-kernel-bench folder with hardware.json (table kernel)")
    table.add_argument("--recorded", help="folder of recorded dm-kernel-bench files, shown when this run measured "
                       "nothing (table kernel)")
    table.add_argument("--sweep", help="dm-sweep CSV (table sweep)")
    table.add_argument("--out", required=True, help="CSV file to write")
    _common(table)
    _window(table)

    figure = sub.add_parser("figure", help="draw one figure (PNG) and its numbers (CSV)")
    figure.add_argument("name", choices=[*RUN_FIGURES, "sweep", "kernel", "figure1_final", "context_gap",
                                         "figure4_effects"], help="which figure")
    figure.add_argument("--runs", nargs="*", default=[], help="summary.json of each run (metrics.jsonl beside it)")
    figure.add_argument("--evals", nargs="*", default=[], help="dm-eval result JSON files (figure figure1_final)")
    figure.add_argument("--sweep", help="dm-sweep CSV (figure sweep)")
    figure.add_argument("--kernel-table", help="the kernel table CSV (figure kernel)")
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
    _common(whole)
    _window(whole)
    return parser


def build_table(args, paper: pd.DataFrame) -> pd.DataFrame:
    scale_of, aliases = pairs(args.scale_of, "--scale-of"), pairs(args.alias, "--alias")
    if args.name in RUN_TABLES:
        return RUN_TABLES[args.name](load_summaries(args.runs), load_evals(args.evals), paper, scale_of, aliases)
    if args.name == "probes":
        if not args.probes or not args.size:
            raise ValueError("table probes needs --probes and --size")
        return tables.probe_table(load_probes(args.probes), args.size, paper, scale_of)
    if args.name == "sweep":
        if not args.sweep:
            raise ValueError("table sweep needs --sweep")
        return tables.sweep_table(load_sweep(args.sweep), paper)
    if args.name == "gains":
        return tables.gain_table(figures.records(load_metrics(load_summaries(args.runs)), "gain"), args.gain_window)
    if not args.check or not args.bench:
        raise ValueError("table kernel needs --check and --bench")
    return kernel_from_files(args.check, args.bench, paper, args.recorded)


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
                for name in ("kernel_bench", "kernel_memory")}
    hw = json.loads((bench / "hardware.json").read_text())
    if recorded_dir is not None and not Path(recorded_dir).is_dir():
        raise ValueError(f"--recorded: no folder {recorded_dir}")
    recorded = load_recorded_kernel(recorded_dir) if recorded_dir and optional["kernel_bench"] is None else None
    return tables.kernel_table(check, optional["kernel_bench"], optional["kernel_memory"], hw, paper, recorded)


def draw_figure(args, paper: pd.DataFrame) -> None:
    if args.name == "sweep":
        if not args.sweep:
            raise ValueError("figure sweep needs --sweep")
        grid, numbers = figures.figure_sweep(load_sweep(args.sweep))
    elif args.name == "kernel":
        if not args.kernel_table or not Path(args.kernel_table).is_file():
            raise ValueError(f"figure kernel needs --kernel-table (the kernel table CSV), got {args.kernel_table}")
        grid, numbers = figures.figure_kernel(pd.read_csv(args.kernel_table))
    elif args.name == "figure4_effects":
        grid, numbers = figures.figure_effects(load_metrics(load_summaries(args.runs), METRIC_KINDS), args.gain_window)
    elif args.name == "context_gap":
        grid, numbers = figures.figure_context_gap(load_metrics(load_summaries(args.runs)))
    elif args.name == "figure1_final":
        aliases = pairs(args.alias, "--alias")
        grid, numbers = figures.figure_final(load_summaries(args.runs), _aliased(load_evals(args.evals), aliases))
    else:
        metrics = load_metrics(load_summaries(args.runs))
        scale_of = pairs(args.scale_of, "--scale-of")
        if args.name == "figure1_loss":
            grid, numbers = figures.figure_loss(metrics, paper, scale_of)
        else:
            grid, numbers = RUN_FIGURES[args.name](metrics, paper, scale_of, args.gain_window)
    figures.save_figure(grid, args.out)
    write_csv(args.values, numbers)


def _aliased(evals: pd.DataFrame, aliases: dict[str, str]) -> pd.DataFrame:
    return evals.assign(metric=evals["metric"].replace(aliases)) if aliases else evals


def build_all(args) -> int:
    """The whole report from a results folder laid out by the pipeline, without Snakemake: the main size is the
    first size of the ``base`` variant; Figure 5 shows every base size."""
    root, paper = Path(args.results), load_paper(args.paper)[0]
    report, outputs = root / "report", []
    scale_of, aliases = pairs(args.scale_of, "--scale-of"), pairs(args.alias, "--alias")
    summaries = load_summaries(sorted(str(p) for p in root.glob("runs/*/*/*/s*/summary.json")))
    evals = load_evals(sorted(str(p) for p in root.glob("evals/*/*/*/s*/*.json")))
    base = summaries[summaries["variant"] == "base"]
    if base.empty:
        raise ValueError(f"{root}: no runs/base/<size>/<method>/s<seed>/summary.json")
    main_size = base["size"].iloc[0]
    main_runs = base[base["size"] == main_size]
    main_evals = evals[(evals["variant"] == "base") & (evals["size"] == main_size)]

    def table(name, frame):
        outputs.append(str(report / "tables" / f"{name}.csv"))
        write_csv(outputs[-1], frame)

    def figure(name, drawn):
        outputs.extend([str(report / "figures" / f"{name}.png"), str(report / "figures" / f"{name}.csv")])
        figures.save_figure(drawn[0], outputs[-2])
        write_csv(outputs[-1], drawn[1])

    table("main_1p67b", tables.main_table(main_runs, main_evals, paper, scale_of, aliases))
    table("scale", tables.scale_table(base, evals[evals["variant"] == "base"], paper, scale_of, aliases))
    table("ablations", tables.ablation_table(summaries, evals, paper, scale_of, aliases))
    figure("figure1_loss", figures.figure_loss(load_metrics(main_runs), paper, scale_of))
    figure("figure1_final", figures.figure_final(main_runs, _aliased(main_evals, aliases)))
    figure("figure4_gain", figures.figure_gain(load_metrics(main_runs), paper, scale_of, args.gain_window))
    main_metrics = load_metrics(main_runs, METRIC_KINDS)
    if "sharpened" in main_metrics:  # runs trained before the instrumentation have no such records
        figure("figure4_effects", figures.figure_effects(main_metrics, args.gain_window))
    figure5_scale_of = {**scale_of, **pairs(args.figure5_scale_of, "--figure5-scale-of")}
    figure("figure5_scales", figures.figure_scales(load_metrics(base), paper, figure5_scale_of, args.gain_window))
    table("gains", tables.gain_table(figures.records(load_metrics(summaries), "gain"), args.gain_window))
    for probes in sorted(root.glob("probes/base/*/*/s*.csv"))[:1]:
        table("table9_probes", tables.probe_table(load_probes(str(probes)), probes.parent.parent.name, paper, scale_of))
    if (root / "kernel" / "check.jsonl").is_file() and (root / "kernel" / "bench").is_dir():
        kernel = kernel_from_files(str(root / "kernel" / "check.jsonl"), str(root / "kernel" / "bench"), paper,
                                   args.recorded)
        table("kernel_latency", kernel)
        if (kernel["section"] == "latency").any():
            figure("kernel", figures.figure_kernel(kernel))
    if (root / "sweep" / "sweep.csv").is_file():
        sweep = load_sweep(str(root / "sweep" / "sweep.csv"))
        table("sweep", tables.sweep_table(sweep, paper))
        figure("sweep", figures.figure_sweep(sweep))
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
            if args.command == "table":
                write_csv(args.out, build_table(args, paper))
            else:
                draw_figure(args, paper)
    except ValueError as err:
        print(f"dm-report: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
