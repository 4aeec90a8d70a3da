"""Paths and the run grid, computed once from the validated config. Rule files read these; no rule computes paths."""

from collections import namedtuple
from pathlib import Path

import yaml

# Registries of the package (torch-free: Snakemake's environment installs deltamatch, `pip install deltamatch[pipeline]`):
# the attention methods a config may name (not a copy of them in the schema) and the report's tables and figures.
import deltamatch.methods as METHOD_REGISTRY
import deltamatch.reports.artefacts as ARTEFACTS

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


def _load_by_path(name, relative):
    """A module of the package loaded by its path, where importing its package would load torch (deltamatch.models):
    it must need only the standard library, PyYAML and deltamatch's ground level (deltamatch/*.py)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, Path(workflow.basedir) / relative)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded  # dataclasses resolve their string annotations through sys.modules
    spec.loader.exec_module(loaded)
    return loaded


def _check_config():
    """What the schema cannot say: method names (the registry's), cross-references between sections. Errors name the
    key."""
    for i, group in enumerate(config["runs"]):
        for method in group["methods"]:
            METHOD_REGISTRY.check_public(method, f"'runs[{i}].methods'")
    METHOD_REGISTRY.check_public(config["probe"]["method"], "'probe.method'")
    for method in config["publish"]["methods"]:
        METHOD_REGISTRY.check_public(method, "'publish.methods'")
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
    recorded = settings["recorded_run"]
    if recorded and not (Path(workflow.basedir) / recorded / "provenance.json").is_file():
        raise ValueError(f"config key report.recorded_run: no {recorded}/provenance.json (a recorded run's folder)")


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
    """A rendered config's text: keys sorted, so that the same config written in another key order renders (and so
    plans) the same jobs; Snakemake reruns a job whose params text changed."""
    return yaml.safe_dump(mapping, sort_keys=True, default_flow_style=False)


def write_config(path, text, log):
    """A rendered config file, written by Snakemake itself (no job environment): temp name, then rename."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    Path(log).write_text(f"wrote {path}\n", encoding="utf-8")


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


def size_settings(size):
    """The ``per_size`` entry of a model size (``{}`` for a size it does not list)."""
    return config["per_size"].get(size, {})


def launch_of(size):
    """``launch`` for runs of ``size``: the global one, with the size's own keys on top."""
    return {**config["launch"], **size_settings(size).get("launch", {})}


def train_resources_of(size):
    """``resources.train`` for runs of ``size``: the global one, with the size's own keys on top."""
    return {**config["resources"]["train"], **size_settings(size).get("resources", {})}


TRAINER_CONFIG = _load_by_path("_deltamatch_run_config", "models/train/config.py")  # deltamatch.config, no torch
# Keys of the dm-train config that change what a run shows, not what it computes (train.progress, ...). They are left
# out of the rendered run configs, so changing one never reruns a training or eval job; dm-train reads them from the
# environment (COSMETIC_ENV), which this process sets and its jobs inherit (sbatch passes the environment on).
COSMETIC = TRAINER_CONFIG.COSMETIC


def _pop_key(mapping, dotted):
    """Remove ``a.b.c`` from nested ``mapping`` (copying the inner dicts it changes); its value, or None."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return mapping.pop(head, None)
    if not isinstance(mapping.get(head), dict):
        return None
    mapping[head] = inner = dict(mapping[head])
    return _pop_key(inner, rest)


def without_cosmetic(cfg):
    """``cfg`` (a dm-train config) without the COSMETIC keys, and those keys' values as ``{dotted: value}``."""
    cfg = dict(cfg)
    found = {}
    for key in COSMETIC:
        value = _pop_key(cfg, key)
        if value is not None:
            found[key] = value
    return cfg, found


def _cosmetic_environment():
    import json
    import os

    _, found = without_cosmetic(config["train"])
    for where, section in [(f"runs[{i}].train", g["train"]) for i, g in enumerate(config["runs"])] + [
        (f"per_size.{s}.train", v.get("train", {})) for s, v in config["per_size"].items()
    ]:
        if without_cosmetic(section)[1]:
            raise ValueError(f"config key '{where}': {', '.join(COSMETIC)} belong in the base 'train' section only")
    os.environ[TRAINER_CONFIG.COSMETIC_ENV] = json.dumps(found, sort_keys=True)


