# The random-head sweep: row-sum residual of each δ on random attention heads across input spreads (dm-sweep).


rule sweep:
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
    params:
        extra=" ".join(config["sweep"]["args"]),
    shell:
        "dm-sweep --out {output} {params.extra} > {log} 2>&1"
