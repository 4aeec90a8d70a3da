# Data: the corpus, its tokenizer and the token shards of this config (dm-prepare-data replaces the folder atomically).


rule data_config:
    output:
        f"{RESULTS}/configs/data.yaml",
    log:
        f"{LOGS}/configs/data.log",
    localrule: True
    params:
        text=as_yaml({**config["data"], "out_dir": DATA}),
    run:
        write_config(output[0], params.text, log[0])


rule prepare_data:
    input:
        config=rules.data_config.output[0],
    output:
        directory(DATA),
    log:
        f"{LOGS}/data.log",
    benchmark:
        f"{BENCH}/data.tsv"
    # With data_local (a Hub corpus, compute nodes offline) it runs where Snakemake runs, which has the network; a
    # killed build resumes from its partial folder (models/data/prepare.py).
    localrule: config["data_local"]
    conda:
        "../../envs/train.yaml"
    threads: config["resources"]["light"]["threads"]
    resources:
        **resources_of("light"),
    shell:
        "dm-prepare-data --config {input.config} --out-dir {output} > {log} 2>&1"
