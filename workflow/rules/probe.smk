# Table 9's measurements: the row-sum residual of each δ per attention layer of one checkpoint, on held-out tokens.


rule probe_config:
    output:
        f"{RESULTS}/configs/probe/{TAG}.yaml",
    log:
        f"{LOGS}/configs/probe/{TAG}.log",
    localrule: True
    params:
        text=lambda wildcards: as_yaml(probe_config(wildcards)),
    run:
        write_config(output[0], params.text, log[0])


rule probe:
    input:
        config=rules.probe_config.output[0],
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
    shell:
        "dm-probe --config {input.config} --checkpoint {input.checkpoint} --data {input.data} --out {output} > {log} 2>&1"
