"""The pipeline's DAG through the real snakemake: dry runs of the default and paper configs, lint, config validation,
and the rendered per-run configs parsed by the trainer's own config classes."""

import yaml


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
    assert done.returncode != 0 and "'fp4' is not one of" in done.output
    dangling = _bad(tmp_path, "name: bad\nruns:\n  - {variant: base}\n  - {variant: ext, init_from: nowhere}\n")
    done = snakemake("-n", "--configfile", str(dangling), workdir=tmp_path)
    assert done.returncode != 0 and "runs[1].init_from" in done.output
    trainer = _bad(tmp_path, "name: bad\nruns:\n  - {variant: base, train: {optim: {lr: 1e-3, momentm: 0.9}}}\n")
    done = snakemake("-n", "--configfile", str(trainer), workdir=tmp_path)
    assert done.returncode != 0 and "unknown config key 'optim.momentm'" in done.output
    assert "run base/tiny/bf16/s0" in done.output


def test_registry_names_are_checked_at_the_dry_run(snakemake, tmp_path):
    """Suites, sizes and data keys that do not exist fail `snakemake -n` naming the key (issue 18), not an eval job
    after training or a misleading report error."""
    cases = {
        "name: bad\nruns:\n  - {variant: base, suites: [offline, comonsense]}\n":
            ["config key 'runs[0].suites': unknown ['comonsense']", "'commonsense'"],
        "name: bad\nruns:\n  - {variant: base, sizes: [tiny, huge]}\n":
            ["config key 'runs[0].sizes': unknown ['huge']", "'1.67B'"],
        "name: bad\ndata: {corpus: {max_byte: 1000}}\n": ["unknown config key 'data.corpus.max_byte'", "max_bytes"],
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
    done = snakemake("-n", "--configfile", str(root / "config" / "h200.yaml"), "--cores", "16", workdir=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    counts = stats(done.stdout)
    h200 = yaml.safe_load((root / "config" / "h200.yaml").read_text())
    runs = _runs(h200)
    assert {method for _, _, method, _ in runs} == {"bf16", "stale", "consistent", "matched", "cudnn_fp8"}
    assert {size for _, size, _, _ in runs} == {"569M"}
    assert counts["train"] == counts["eval"] == 5 and counts["probe"] == counts["kernel_bench"] == 1
    assert "results/h200/report/index.html" in done.stdout
