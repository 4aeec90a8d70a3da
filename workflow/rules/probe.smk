# Table 9's measurements: the row-sum residual of each δ per attention layer of one checkpoint, on held-out tokens.


rule probe:
    input:
        checkpoint=f"{RUN}/final",
        data=DATA,
    output:
        f"{RESULTS}/probes/{TAG}.csv",
    log:
        f"{LOGS}/probe/{TAG}.log",
    benchmark:
        f"{BENCH}/probe/{TAG}.tsv"
    conda:
        "../../envs/eval.yaml"
    threads: config["resources"]["eval"]["threads"]
    resources:
        **resources_of("eval"),
    params:
        extra=" ".join(config["probe"]["args"]),
    shell:
        "dm-probe --checkpoint {input.checkpoint} --data {input.data} --out {output} {params.extra} > {log} 2>&1"
