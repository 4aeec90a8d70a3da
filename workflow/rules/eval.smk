# Evaluation: one dm-eval call per (run, suite) on the run's exported final/ checkpoint.


rule eval:
    input:
        checkpoint=f"{RUN}/final",
        data=DATA,
    output:
        f"{RESULTS}/evals/{TAG}/{{suite}}.json",
    log:
        f"{LOGS}/eval/{TAG}/{{suite}}.log",
    benchmark:
        f"{BENCH}/eval/{TAG}/{{suite}}.tsv"
    params:
        extra=" ".join(["--online"] * config["evals"]["online"] + config["evals"]["extra_args"]),
    threads: config["resources"]["eval"]["threads"]
    resources:
        **resources_of("eval"),
    conda:
        "../../envs/eval.yaml"
    shell:
        "dm-eval --checkpoint {input.checkpoint} --suite {wildcards.suite} --data {input.data} --out {output}"
        " {params.extra} > {log} 2>&1"
