# Kernel: the ahead-of-time build check (PTX/SASS of every kernel for sm_90a; runs without a GPU, and on a Hopper GPU
# also runs the GPU correctness tests: dm-kernel-check --gpu-tests) and the latency benchmark.
# `python -m deltamatch.kernels.hardware` records the machine's GPU in bench/hardware.json; without a Hopper GPU
# nothing is timed and the report says so. Both take config
# resources.kernel: on a cluster that group asks for a GPU (gres), which the `light` jobs never get.


# The config file of a console script whose whole --config is one config key (TOOL_CONFIGS: kernel.check, kernel.bench,
# and the sweep's sweep.config), written by Snakemake itself.
rule tool_config:
    output:
        f"{RESULTS}/configs/{{tool}}.yaml",
    log:
        f"{LOGS}/configs/{{tool}}.log",
    wildcard_constraints:
        tool="|".join(TOOL_CONFIGS),
    localrule: True
    params:
        text=lambda wildcards: as_yaml(tool_config_of(TOOL_CONFIGS[wildcards.tool][0])),
    run:
        write_config(output[0], params.text, log[0])


rule kernel_check:
    input:
        config=f"{RESULTS}/configs/kernel_check.yaml",
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
        gpu_tests=str(Path(workflow.basedir) / "tests" / "kernels"),
    shell:
        "dm-kernel-check --config {input.config} --out {output} --gpu-tests {params.gpu_tests} > {log} 2>&1"


rule kernel_bench:
    input:
        config=f"{RESULTS}/configs/kernel_bench.yaml",
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
    shell:
        "if python -m deltamatch.kernels.hardware --out {output}/hardware.json --has-hopper > {log} 2>&1;"
        " then dm-kernel-bench --config {input.config} --out {output} >> {log} 2>&1; fi"
