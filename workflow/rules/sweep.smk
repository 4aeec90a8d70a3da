# The random-head sweep: row-sum residual of each δ on random attention heads across input spreads (dm-sweep).


rule sweep_config:
    output:
        f"{RESULTS}/configs/sweep.yaml",
    log:
        f"{LOGS}/configs/sweep.log",
    localrule: True
    params:
        text=as_yaml(config["sweep"]["config"]),
    run:
        write_config(output[0], params.text, log[0])


rule sweep:
    input:
        config=rules.sweep_config.output[0],
    output:
        f"{RESULTS}/sweep/sweep.csv",
    log:
        f"{LOGS}/sweep.log",
    benchmark:
        f"{BENCH}/sweep.tsv"
    conda:
        "../../envs/kernel.yaml"
    threads: config["resources"]["light"]["threads"]
    resources:
        **resources_of("light"),
    shell:
        "dm-sweep --config {input.config} --out {output} --no-progress > {log} 2>&1"
