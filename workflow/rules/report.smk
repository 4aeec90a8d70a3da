# Report: every table and figure is its own target (results/<name>/report/tables/<t>.csv, figures/<f>.png + .csv),
# so `snakemake <that path>` rebuilds one without touching the rest; `render` puts them on one page, HTML and Markdown.
# All are local rules: seconds of pandas/seaborn each, not worth a cluster job.

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


rule table_main:
    input:
        runs=summaries(MAIN_RUNS),
        evals=evals(MAIN_RUNS),
        paper=PAPER,
    output:
        f"{REPORT}/tables/main_1p67b.csv",
    log:
        f"{LOGS}/report/main_1p67b.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        mapping=MAPPING,
    shell:
        "dm-report table main --runs {input.runs} --evals {input.evals} --paper {input.paper} {params.mapping}"
        " --out {output} > {log} 2>&1"


rule table_scale:
    input:
        runs=summaries(SCALE_RUNS),
        evals=evals(SCALE_RUNS),
        paper=PAPER,
    output:
        f"{REPORT}/tables/scale.csv",
    log:
        f"{LOGS}/report/scale.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        mapping=MAPPING,
    shell:
        "dm-report table scale --runs {input.runs} --evals {input.evals} --paper {input.paper} {params.mapping}"
        " --out {output} > {log} 2>&1"


rule table_ablations:
    input:
        runs=summaries(RUNS),
        evals=evals(RUNS),
        paper=PAPER,
    output:
        f"{REPORT}/tables/ablations.csv",
    log:
        f"{LOGS}/report/ablations.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        mapping=MAPPING,
    shell:
        "dm-report table ablations --runs {input.runs} --evals {input.evals} --paper {input.paper} {params.mapping}"
        " --out {output} > {log} 2>&1"


rule table_probes:
    input:
        probes=f"{RESULTS}/probes/{PROBED.variant}/{PROBED.size}/{PROBED.method}/s{PROBED.seed}.csv",
        paper=PAPER,
    output:
        f"{REPORT}/tables/table9_probes.csv",
    log:
        f"{LOGS}/report/table9_probes.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        mapping=MAPPING,
        size=PROBED.size,
    shell:
        "dm-report table probes --probes {input.probes} --size {params.size} --paper {input.paper} {params.mapping}"
        " --out {output} > {log} 2>&1"


rule table_kernel:
    input:
        check=rules.kernel_check.output[0],
        bench=rules.kernel_bench.output[0],
        paper=PAPER,
        recorded=[
            str(RECORDED / f"{name}.{ext}")
            for name in ("kernel_bench", "kernel_memory")
            for ext in ("csv", "md")
            if RECORDED and (RECORDED / f"{name}.{ext}").is_file()
        ],
    output:
        f"{REPORT}/tables/kernel_latency.csv",
    log:
        f"{LOGS}/report/kernel_latency.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        recorded=f"--recorded {RECORDED}" if RECORDED else "",
    shell:
        "dm-report table kernel --check {input.check} --bench {input.bench} --paper {input.paper} {params.recorded}"
        " --out {output} > {log} 2>&1"


rule table_sweep:
    input:
        sweep=rules.sweep.output[0],
    output:
        f"{REPORT}/tables/sweep.csv",
    log:
        f"{LOGS}/report/sweep.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    shell:
        "dm-report table sweep --sweep {input.sweep} --out {output} > {log} 2>&1"


rule figure_runs:
    input:
        runs=lambda wildcards: summaries(FIGURE5_RUNS if wildcards.figure == "figure5_scales" else MAIN_RUNS),
        paper=PAPER,
    output:
        png=f"{REPORT}/figures/{{figure}}.png",
        values=f"{REPORT}/figures/{{figure}}.csv",
    log:
        f"{LOGS}/report/{{figure}}.log",
    wildcard_constraints:
        figure="figure1_loss|figure4_gain|figure4_effects|figure5_scales",
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        mapping=lambda wildcards: FIGURE5_MAPPING if wildcards.figure == "figure5_scales" else MAPPING,
        window=lambda wildcards: WINDOW if wildcards.figure != "figure1_loss" else "",
    shell:
        "dm-report figure {wildcards.figure} --runs {input.runs} --paper {input.paper} {params.mapping}"
        " {params.window} --out {output.png} --values {output.values} > {log} 2>&1"


rule figure_final:
    input:
        runs=summaries(MAIN_RUNS),
        evals=evals(MAIN_RUNS),
    output:
        png=f"{REPORT}/figures/figure1_final.png",
        values=f"{REPORT}/figures/figure1_final.csv",
    log:
        f"{LOGS}/report/figure1_final.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        alias=f"--alias {key_values(config['report']['metric_alias'])}",
    shell:
        "dm-report figure figure1_final --runs {input.runs} --evals {input.evals} {params.alias}"
        " --out {output.png} --values {output.values} > {log} 2>&1"


rule table_gains:
    input:
        runs=summaries(RUNS),
    output:
        f"{REPORT}/tables/gains.csv",
    log:
        f"{LOGS}/report/gains.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    params:
        window=WINDOW,
    shell:
        "dm-report table gains --runs {input.runs} {params.window} --out {output} > {log} 2>&1"


rule figure_context_gap:
    input:
        runs=summaries(select(variant=config["report"]["context_variant"])),
    output:
        png=f"{REPORT}/figures/context_gap.png",
        values=f"{REPORT}/figures/context_gap.csv",
    log:
        f"{LOGS}/report/context_gap.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    shell:
        "dm-report figure context_gap --runs {input.runs} --out {output.png} --values {output.values} > {log} 2>&1"


rule figure_kernel:
    input:
        table=rules.table_kernel.output[0],
    output:
        png=f"{REPORT}/figures/kernel.png",
        values=f"{REPORT}/figures/kernel.csv",
    log:
        f"{LOGS}/report/figure_kernel.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    shell:
        "dm-report figure kernel --kernel-table {input.table} --out {output.png} --values {output.values} > {log} 2>&1"


rule figure_sweep:
    input:
        sweep=rules.sweep.output[0],
    output:
        png=f"{REPORT}/figures/sweep.png",
        values=f"{REPORT}/figures/sweep.csv",
    log:
        f"{LOGS}/report/figure_sweep.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    shell:
        "dm-report figure sweep --sweep {input.sweep} --out {output.png} --values {output.values} > {log} 2>&1"


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
