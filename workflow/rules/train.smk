# Training: one dm-launch call per (variant, size, method, seed). Only summary.json and final/ are declared outputs:
# Snakemake deletes the outputs of a failed job, and a retried job must find its checkpoints/ and metrics.jsonl to
# resume from. A job rerun because its config changed must not resume them: dm-train --restart-on-config-change
# deletes a run dir whose checkpoints carry another config fingerprint and starts afresh.


rule train_config:
    output:
        f"{RESULTS}/configs/train/{TAG}.yaml",
    log:
        f"{LOGS}/configs/train/{TAG}.log",
    localrule: True
    params:
        text=lambda wildcards: as_yaml(train_config(wildcards)),
    run:
        write_config(output[0], params.text, log[0])


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
    conda:
        "../../envs/train.yaml"
    threads: lambda wildcards: train_resources_of(wildcards.size)["threads"]
    resources:
        **train_rule_resources(),
    params:
        launch=launch_args,
    shell:
        "dm-launch --config {input.config} {params.launch} -- --restart-on-config-change > {log} 2>&1"
