# Evaluation: one dm-eval call per (run, suite) on the run's exported final/ checkpoint.


rule eval:
    input:
        checkpoint=f"{RUN}/final",
    output:
        f"{RESULTS}/evals/{TAG}/{{suite}}.json",
    log:
        f"{LOGS}/eval/{TAG}/{{suite}}.log",
    benchmark:
        f"{BENCH}/eval/{TAG}/{{suite}}.tsv"
    params:
        extra=" ".join(config["evals"]["extra_args"]),
    threads: config["resources"]["eval"]["threads"]
    resources:
        **resources_of("eval"),
    conda:
        "../../envs/eval.yaml"
    shell:
        "dm-eval --checkpoint {input.checkpoint} --suite {wildcards.suite} --out {output} {params.extra} > {log} 2>&1"
