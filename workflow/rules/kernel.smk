# Kernel: the ahead-of-time build check (PTX/SASS of every kernel for sm_90a; runs without a GPU, and on a Hopper GPU
# also runs the GPU correctness tests: dm-kernel-check --gpu-tests) and the latency benchmark.
# `python -m deltamatch.kernels.hardware` records the machine's GPU in bench/hardware.json; without a Hopper GPU
# nothing is timed and the report says so. Both take config
# resources.kernel: on a cluster that group asks for a GPU (gres), which the `light` jobs never get.


rule kernel_check:
    output:
        f"{RESULTS}/kernel/check.jsonl",
    log:
        f"{LOGS}/kernel/check.log",
    benchmark:
        f"{BENCH}/kernel/check.tsv"
    conda:
        "../../envs/kernel.yaml"
    threads: config["resources"]["kernel"]["threads"]
    resources:
        **resources_of("kernel"),
    params:
        extra=" ".join(config["kernel"]["check_args"]),
        gpu_tests=str(Path(workflow.basedir) / "tests" / "kernels"),
    shell:
        "dm-kernel-check --out {output} --gpu-tests {params.gpu_tests} {params.extra} > {log} 2>&1"


rule kernel_bench:
    output:
        directory(f"{RESULTS}/kernel/bench"),
    log:
        f"{LOGS}/kernel/bench.log",
    benchmark:
        f"{BENCH}/kernel/bench.tsv"
    conda:
        "../../envs/kernel.yaml"
    threads: config["resources"]["kernel"]["threads"]
    resources:
        **resources_of("kernel"),
    params:
        extra=" ".join(config["kernel"]["bench_args"]),
    shell:
        "if python -m deltamatch.kernels.hardware --out {output}/hardware.json --has-hopper > {log} 2>&1;"
        " then dm-kernel-bench --out {output} {params.extra} >> {log} 2>&1; fi"