_cosmetic_environment()


def _check_sizes():
    for size in sorted({r.size for r in RUNS}):
        gpus, procs = train_resources_of(size)["gpus"], launch_of(size)["procs_per_node"]
        if gpus and gpus != procs:
            raise ValueError(
                f"config keys 'resources.train.gpus' and 'launch.procs_per_node' (with per_size.{size}): "
                f"{size} runs ask for {gpus} GPUs per node but start {procs} processes per node"
            )


_check_sizes()


def train_config(wildcards):
    """The dm-train config of one run: base train config, the size's and the group's overrides, then what the
    pipeline owns; without the cosmetic keys."""
    group = GROUPS[wildcards.variant]
    run = Run(wildcards.variant, wildcards.size, wildcards.method, int(wildcards.seed))
    base = deep_merge(config["train"], size_settings(run.size).get("train", {}))
    cfg = without_cosmetic(deep_merge(base, group["train"]))[0]
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
    fails the DAG naming the key, not a training job hours later on the cluster."""
    import os

    trainer_config = TRAINER_CONFIG
    for run in RUNS:
        try:
            parsed = trainer_config.parse(trainer_config.RunConfig, train_config(run))
            trainer_config.apply_cosmetic(parsed, os.environ[trainer_config.COSMETIC_ENV])
        except ValueError as err:
            where = f"{run.variant}/{run.size}/{run.method}/s{run.seed}"
            raise ValueError(
                f"config keys 'train' / 'runs[].train' give run {where} a bad dm-train config: {err}"
            ) from None


_check_run_configs()


def _registry_names():
    """Sizes (``CONFIGS`` of models/sizes.py), suites (evals/suites/*.yaml) and the data and sweep configs' dataclass
    fields, read from the package's source without importing it (no torch or tokenizers in Snakemake's environment)."""
    import ast

    base = Path(workflow.basedir)

    def tree(rel):
        return ast.parse((base / rel).read_text())

    sizes = next(
        [k.value for k in node.value.keys]
        for node in ast.walk(tree("models/sizes.py"))
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "CONFIGS"
    )
    suites = sorted(p.stem for p in (base / "evals" / "suites").glob("*.yaml"))
    classes = {}
    for rel in (
        "models/data/prepare.py",
        "models/data/corpus.py",
        "models/data/tokenizer.py",
        "models/data/hub.py",
        "kernels/sweep.py",
        "kernels/check.py",
        "kernels/bench.py",
        "evals/probe.py",
    ):
        for node in ast.walk(tree(rel)):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Config"):
                classes[node.name] = {
                    f.target.id: ast.unparse(f.annotation) for f in node.body if isinstance(f, ast.AnnAssign)
                }
    return sizes, suites, classes


def _check_registries():
    """Sizes, suites and data keys name what exists: a typo fails `snakemake -n`, not an eval after training."""
    sizes, suites, classes = _registry_names()
    for i, group in enumerate(config["runs"]):
        for key, known in (("sizes", sizes), ("suites", suites)):
            unknown = [x for x in group[key] if x not in known]
            if unknown:
                raise ValueError(f"config key 'runs[{i}].{key}': unknown {unknown}; choose from {known}")

    def check(mapping, cls, where):
        fields = classes[cls]
        for key, value in mapping.items():
            if key not in fields:
                raise ValueError(f"unknown config key '{where}{key}' (known keys: {', '.join(sorted(fields))})")
            if isinstance(value, dict) and fields[key] in classes:
                check(value, fields[key], f"{where}{key}.")

    check(config["data"], "PrepareConfig", "data.")
    for section, cls in TOOL_CONFIGS.values():
        check(tool_config_of(section), cls, f"{section}.")
    check(config["probe"]["config"], "ProbeConfig", "probe.config.")


TOOL_CONFIGS = {
    "sweep": ("sweep.config", "SweepConfig"),
    "kernel_check": ("kernel.check", "CheckConfig"),
    "kernel_bench": ("kernel.bench", "BenchConfig"),
}
"""``results/<name>/configs/<file>.yaml``: the config key that is a console script's whole ``--config`` file, and the
dataclass its keys are checked against (rule tool_config writes them)."""


def tool_config_of(section):
    """The mapping under a dotted config key of ``TOOL_CONFIGS``."""
    top, key = section.split(".")
    return config[top][key]


_check_registries()


def probe_config(wildcards):
    """dm-probe's config for one run: config key probe.config, its seq_len following the run's trained length."""
    cfg = dict(config["probe"]["config"])
    if cfg.get("seq_len") is None:
        cfg["seq_len"] = TRAINER_CONFIG.parse(TRAINER_CONFIG.RunConfig, train_config(wildcards)).data.seq_len
    return cfg


def init_checkpoint(wildcards):
    """The final/ folder a context-extension style run starts from, so it is trained first."""
    source = GROUPS[wildcards.variant]["init_from"]
    if source is None:
        return []
    return [f"{RESULTS}/runs/{source}/{wildcards.size}/{wildcards.method}/s{wildcards.seed}/final"]


def retry_runtime(spec, attempt):
    """Minutes of attempt ``attempt``: ``runtime`` x attempt, capped at ``max_runtime`` (the partition's MaxTime; a
    longer request would never start). A capped run goes on across attempts from its checkpoints."""
    minutes = spec["runtime"] * attempt
    return minutes if spec.get("max_runtime") is None else min(minutes, spec["max_runtime"])


def resources_of(group):
    """Snakemake resources of a rule group; a retried job gets proportionally more time (preemption, time limit).
    GPUs go in as SLURM gres, which counts per node (the plugin's `gpu` would count per job), and as `local_gpus`, a
    counting resource no SLURM plugin reads (the job-step plugin turns `gpus` into `srun --gpus`): on one machine
    `--resources local_gpus=N` runs at most N GPUs' worth of jobs at once (without it Snakemake would start every GPU
    job together on the same device)."""
    spec = config["resources"][group]
    resources = {"mem_mb": spec["mem_mb"], "runtime": lambda wildcards, attempt: retry_runtime(spec, attempt)}
    if spec["gpus"]:
        resources["gres"] = f"gpu:{spec['gpus']}"
        resources["local_gpus"] = spec["gpus"]
    return resources


def _train_resources_uniform(key):
    """Whether ``resources.train.<key>`` is zero for every size or nonzero for every size (gres and tasks must be
    present or absent for the whole train rule)."""
    values = {bool(train_resources_of(r.size)[key]) for r in RUNS}
    if len(values) > 1:
        raise ValueError(
            f"config keys 'resources.train.{key}' / 'per_size.*.resources.{key}': either every size "
            "trains with GPUs or none does"
        )
    return values.pop()


def train_rule_resources():
    """Resources of the train rule, per run size (``per_size`` on top of ``launch`` and ``resources.train``)."""
    resources = {
        "mem_mb": lambda wildcards: train_resources_of(wildcards.size)["mem_mb"],
        "runtime": lambda wildcards, attempt: retry_runtime(train_resources_of(wildcards.size), attempt),
        "nodes": lambda wildcards: launch_of(wildcards.size)["nodes"],
    }
    if _train_resources_uniform("gpus"):
        resources["gres"] = lambda wildcards: f"gpu:{train_resources_of(wildcards.size)['gpus']}"
        resources["local_gpus"] = lambda wildcards: (
            train_resources_of(wildcards.size)["gpus"] * launch_of(wildcards.size)["nodes"]
        )
    else:
        # Without GPUs, one task per node keeps SLURM from shrinking the job to one node; with gres the plugin turns
        # `tasks` into --ntasks-per-gpu, so it is left out there.
        resources["tasks"] = lambda wildcards: launch_of(wildcards.size)["nodes"]
    return resources


def launch_args(wildcards):
    """The dm-launch options of a run of this size."""
    launch = launch_of(wildcards.size)
    return " ".join(
        [f"--nodes {launch['nodes']}", f"--procs-per-node {launch['procs_per_node']}", *launch["extra_args"]]
    )


def artefact_files(artefact):
    folder = f"{REPORT}/{artefact.kind}s/{artefact.name}"
    return [f"{folder}.csv"] if artefact.kind == "table" else [f"{folder}.png", f"{folder}.csv"]


def report_parts():
    """Every table and figure of the report this config enables (each one a target of its own)."""
    return [path for a in ARTEFACTS.ARTEFACTS if ARTEFACTS.enabled(a, config) for path in artefact_files(a)]


# The two report rules' input and params functions (workflow/rules/report.smk defines RUN_SETS, PROBED, ...).
def _artefact(kind, wildcards):
    return ARTEFACTS.by_stem(kind, getattr(wildcards, kind))


def artefact_inputs(kind):
    """Input function: the files one artefact reads, by input group."""

    def inputs(wildcards):
        artefact, found = _artefact(kind, wildcards), {}
        if "runs" in artefact.inputs:
            found["runs"] = summaries(RUN_SETS[artefact.runs])
        if "evals" in artefact.inputs:
            found["evals"] = evals(RUN_SETS[artefact.runs])
        if "paper" in artefact.inputs:
            found["paper"] = PAPER
        if "probes" in artefact.inputs:
            found["probes"] = f"{RESULTS}/probes/{PROBED.variant}/{PROBED.size}/{PROBED.method}/s{PROBED.seed}.csv"
        if "kernel" in artefact.inputs:
            found["check"], found["bench"] = rules.kernel_check.output[0], rules.kernel_bench.output[0]
            found["recorded"] = [
                str(RECORDED / f"{name}.{ext}")
                for name in ("kernel_bench", "kernel_memory")
                for ext in ("csv", "md")
                if RECORDED and (RECORDED / f"{name}.{ext}").is_file()
            ]
        if "sweep" in artefact.inputs:
            found["sweep"] = rules.sweep.output[0]
        if "kernel_table" in artefact.inputs:
            found["kernel_table"] = KERNEL_TABLE
        if "recorded_run" in artefact.inputs:
            found["recorded_run"] = recorded_run_files(RECORDED_RUN)
        return found

    return inputs


def recorded_run_files(folder):
    """The files of a recorded GPU run the report reads (so that changing one rebuilds its section)."""
    results = folder / "results"
    patterns = ("runs/*/*/*/s*/summary.json", "runs/*/*/*/s*/metrics.jsonl", "probes/*/*/*/s*.csv")
    return [str(folder / "provenance.json")] + sorted(str(p) for pattern in patterns for p in results.glob(pattern))


def artefact_args(kind):
    """Params function: dm-report's arguments for one artefact, from its inputs and the registry's options."""

    def args(wildcards, input):
        artefact = _artefact(kind, wildcards)
        words = [kind, artefact.cli_name]
        for group, option in (
            ("runs", "--runs"),
            ("evals", "--evals"),
            ("probes", "--probes"),
            ("check", "--check"),
            ("bench", "--bench"),
            ("sweep", "--sweep"),
            ("kernel_table", "--kernel-table"),
            ("paper", "--paper"),
        ):
            if group in input.keys():
                words += [option, *([input[group]] if isinstance(input[group], str) else input[group])]
        if "probes" in artefact.inputs:
            words += ["--size", PROBED.size]
        if "kernel" in artefact.inputs and RECORDED:
            words += ["--recorded", str(RECORDED)]
        if "recorded_run" in artefact.inputs:
            words += ["--recorded-run", str(RECORDED_RUN)]
        options = {
            "mapping": MAPPING,
            "figure5_mapping": FIGURE5_MAPPING,
            "window": WINDOW,
            "alias": f"--alias {key_values(config['report']['metric_alias'])}",
        }
        return " ".join(words + [options[o] for o in artefact.options])

    return args


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
    namespace = config["publish"]["namespace"]
    return name if namespace is None else f"{namespace}/{name}"  # dm-publish puts a bare name under the token's user
