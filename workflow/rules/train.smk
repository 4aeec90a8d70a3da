# Training: one dm-launch call per (variant, size, method, seed). Only summary.json and final/ are declared outputs:
# Snakemake deletes the outputs of a failed job, and a retried job must find its checkpoints/ and metrics.jsonl to
# resume from. A job rerun because its config changed must not resume them: dm-train --restart-on-config-change
# deletes a run dir whose checkpoints carry another config fingerprint and starts afresh.


rule train_config:
    output:
        f"{RESULTS}/configs/train/{TAG}.yaml",
    params:
        text=lambda wildcards: as_yaml(train_config(wildcards)),
    log:
        f"{LOGS}/configs/train/{TAG}.log",
    localrule: True
    conda:
        "../../envs/report.yaml"
    shell:
        "(printf '%s' {params.text:q} > {output}.tmp && mv {output}.tmp {output}) > {log} 2>&1"


rule train:
    input:
        config=rules.train_config.output[0],
        data=DATA,
        init=init_checkpoint,
    output:
        summary=f"{RUN}/summary.json",
        final=directory(f"{RUN}/final"),
    log:
        f"{LOGS}/train/{TAG}.log",
    benchmark:
        f"{BENCH}/train/{TAG}.tsv"
    params:
        launch=" ".join(
            [
                f"--nodes {config['launch']['nodes']}",
                f"--procs-per-node {config['launch']['procs_per_node']}",
                *config["launch"]["extra_args"],
            ]
        ),
    threads: config["resources"]["train"]["threads"]
    resources:
        **resources_of("train"),
        nodes=config["launch"]["nodes"],
        # Without GPUs, one task per node keeps SLURM from shrinking the job to one node; with gres the plugin turns
        # `tasks` into --ntasks-per-gpu, so it is left out there.
        **({} if config["resources"]["train"]["gpus"] else {"tasks": config["launch"]["nodes"]}),
    conda:
        "../../envs/train.yaml"
    shell:
        "dm-launch --config {input.config} {params.launch} -- --restart-on-config-change > {log} 2>&1"
