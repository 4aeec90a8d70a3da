"""The pipeline's DAG through the real snakemake: dry runs of the default and paper configs, lint, config validation,
and the rendered per-run configs parsed by the trainer's own config classes."""

import re
from pathlib import Path

import yaml

ROOT_DIR = Path(__file__).resolve().parents[2]


def _runs(config):
    return [(g["variant"], size, method, seed) for g in config["runs"]
            for size in g["sizes"] for method in g["methods"] for seed in g["seeds"]]


def test_default_dry_run(snakemake, stats, root, tmp_path):
    done = snakemake("-n", "--cores", "2", workdir=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    counts = stats(done.stdout)
    default = yaml.safe_load((root / "config" / "default.yaml").read_text())
    runs = _runs(default)
    assert counts["train"] == len(runs) == 4 and counts["eval"] == len(runs)
    assert counts["prepare_data"] == counts["probe"] == counts["render"] == counts["kernel_bench"] == 1
    assert counts["publish"] == 1  # publish.methods: [matched]
    assert "results/default/report/index.html" in done.stdout
    # the recorded H200 pipeline run (report.recorded_run) has its own section, read from the committed folder
    for part in ("tables/recorded_run.csv", "tables/recorded_run_probes.csv", "figures/recorded_run.png"):
        assert f"results/default/report/{part}" in done.stdout


def test_paper_dry_run(snakemake, stats, root, tmp_path):
    profile = root / "profiles" / "slurm"
    extra = ["--profile", str(profile)] if (profile / "config.yaml").is_file() else ["--cores", "8"]
    done = snakemake("-n", "--configfile", str(root / "config" / "paper.yaml"), *extra, workdir=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    counts = stats(done.stdout)
    paper = yaml.safe_load((root / "config" / "paper.yaml").read_text())
    groups = {g["variant"]: g for g in paper["runs"]}
    runs = _runs(paper)
    assert counts["train"] == len(runs)
    assert counts["eval"] == sum(len(groups[v].get("suites", [])) for v, *_ in runs)
    assert {"569M", "1.67B", "5.29B", "2.58B-gqa"} <= {size for _, size, _, _ in runs}
    base = [r for r in runs if r[0] == "base"]
    assert len(base) == 3 * 5 * 2
    assert {v for v, *_ in runs} >= {"no_qk_norm", "nope", "head_dim_256", "context_64k", "muon", "mla", "kda",
                                      "mamba2", "gqa"}
    # the paper config replaces the default rather than merging into it: no tiny run, no offline corpus
    assert "results/paper/runs/base/tiny" not in done.stdout and "results/default" not in done.stdout


def test_rendered_configs_are_valid_trainer_and_data_configs(snakemake, root, tmp_path):
    from deltamatch.models.data.prepare import PrepareConfig
    from deltamatch.models.train.config import RunConfig, load_yaml

    targets = ["results/paper/configs/data.yaml", "results/paper/configs/train/mla/1.67B/matched/s0.yaml",
               "results/paper/configs/train/context_64k/1.67B/stale/s1.yaml",
               "results/paper/configs/train/base/5.29B/cudnn_fp8/s1.yaml"]
    done = snakemake(*targets, "--cores", "1", "--configfile", str(root / "config" / "paper.yaml"), workdir=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    data = load_yaml(PrepareConfig, tmp_path / targets[0])
    assert data.source == "hub" and data.out_dir == "results/paper/data"
    mla = load_yaml(RunConfig, tmp_path / targets[1])
    assert mla.model.overrides == {"attn_mixer": "mla"} and mla.model.attn_method == "matched"
    assert mla.run_dir == "results/paper/runs/mla/1.67B/matched/s0" and mla.data.dir == "results/paper/data"
    extension = load_yaml(RunConfig, tmp_path / targets[2])
    assert extension.model.init_from == "results/paper/runs/base/1.67B/stale/s1/final"
    assert extension.data.seq_len == 65536 and extension.optim.lr == 3.0e-5 and extension.seed == 1
    assert extension.optim.weight_decay == 0.1  # the group's overrides merge into the base train config
    big = load_yaml(RunConfig, tmp_path / targets[3])
    assert big.model.size == "5.29B" and big.train.steps == 28610


def test_tool_configs_are_the_typed_sections_and_the_probe_follows_the_trained_length(snakemake, root, tmp_path):
    """Each console script's --config file is written from its typed config section (no free argument lists), and
    dm-probe's length follows the probed run's trained length unless probe.config sets it."""
    from deltamatch.config import read_yaml

    test = yaml.safe_load((root / "config" / "test.yaml").read_text())
    test["kernel"] = {"check": {"head_dims": [64], "causal": "yes"}, "bench": {"seq_lens": [4096], "memory": True}}
    config = tmp_path / "tools.yaml"
    config.write_text(yaml.safe_dump(test))
    targets = ["results/test/configs/kernel_check.yaml", "results/test/configs/kernel_bench.yaml",
               "results/test/configs/probe/base/tiny/bf16/s0.yaml"]
    done = snakemake(*targets, "--cores", "1", "--configfile", str(config), workdir=tmp_path)
    assert done.returncode == 0, done.output[-3000:]
    check, bench, probe = (read_yaml(tmp_path / t) for t in targets)
    assert check == {"head_dims": [64], "causal": "yes"} and bench == {"seq_lens": [4096], "memory": True}
    assert probe == {"seq_len": test["train"]["data"]["seq_len"]}
    test["probe"]["config"] = {"seq_len": 48, "batch_size": 1}
    config.write_text(yaml.safe_dump(test))
    done = snakemake(targets[2], "--cores", "1", "--configfile", str(config), workdir=tmp_path)
    assert done.returncode == 0 and read_yaml(tmp_path / targets[2]) == {"batch_size": 1, "seq_len": 48}


def test_lint_is_clean(snakemake, tmp_path):
    done = snakemake("--lint", workdir=tmp_path)
    assert "Lints for" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert done.returncode == 0


def _bad(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


def test_bad_config_fails_naming_the_key(snakemake, tmp_path):
    typo = _bad(tmp_path, "name: bad\nruns:\n  - {variant: base, sizes: [tiny], methods: [bf16], sedes: [0]}\n")
    done = snakemake("-n", "--configfile", str(typo), workdir=tmp_path)
    assert done.returncode != 0 and "'sedes' was unexpected" in done.output
    wrong = _bad(tmp_path, "name: bad\nresources: {train: {threads: two}}\n")
    done = snakemake("-n", "--configfile", str(wrong), workdir=tmp_path)
    assert done.returncode != 0 and "'two' is not of type 'integer'" in done.output and "threads" in done.output
    method = _bad(tmp_path, "name: bad\nruns:\n  - {variant: base, methods: [fp4]}\n")
    done = snakemake("-n", "--configfile", str(method), workdir=tmp_path)
    assert done.returncode != 0 and "config key 'runs[0].methods': unknown attention method 'fp4'" in done.output
    dangling = _bad(tmp_path, "name: bad\nruns:\n  - {variant: base}\n  - {variant: ext, init_from: nowhere}\n")
    done = snakemake("-n", "--configfile", str(dangling), workdir=tmp_path)
    assert done.returncode != 0 and "runs[1].init_from" in done.output
    trainer = _bad(tmp_path, "name: bad\nruns:\n  - {variant: base, train: {optim: {lr: 1e-3, momentm: 0.9}}}\n")
    done = snakemake("-n", "--configfile", str(trainer), workdir=tmp_path)
    assert done.returncode != 0 and "unknown config key 'optim.momentm'" in done.output
    assert "run base/tiny/bf16/s0" in done.output
    recorded = _bad(tmp_path, "name: bad\nreport: {recorded_run: benchmarks/results/nowhere}\n")
    done = snakemake("-n", "--configfile", str(recorded), workdir=tmp_path)
    assert done.returncode != 0 and "config key report.recorded_run: no benchmarks/results/nowhere/provenance.json" \
        in done.output


def test_registry_names_are_checked_at_the_dry_run(snakemake, tmp_path):
    """Suites, sizes and data keys that do not exist fail `snakemake -n` naming the key (issue 18), not an eval job
    after training or a misleading report error."""
    cases = {
        "name: bad\nruns:\n  - {variant: base, suites: [offline, comonsense]}\n":
            ["config key 'runs[0].suites': unknown ['comonsense']", "'commonsense'"],
        "name: bad\nruns:\n  - {variant: base, sizes: [tiny, huge]}\n":
            ["config key 'runs[0].sizes': unknown ['huge']", "'1.67B'"],
        "name: bad\ndata: {corpus: {max_byte: 1000}}\n": ["unknown config key 'data.corpus.max_byte'", "max_bytes"],
        "name: bad\nsweep: {config: {head: 2}}\n": ["unknown config key 'sweep.config.head'", "heads"],
        "name: bad\nkernel: {bench: {memroy: true}}\n": ["unknown config key 'kernel.bench.memroy'", "memory"],
        "name: bad\nkernel: {check: {head_dim: [64]}}\n": ["unknown config key 'kernel.check.head_dim'", "head_dims"],
        "name: bad\nprobe: {config: {seqlen: 64}}\n": ["unknown config key 'probe.config.seqlen'", "seq_len"],
        "name: bad\nevals: {extra_args: [--limit, '1']}\n": ["extra_args"],
    }
    for text, expected in cases.items():
        done = snakemake("-n", "--configfile", str(_bad(tmp_path, text)), workdir=tmp_path)
        assert done.returncode != 0 and all(e in done.output for e in expected), done.output[-2000:]


def test_every_schema_key_has_a_description_and_a_default(root):
    schema = yaml.safe_load((root / "workflow" / "schemas" / "config.schema.yaml").read_text())
    missing = []

    def walk(node, path):
        node = schema["$defs"][node["$ref"].split("/")[-1]] | node if "$ref" in node else node
        for key, sub in node.get("properties", {}).items():
            where = f"{path}.{key}" if path else key
            if "description" not in sub or ("default" not in sub and key != "variant"):
                missing.append(where)
            walk(sub, where)
        if "items" in node and isinstance(node["items"], dict):
            walk(node["items"], f"{path}[]")

    walk(schema, "")
    assert missing == []


def test_h200_dry_run_plans_every_method_on_the_569m(snakemake, stats, root, tmp_path):
    done = snakemake("-n", "--configfile", str(root / "config" / "h200.yaml"), "--cores", "16", "--resources",
                     "local_gpus=1", workdir=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    # every job that asks SLURM for a GPU also counts against `--resources local_gpus=N` on one machine (on the H200
    # four evaluations once started together on the one GPU), under a name no SLURM plugin turns into `srun --gpus`
    resources = [line for line in done.stdout.splitlines() if line.strip().startswith("resources:")]
    gpu_jobs = [line for line in resources if "gres=gpu:" in line]
    assert len(gpu_jobs) >= 12 and all("local_gpus=1" in line for line in gpu_jobs), gpu_jobs
    assert all("local_gpus=" not in line for line in resources if "gres=gpu:" not in line)
    assert not any(re.search(r"\b(gpus|gpu|nvidia_gpu)=", line.replace("local_gpus=", "")) for line in resources)
    counts = stats(done.stdout)
    h200 = yaml.safe_load((root / "config" / "h200.yaml").read_text())
    runs = _runs(h200)
    assert {method for _, _, method, _ in runs} == {"bf16", "stale", "consistent", "matched", "cudnn_fp8"}
    assert {size for _, size, _, _ in runs} == {"569M"}
    assert counts["train"] == counts["eval"] == 5 and counts["probe"] == counts["kernel_bench"] == 1
    assert "results/h200/report/index.html" in done.stdout


def _train_jobs(output):
    """{run dir: (resources line, shell command)} of the train jobs of a dry run."""
    jobs = {}
    for block in output.split("rule train:")[1:]:
        lines = block.splitlines()
        resources = next(line for line in lines if line.strip().startswith("resources:"))
        command = next(line for line in lines if "dm-launch" in line)
        jobs[command.split("--config ")[1].split()[0]] = (resources, command)
    return jobs


def test_paper_jobs_are_sized_per_model(snakemake, root, tmp_path):
    paper = yaml.safe_load((root / "config" / "paper.yaml").read_text())
    targets = [f"results/paper/runs/base/{size}/matched/s0/summary.json" for size in ("569M", "1.67B", "5.29B")]
    done = snakemake("-n", *targets, "--profile", str(root / "profiles" / "slurm"),
                     f"--configfile={root / 'config' / 'paper.yaml'}", workdir=tmp_path)
    assert done.returncode == 0, done.output
    jobs = {path.split("/")[-3]: job for path, job in _train_jobs(done.stdout).items()}
    cap = paper["resources"]["train"]["max_runtime"]
    for size, (resources, command) in jobs.items():
        own = paper["per_size"][size]
        nodes = own.get("launch", {}).get("nodes", paper["launch"]["nodes"])
        assert f"nodes={nodes}," in resources and f"--nodes {nodes} --procs-per-node 8" in command
        assert f"runtime={own['resources']['runtime']}," in resources and own["resources"]["runtime"] <= cap
        assert "gres=gpu:8" in resources
    assert set(jobs) == {"569M", "1.67B", "5.29B"} and jobs["569M"][0] != jobs["5.29B"][0]


def test_per_size_train_settings_reach_the_run_config(snakemake, root, tmp_path):
    from deltamatch.models.train.config import RunConfig, load_yaml

    targets = {size: f"results/paper/configs/train/base/{size}/matched/s0.yaml" for size in ("569M", "5.29B")}
    done = snakemake(*targets.values(), "--cores", "1", f"--configfile={root / 'config' / 'paper.yaml'}",
                     workdir=tmp_path)
    assert done.returncode == 0, done.output
    small, big = (load_yaml(RunConfig, tmp_path / targets[s]) for s in ("569M", "5.29B"))
    assert not small.train.activation_checkpointing and big.train.activation_checkpointing
    # the global batch stays 2^20 tokens a step on each size's nodes x 8 GPUs
    for run, nodes in ((small, 1), (big, 8)):
        assert run.train.micro_batch * run.train.grad_accum * nodes * 8 * run.data.seq_len == 2**20


def _retry_runtime():
    """``retry_runtime`` as common.smk defines it (its file is Snakemake syntax, not importable)."""
    import re

    text = (ROOT_DIR / "workflow" / "common.smk").read_text()
    source = re.search(r"^def retry_runtime\(.*?(?=^\S)", text, re.M | re.S).group(0)
    scope = {}
    exec(source, scope)
    return scope["retry_runtime"]


def test_retries_ask_for_more_time_up_to_the_partition_maximum():
    retry_runtime = _retry_runtime()
    spec = {"runtime": 1680, "max_runtime": 2880}
    assert [retry_runtime(spec, a) for a in (1, 2, 3)] == [1680, 2880, 2880]
    assert retry_runtime({"runtime": 60, "max_runtime": None}, 3) == 180


def test_a_size_with_gpus_unlike_its_processes_fails_naming_the_keys(snakemake, tmp_path):
    bad = _bad(tmp_path, "name: bad\nper_size: {tiny: {resources: {gpus: 4}}}\n")
    done = snakemake("-n", "--configfile", str(bad), workdir=tmp_path)
    assert done.returncode != 0 and "per_size.tiny" in done.output and "launch.procs_per_node" in done.output


def test_snakefmt_is_clean(root):
    import subprocess
    import sys

    snakefmt = Path(sys.executable).parent / "snakefmt"  # pinned in envs/pip-cpu.lock.txt
    done = subprocess.run([str(snakefmt), "--check", "."], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
