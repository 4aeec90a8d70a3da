# Report: every table and figure is its own target (results/<name>/report/tables/<t>.csv, figures/<f>.png + .csv),
# so `snakemake <that path>` rebuilds one without touching the rest; `render` puts them on one page, HTML and Markdown.
# The artefacts, their inputs and options are the registry reports/artefacts.py (ARTEFACTS, loaded in common.smk): one
# wildcard rule per kind builds any of them. All are local rules: seconds of pandas/seaborn each, not a cluster job.

MAIN_RUNS = select(variant=config["report"]["main_variant"], size=config["report"]["main_size"])
SCALE_RUNS = select(variant=config["report"]["main_variant"])
FIGURE5_RUNS = [r for r in SCALE_RUNS if r.size in config["report"]["figure5_sizes"]]
PROBED = Run(*(config["probe"][k] for k in ("variant", "size", "method", "seed")))
MAPPING = (
    f"--scale-of {key_values(config['report']['paper_scale_of'])}"
    f" --alias {key_values(config['report']['metric_alias'])}"
)
# Figure 5's paper values are at 569M and 5.29B: its own mapping goes on top of the main one.
FIGURE5_MAPPING = (
    f"--scale-of {key_values({**config['report']['paper_scale_of'], **config['report']['figure5_scale_of']})}"
    f" --alias {key_values(config['report']['metric_alias'])}"
)
# Figures 4 and 5 and the gains table read gains at / over the first report.gain_window_steps training steps.
WINDOW = f"--gain-window {config['report']['gain_window_steps']}"
# Recorded Hopper measurements the kernel table falls back to when this run's bench had no Hopper GPU.
RECORDED = Path(workflow.basedir) / config["kernel"]["recorded"] if config["kernel"]["recorded"] else None
KERNEL_TABLE = f"{REPORT}/tables/kernel_latency.csv"
# A GPU pipeline run recorded earlier, shown in its own section (report.recorded_run).
RECORDED_RUN = Path(workflow.basedir) / config["report"]["recorded_run"] if config["report"]["recorded_run"] else None
# Which runs each artefact reads (reports/artefacts.py: RUN_SETS).
RUN_SETS = {
    "main": MAIN_RUNS,
    "scale": SCALE_RUNS,
    "figure5": FIGURE5_RUNS,
    "all": RUNS,
    "context": select(variant=config["report"]["context_variant"]),
}


rule report_table:
    input:
        unpack(artefact_inputs("table")),
    output:
        f"{REPORT}/tables/{{table}}.csv",
    log:
        f"{LOGS}/report/{{table}}.log",
    wildcard_constraints:
        table="|".join(a.name for a in ARTEFACTS.ARTEFACTS if a.kind == "table"),
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        args=artefact_args("table"),
    shell:
        "dm-report {params.args} --out {output} > {log} 2>&1"


rule report_figure:
    input:
        unpack(artefact_inputs("figure")),
    output:
        png=f"{REPORT}/figures/{{figure}}.png",
        values=f"{REPORT}/figures/{{figure}}.csv",
    log:
        f"{LOGS}/report/figure_{{figure}}.log",
    wildcard_constraints:
        figure="|".join(a.name for a in ARTEFACTS.ARTEFACTS if a.kind == "figure"),
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        args=artefact_args("figure"),
    shell:
        "dm-report {params.args} --out {output.png} --values {output.values} > {log} 2>&1"


rule render:
    input:
        report_parts(),
    output:
        html=f"{REPORT}/index.html",
        markdown=f"{REPORT}/report.md",
        claims=f"{REPORT}/claims.csv",
    log:
        f"{LOGS}/report/render.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        name=config["name"],
        note=config["report"]["scale_note"],
    shell:
        "dm-report render --inputs {input} --name {params.name} --scale-note {params.note:q}"
        " --html {output.html} --markdown {output.markdown} --claims {output.claims} > {log} 2>&1"
