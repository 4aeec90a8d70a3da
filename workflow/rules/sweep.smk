# The random-head sweep: row-sum residual of each δ on random attention heads across input spreads (dm-sweep).


rule sweep:
    input:
        config=f"{RESULTS}/configs/sweep.yaml",
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
