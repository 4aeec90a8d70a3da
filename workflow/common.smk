"""Paths and the run grid, computed once from the validated config. Rule files read these; no rule computes paths."""

from collections import namedtuple
from pathlib import Path

import yaml

RESULTS = f"results/{config['name']}"
DATA = f"{RESULTS}/data"
REPORT = f"{RESULTS}/report"
LOGS = f"{RESULTS}/logs"
BENCH = f"{RESULTS}/benchmarks"
PAPER = str(Path(workflow.basedir) / "reports" / "paper_reported.yaml")

# One training run is (variant, size, method, seed); every per-run output is laid out under this tag, which the
# report also reads back from the paths (reports/inputs.py: RUN_TAG).
TAG = "{variant}/{size}/{method}/s{seed}"
RUN = f"{RESULTS}/runs/{TAG}"

Run = namedtuple("Run", "variant size method seed")


wildcard_constraints:
    variant=r"[A-Za-z0-9_.-]+",
    size=r"[A-Za-z0-9_.-]+",
    method=r"[a-z0-9_]+",
    seed=r"\d+",
    suite=r"[A-Za-z0-9_]+",


def _check_config():
    """What the schema cannot say: cross-references between sections. Errors name the key."""
    variants = [g["variant"] for g in config["runs"]]
    if len(set(variants)) != len(variants):
        raise ValueError(f"config key 'runs': variant names must be unique, got {variants}")
    for i, group in enumerate(config["runs"]):
        source = group["init_from"]
        if source is not None and source not in variants:
            raise ValueError(f"config key 'runs[{i}].init_from': no variant named {source!r}")
    settings, probe = config["report"], config["probe"]
    if not any(r.variant == settings["main_variant"] and r.size == settings["main_size"] for r in RUNS):
        raise ValueError("config keys report.main_variant and report.main_size name no run in 'runs'")
    context = settings["context_variant"]
    if context and not any(r.variant == context and r.method == "bf16" for r in RUNS):
        raise ValueError(f"config key report.context_variant: no bf16 run of variant {context!r} in 'runs'")
    if probe["enabled"] and Run(probe["variant"], probe["size"], probe["method"], probe["seed"]) not in RUNS:
        raise ValueError("config key 'probe' names no run in 'runs'")


GROUPS = {g["variant"]: g for g in config["runs"]}
RUNS = [
    Run(g["variant"], size, method, seed)
    for g in config["runs"]
    for size in g["sizes"]
    for method in g["methods"]
    for seed in g["seeds"]
]
_check_config()


def deep_merge(base, over):
    """``over`` on top of ``base``, recursing into mappings; neither argument is modified."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def as_yaml(mapping):
    return yaml.safe_dump(mapping, sort_keys=False, default_flow_style=False)


def run_path(run, leaf=""):
    return str(Path(RESULTS, "runs", run.variant, run.size, run.method, f"s{run.seed}", leaf))


def select(variant=None, size=None, methods=None):
    return [
        r
        for r in RUNS
        if (variant is None or r.variant == variant)
        and (size is None or r.size == size)
        and (methods is None or r.method in methods)
    ]


def summaries(runs):
    return [run_path(r, "summary.json") for r in runs]


def evals(runs):
    return [
        f"{RESULTS}/evals/{r.variant}/{r.size}/{r.method}/s{r.seed}/{suite}.json"
        for r in runs
        for suite in GROUPS[r.variant]["suites"]
    ]


def key_values(mapping):
    """``{'tiny': '1.67B'}`` -> ``'tiny=1.67B'`` words for a CLI option taking KEY=VALUE pairs."""
    return " ".join(f"{k}={v}" for k, v in mapping.items())


def train_config(wildcards):
    """The dm-train config of one run: base train config, the group's overrides, then what the pipeline owns."""
    group = GROUPS[wildcards.variant]
    run = Run(wildcards.variant, wildcards.size, wildcards.method, int(wildcards.seed))
    cfg = deep_merge(config["train"], group["train"])
    model = dict(cfg.get("model", {}))
    model.update(size=run.size, attn_method=run.method)
    model["overrides"] = deep_merge(model.get("overrides", {}), group["model"])
    if group["init_from"] is not None:
        model["init_from"] = run_path(run._replace(variant=group["init_from"]), "final")
    cfg["model"] = model
    cfg["data"] = deep_merge(cfg.get("data", {}), {"dir": DATA})
    return {"run_dir": run_path(run), "seed": run.seed, **cfg}


def _check_run_configs():
    """Every run's dm-train config is valid before any job starts: a typo under ``train:`` or a group's ``train:``
    fails the DAG naming the key, not a training job hours later on the cluster. ``models/train/config.py`` is loaded
    by path (stdlib and PyYAML only): no torch import, and no deltamatch needed in Snakemake's own environment."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "_deltamatch_run_config", Path(workflow.basedir) / "models" / "train" / "config.py"
    )
    trainer_config = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = trainer_config  # dataclasses resolve their string annotations through sys.modules
    spec.loader.exec_module(trainer_config)
    for run in RUNS:
        try:
            trainer_config.parse(trainer_config.RunConfig, train_config(run))
        except ValueError as err:
            where = f"{run.variant}/{run.size}/{run.method}/s{run.seed}"
            raise ValueError(f"config keys 'train' / 'runs[].train' give run {where} a bad dm-train config: {err}") from None


_check_run_configs()


def init_checkpoint(wildcards):
    """The final/ folder a context-extension style run starts from, so it is trained first."""
    source = GROUPS[wildcards.variant]["init_from"]
    if source is None:
        return []
    return [f"{RESULTS}/runs/{source}/{wildcards.size}/{wildcards.method}/s{wildcards.seed}/final"]


def resources_of(group):
    """Snakemake resources of a rule group; a retried job gets proportionally more time (preemption, time limit).
    GPUs go in as SLURM gres, which counts per node (the plugin's `gpu` would count per job)."""
    spec = config["resources"][group]
    resources = {"mem_mb": spec["mem_mb"], "runtime": lambda wildcards, attempt: spec["runtime"] * attempt}
    if spec["gpus"]:
        resources["gres"] = f"gpu:{spec['gpus']}"
    return resources


def report_parts():
    """Every table and figure of the report (each one a target of its own)."""
    tables = ["main_1p67b", "scale", "ablations", "gains"]
    figures = ["figure1_loss", "figure1_final", "figure4_gain", "figure4_effects", "figure5_scales"]
    if config["probe"]["enabled"]:
        tables.append("table9_probes")
    if config["kernel"]["enabled"]:
        tables.append("kernel_latency")
        figures.append("kernel")
    if config["report"]["context_variant"]:
        figures.append("context_gap")
    if config["sweep"]["enabled"]:
        tables.append("sweep")
        figures.append("sweep")
    return [f"{REPORT}/tables/{t}.csv" for t in tables] + [
        f"{REPORT}/figures/{f}.{ext}" for f in figures for ext in ("png", "csv")
    ]


def report_targets():
    return report_parts() + [f"{REPORT}/index.html", f"{REPORT}/report.md", f"{REPORT}/claims.csv"]


def publish_runs():
    publish = config["publish"]
    return select(variant=config["report"]["main_variant"], methods=publish["methods"])


def publish_targets():
    if not config["publish"]["enabled"]:
        return []
    return [f"{RESULTS}/publish/{r.variant}/{r.size}/{r.method}/s{r.seed}" for r in publish_runs()]


def repo_id(wildcards):
    name = f"deltamatch-{wildcards.variant}-{wildcards.size}-{wildcards.method}-s{wildcards.seed}"
    return f"{config['publish']['namespace']}/{name}"
