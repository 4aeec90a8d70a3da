# Evaluation: one dm-eval call per (run, suite) on the run's exported final/ checkpoint. With evals.prefetch, a local
# rule first fills the caches each suite reads (Hub datasets, URL downloads, NLTK data) on the login node, where the
# network is, and the eval jobs run dm-eval offline (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1) from those caches.


rule prefetch_eval_data:
    output:
        f"{RESULTS}/prefetch/{{suite}}.json",
    log:
        f"{LOGS}/prefetch/{{suite}}.log",
    localrule: True  # downloads need the network, which login nodes have and compute nodes often lack
    conda:
        "../../envs/eval.yaml"
    shell:
        "dm-eval-prefetch --suite {wildcards.suite} --out {output} > {log} 2>&1"


rule eval:
    input:
        checkpoint=f"{RUN}/final",
        data=DATA,
        prefetched=lambda wildcards: (
            [f"{RESULTS}/prefetch/{wildcards.suite}.json"] if config["evals"]["prefetch"] else []
        ),
    output:
        f"{RESULTS}/evals/{TAG}/{{suite}}.json",
    log:
        f"{LOGS}/eval/{TAG}/{{suite}}.log",
    benchmark:
        f"{BENCH}/eval/{TAG}/{{suite}}.tsv"
    conda:
        "../../envs/eval.yaml"
    threads: config["resources"]["eval"]["threads"]
    resources:
        **resources_of("eval"),
    params:
        extra=" ".join(
            ["--online"] * config["evals"]["online"]
            + ([f"--limit {config['evals']['limit']}"] if config["evals"]["limit"] else [])
        ),
    shell:
        "dm-eval --checkpoint {input.checkpoint} --suite {wildcards.suite} --data {input.data} --out {output}"
        " {params.extra} > {log} 2>&1"
