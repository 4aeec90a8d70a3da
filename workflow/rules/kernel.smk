# Kernel: ahead-of-time build check (PTX/SASS of every kernel, runs without a GPU) and the latency benchmark (on a
# machine without a Hopper GPU dm-kernel-bench records that instead of numbers, and the report says so).


rule kernel_check:
    output:
        f"{RESULTS}/kernel/check.jsonl",
    log:
        f"{LOGS}/kernel/check.log",
    benchmark:
        f"{BENCH}/kernel/check.tsv"
    threads: config["resources"]["light"]["threads"]
    resources:
        **resources_of("light"),
    conda:
        "../../envs/kernel.yaml"
    shell:
        "dm-kernel-check --out {output} > {log} 2>&1"


rule kernel_bench:
    output:
        directory(f"{RESULTS}/kernel/bench"),
    log:
        f"{LOGS}/kernel/bench.log",
    benchmark:
        f"{BENCH}/kernel/bench.tsv"
    params:
        extra=" ".join(config["kernel"]["bench_args"]),
    threads: config["resources"]["light"]["threads"]
    resources:
        **resources_of("light"),
    conda:
        "../../envs/kernel.yaml"
    shell:
        "dm-kernel-bench --out {output} {params.extra} > {log} 2>&1"
