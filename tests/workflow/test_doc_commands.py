"""Every command README.md and docs/*.md give (tests/doc_commands.py extracts them) is tested here, in test_docs.py or
in tests/cluster/test_slurm_doc_commands.py, by one of:

* **run**: exactly as the page writes it, in a folder laid out like a fresh clone (``.venv`` linked to this
  environment), asserting what it produces; commands that read results get ``results/default`` from the shrunk
  pipeline (config/test.yaml, built once per session), as ``make run`` would have left it;
* **dry-run**: the ``snakemake`` commands, with ``-n`` (test_docs.py);
* **cluster**: the SLURM client commands, on the real local SLURM (tests/cluster/test_slurm_doc_commands.py);
* **parse**: what needs a GPU, the network or hours: the program exists and the tool's own argument parser accepts
  the documented arguments (placeholders such as ``DIR`` or ``NAME`` filled in, ``a|b`` alternatives each), plus what
  can be checked offline (a config file validates, a suite or size name is known, a pin matches the lock);
* **fragment**: a program and one option quoted in a sentence: the option exists where the sentence says it does.

A command added to a page without a row in ``HOW`` fails ``test_every_documented_command_is_classified``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from doc_commands import ROOT, clone, documented_commands

BIN = Path(sys.executable).parent
DOCUMENTED = documented_commands()
SCRIPTS = {ep.name: ep for ep in entry_points(group="console_scripts") if ep.value.startswith("deltamatch.")}

# --- the inventory: every documented command and how it is tested --------------------------------------------------
HOW = {
    "make run": "run: `make -n run` (the whole default is CI's main job and test_pipeline.py, ~8 min)",
    "make test": "run: `make -n test` (the suite is what runs this)",
    "make kernel-check": "run: `make -n kernel-check`, its dm-kernel-check arguments parsed",
    "make test-cluster": "run: `make -n test-cluster`",
    "export PATH=.venv/bin:$PATH": "run: then the console scripts resolve to the clone's .venv",
    "snakemake --profile profiles/local results/default/report/tables/main_1p67b.csv": "dry-run",
    "snakemake --profile profiles/local -f results/default/report/tables/main_1p67b.csv": "dry-run",
    "snakemake --profile profiles/slurm --configfile config/paper.yaml": "dry-run",
    "snakemake --profile profiles/slurm --configfile=config/paper.yaml results/paper/report/tables/main_1p67b.csv":
        "dry-run",
    "snakemake --profile profiles/slurm --configfile config/paper.yaml --default-resources slurm_account=myproj "
    "slurm_partition=gpu": "dry-run",
    "snakemake -n": "dry-run: test_dag.py::test_default_dry_run plans it (and counts the jobs)",
    "snakemake --cores all --resources local_gpus=1 --configfile config/h200.yaml":
        "dry-run: test_dag.py::test_h200_dry_run_plans_every_method_on_the_569m plans it",
    "snakemake --unlock": "fragment: the cluster.md line below runs it",
    "snakemake --profile profiles/slurm ... --unlock": "run: with `...` = `--configfile config/paper.yaml`",
    "dm-publish --checkpoint results/default/runs/base/tiny/matched/s0/final --repo-id me/deltamatch-tiny-matched "
    "--data results/default/data --evals results/default/evals/base/tiny/matched/s0/offline.json "
    "--citation reports/paper_reported.yaml --dry-run --out pub/":
        "run: the folder (BF16 weights, card, model code)",
    "hf auth login": "run: with --token (its prompt needs a terminal) against a stand-in Hub (fake_hub.py)",
    "dm-publish --checkpoint results/default/runs/base/tiny/matched/s0/final --repo-id deltamatch-tiny-matched "
    "--data results/default/data --evals results/default/evals/base/tiny/matched/s0/offline.json "
    "--citation reports/paper_reported.yaml":
        "run: uploads to a stand-in Hub with the `hf auth login` token (without one: tests/models/test_publish.py::"
        "test_a_real_upload_without_hf_token_fails_fast)",
    "pip install deltamatch": "parse: the core install is tests/test_packaging.py::"
                              "test_models_and_kernels_work_with_core_dependencies_only (network here)",
    "pip install --no-deps nvidia-cudnn-frontend==1.32.0": "parse: the pin is envs/pip-gpu.lock.txt's (network)",
    "pip install tensorboard": "parse: pip exists; tests/models/train/test_train_display.py covers its absence (network)",
    "dm-sweep --out sweep.csv": "parse (the full sweep takes minutes on 2 cores; the pipeline runs it reduced)",
    "dm-sweep --spreads -1": "run: exit 2, one line naming --spreads, nothing written",
    "python benchmarks/kernel_bench.py --out benchmarks/results --memory --profile": "parse (Hopper GPU)",
    "python tools/delta_pv_probe.py --seeds 6": "parse (a minute of CPU; tests/test_delta_pv_probe.py runs it reduced)",
    "benchmarks/train_bench.py h200": "fragment: the preset parses (Hopper GPU)",
    "tools/device/profile_step.py --pins": "fragment: the option parses (Hopper GPU)",
    "dm-model-info NAME": "run: NAME = tiny; parse: every size",
    "dm-prepare-data --config config/train/data_offline.yaml": "run: the data folder",
    "dm-train --config config/train/tiny_cpu.yaml": "run: trains on that data (records with MFU); SIGTERM after the "
                                                    "first steps gives exit 143 and a checkpoint (100 steps: ~2.5 min)",
    "torchrun --nproc-per-node 8 -m deltamatch.models.train.cli --config config/train/569m_h200_8k.yaml":
        "parse (8 GPUs): torchrun's parser, the module, dm-train's parser, the config validates",
    "dm-eval --checkpoint DIR --suite offline|commonsense|ruler_8k|ruler_64k --out FILE.json [--data DIR]":
        "parse, each suite (Hub suites need the network; offline takes ~70 s here, run by test_pipeline.py)",
    "dm-eval-prefetch --suite NAME": "parse: NAME = every suite (network)",
    "dm-eval-prefetch --suite NAME --out results/paper/prefetch/NAME.json": "parse: NAME = every suite (network)",
    "dm-eval-prefetch --suite commonsense --suite ruler_8k --suite ruler_64k": "parse (network)",
    "dm-eval --checkpoint results/paper/runs/base/1.67B/matched/s0/final --suite ruler_8k --data results/paper/data "
    "--out ruler_8k.json": "parse (a 1.67B checkpoint and the Hub datasets)",
    "dm-probe --checkpoint DIR --data DIR --out FILE.csv": "run: DIR = the tiny matched run's final/ and the data",
    "dm-report table main ...": "parse: the subcommand and the table name",
    "dm-report figure figure1_loss ...": "parse: the subcommand and the figure name",
    "dm-report all --results results/default": "run: the page, self-contained",
    "python -m deltamatch.kernels.hardware": "run: exit 0, records that this machine has no Hopper GPU",
    "dm-kernel-check --gpu-tests": "fragment: dm-kernel-check's parser",
    "dm-kernel-check --cuda": "fragment: dm-kernel-check's parser (tests/kernels/test_cuda_build.py::"
                              "test_dm_kernel_check_cuda_prints_the_rows runs it)",
    "dm-publish --citation": "fragment: dm-publish's parser",
    "dm-cuda-build --out build/cuda_clock --define DM_DQ_CLOCK": "parse: the diagnostic build's macro and folder (nvcc; "
    "tests/test_dq_clock.py::test_a_diagnostic_build_needs_its_own_folder checks its guard)",
    "dm-sweep --config": "fragment: dm-sweep's parser",
    "pytest -m gpu tests/kernels tests/models": "parse: registered marker, marked tests there (they need an sm90 GPU)",
    ".venv/bin/pytest -m cluster tests/cluster": "parse: registered marker, marked tests there (the suite runs them)",
    "tests/cluster/slurm.sh install": "cluster",
    "sacctmgr -n -s list user \"$USER\" format=account%30": "cluster",
    "sinfo -s": "cluster",
    "sinfo -o \"%P %G\"": "cluster",
    "sinfo -o \"%P %l\"": "cluster",
    "squeue -u $USER -o \"%i %k %T\"": "cluster",
    "squeue -u $USER -o \"%i %j %k %T\"": "cluster",
    "scontrol ping": "cluster",
    "scontrol requeue": "fragment: tests/cluster/test_slurm_training.py requeues a training job",
    "scontrol requeue JOBID": "fragment: tests/cluster/test_slurm_training.py requeues a training job",
    "scontrol update jobid=JOBID StartTime=now": "fragment: tests/cluster/test_slurm_training.py releases it so",
    "salloc -N 2 --gres=gpu:8 --ntasks-per-node 1": "fragment: 8 GPUs per node (cluster: salloc exists)",
    "sbatch --nodes=N": "fragment: the train rule's `nodes` resource (test_dag/test_profiles)",
    "dm-launch --nodes N": "fragment: dm-launch's parser",
    "dm-launch --procs-per-node P": "fragment: dm-launch's parser",
    "dm-launch --config FILE --nodes N --procs-per-node P": "parse: N=2, P=8",
    "dm-launch --config results/paper/configs/train/base/1.67B/matched/s0.yaml --nodes 2 --procs-per-node 8":
        "parse: and the config path is the one the pipeline writes",
    "torchrun --standalone --nproc-per-node P": "fragment: dm-launch's one-node plan",
    "torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d": "fragment: dm-launch's per-node plan",
    "srun --overlap --whole --nodes N --ntasks N --ntasks-per-node 1": "fragment: dm-launch's multi-node plan",
}


def test_every_documented_command_is_classified():
    assert set(DOCUMENTED) - set(HOW) == set(), "documented commands without a test (add them to HOW)"
    assert set(HOW) - set(DOCUMENTED) == set(), "HOW rows no page documents any more"


def test_the_tests_the_inventory_names_exist():
    named = [m for how in HOW.values() for m in re.finditer(r"([\w/]*test_\w+\.py)::(\w+)", how)]
    assert len(named) >= 4
    for match in named:
        (path,) = [p for p in (ROOT / "tests").rglob(Path(match.group(1)).name) if str(p).endswith(match.group(1))]
        assert f"def {match.group(2)}(" in path.read_text(), match.group(0)


def test_the_paths_the_pages_name_exist():
    """Repository paths in inline code or links (``tests/models/train/test_faults.py``, ``[...](docs/cluster.md)``) exist;
    ``profiles/default`` is named only to say it must not (Snakemake would layer it over ``profiles/slurm``). Paths git
    ignores are outputs a command makes (``build/cuda/...`` by ``dm-cuda-build``): a fresh clone need not have them."""
    from doc_commands import ANY_FENCE, INLINE, PAGES

    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    named = set()
    for page in PAGES:
        prose = ANY_FENCE.sub("", page.read_text(encoding="utf-8"))
        for span in [*INLINE.findall(prose), *re.findall(r"\]\(([^)#:]+)\)", prose)]:
            path = " ".join(span.split())
            if " " not in path and path.split("/")[0] in tops and "/" in path and not re.search(r"[<{*]|NAME", path):
                named.add(path)
    assert len(named) >= 30
    missing = [path for path in named - {"profiles/default"} if not (ROOT / path).exists()]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *missing], cwd=ROOT, capture_output=True, text=True)
    assert sorted(set(missing) - set(ignored.stdout.split())) == []
    assert "profiles/default" in named and not (ROOT / "profiles" / "default").exists()


def test_the_pages_document_each_dm_script():
    """Every console script appears in some documented command or as a name in the prose."""
    text = "".join(page.read_text(encoding="utf-8") for page in (ROOT / "docs").glob("*.md")) + \
        (ROOT / "README.md").read_text(encoding="utf-8")
    assert [name for name in SCRIPTS if f"`{name}" not in text] == []


# --- running commands as written --------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run(command: str, work: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """``command`` through bash, as a user types it, in ``work``."""
    assert command in DOCUMENTED, f"not a documented command: {command}"
    return subprocess.run(["bash", "-c", command], cwd=work, env=_env(**env), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def work(tmp_path):
    return clone(tmp_path, with_venv=True)


@pytest.fixture
def default_results(pipeline, work):
    """The clone with ``results/default`` as the shrunk pipeline left it (checkpoints and the page left out)."""
    shutil.copytree(pipeline / "results" / "test", work / "results" / "default",
                    ignore=shutil.ignore_patterns("checkpoints", "report", ".snakemake"))
    return work


@pytest.mark.parametrize("target, recipe", [
    ("run", ".venv/bin/snakemake --profile profiles/local"),
    ("test", ".venv/bin/python -m pytest -q"),
    ("kernel-check", ".venv/bin/dm-kernel-check --out results/kernel/check.jsonl"),
    ("test-cluster", ".venv/bin/python -m pytest -q -m cluster tests/cluster"),
])
def test_make_targets_run_what_the_readme_says(work, target, recipe):
    plan = subprocess.run(["make", "-n", target], cwd=work, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert recipe in plan.stdout, plan.stdout
    if target == "kernel-check":
        parse(recipe.split()[0].rsplit("/", 1)[1], recipe.split()[1:])


def test_export_path_puts_the_clones_console_scripts_first(work):
    done = subprocess.run(["bash", "-c", "export PATH=.venv/bin:$PATH\ncommand -v snakemake dm-train dm-report"],
                          cwd=work, capture_output=True, text=True, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert "export PATH=.venv/bin:$PATH" in DOCUMENTED
    assert done.returncode == 0 and done.stdout.split() == [f".venv/bin/{n}" for n in
                                                            ("snakemake", "dm-train", "dm-report")], done.stdout


def test_unlock_command_unlocks_a_locked_clone(work):
    for command in ("snakemake --profile profiles/slurm ... --unlock",):
        locks = work / ".snakemake" / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        (locks / "0.input.lock").write_text("")
        done = _run_filled(command, command.replace("...", "--configfile config/paper.yaml"), work, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Unlocked working directory" in done.stdout + done.stderr
        assert not locks.exists() or not any(locks.iterdir())


def _run_filled(command: str, filled: str, work: Path, env: dict | None = None,
                **kw) -> subprocess.CompletedProcess:
    """``filled``: the documented ``command`` with its placeholders (``DIR``, ``...``) filled in; run as :func:`run`."""
    assert command in DOCUMENTED, f"not a documented command: {command}"
    return subprocess.run(["bash", "-c", filled], cwd=work, env=env or _env(), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, **kw)


def test_prepare_data_then_train_as_the_readme_gives_them_with_mfu_in_the_records(work):
    prepare = run("dm-prepare-data --config config/train/data_offline.yaml", work)
    assert prepare.returncode == 0, prepare.stderr[-2000:]
    data = work / "results" / "default" / "data"
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["vocab_size"] == 8192 and (data / "val_docs.jsonl").stat().st_size > 0
    assert (data / "tokenizer" / "tokenizer.json").is_file() and (data / "train" / "00000.bin").stat().st_size > 0
    # The 100 steps take minutes: stop it as SLURM's time limit would, after the first steps are recorded.
    run_dir = work / "results" / "default" / "runs" / "tiny_matched_s0"
    peak = 0.5  # TFLOP/s: the CPU has no known peak, so MFU is logged only when it is given
    proc = subprocess.Popen(["bash", "-c", "exec dm-train --config config/train/tiny_cpu.yaml"], cwd=work,
                            env=_env(DELTAMATCH_PEAK_TFLOPS=str(peak)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert "dm-train --config config/train/tiny_cpu.yaml" in DOCUMENTED
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and '"step"' not in _read(run_dir / "metrics.jsonl"):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    records = [json.loads(line) for line in _read(run_dir / "metrics.jsonl").splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    assert train and all(r["step"] >= 1 for r in train)
    # MFU = tokens/s x model FLOPs per token / peak, the FLOPs counted by hand: 6 per matmul parameter (all but the
    # embedding) and 6 x seq x heads x head_dim per attention layer (the causal half of 12)
    from deltamatch.models import HybridForCausalLM, get_config

    model = get_config("tiny", vocab_size=8192)
    embedding = 8192 * model.hidden_size
    params = sum(p.numel() for p in HybridForCausalLM(model).parameters())
    attention = sum(kind == "gqa" for kind in model.layer_pattern) * 6 * 128 * model.num_attention_heads * \
        model.head_dim
    flops = 6 * (params - embedding) + attention
    for record in train:
        assert record["mfu"] == pytest.approx(record["tokens_per_s"] * flops / (peak * 1e12), rel=1e-9), record
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith(".")], "no checkpoint"


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def test_model_info_for_every_size(work):
    from deltamatch.models import list_configs

    sizes = list_configs()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert all(f"`{size}`" in readme for size in sizes)  # the README's "Sizes:" list names each
    assert [parse("dm-model-info", [size]).name for size in sizes] == sizes
    sizes = ["tiny"]  # each process takes ~7 s here; the other sizes' numbers are tests/models/test_sizes.py's
    procs = {size: subprocess.Popen(["bash", "-c", f"dm-model-info {shlex.quote(size)}"], cwd=work, env=_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for size in sizes}
    for size, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        info = json.loads(out)
        assert info["name"] == size and info["params"] > info["non_embedding_params"] > 0
        assert 1 <= len(info["attention_layers"]) < len(info["layer_pattern"])
    assert "dm-model-info NAME" in DOCUMENTED


def test_sweep_with_a_negative_spread_is_refused_in_one_line(work):
    before = sorted(work.iterdir())
    done = run("dm-sweep --spreads -1", work, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--spreads" in done.stderr and "Traceback" not in done.stderr
    assert sorted(work.iterdir()) == before


def test_report_hardware_records_no_hopper(work):
    done = run("python -m deltamatch.kernels.hardware", work, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hopper"] is False


@pytest.mark.slow
def test_publish_dry_run_then_login_and_upload_to_a_stand_in_hub(default_results):
    """The README's publishing block in order: the dry run builds the folder; ``hf auth login`` (its token given with
    --token: the prompt needs a terminal) stores the token that the upload, run exactly as written, then uses against a
    stand-in Hub, under the token's own user."""
    from safetensors import safe_open

    from fake_hub import FakeHub

    work = default_results
    hf_home = str(work / "hf-home")
    dry, upload = (next(c for c in DOCUMENTED if c.startswith("dm-publish --checkpoint") and ("--dry-run" in c) == flag)
                   for flag in (True, False))
    done = run(dry, work, timeout=300, HF_HOME=hf_home)
    assert done.returncode == 0, done.stderr[-3000:]
    out = work / "pub"
    assert "me/deltamatch-tiny-matched" in done.stdout
    with safe_open(out / "model.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"BF16"}
    card = (out / "README.md").read_text()
    assert "model-index:" in card and "arxiv.org/abs/2609.37852" in card and "toy" in card.lower()
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"].startswith("modeling_hybrid.")
    assert (out / "modeling_hybrid.py").is_file() and (out / "tokenizer.json").is_file()

    token = "hf_standinStandinStandinStandin0000"
    with FakeHub(token=token, user="alice") as hub:
        online = dict(HF_HOME=hf_home, HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0", NO_PROXY="127.0.0.1,localhost",
                      no_proxy="127.0.0.1,localhost", HF_HUB_DISABLE_TELEMETRY="1")
        login = _run_filled("hf auth login", f"hf auth login --token {token}", work, timeout=120,
                            env=_env(**online))
        assert login.returncode == 0, login.stdout + login.stderr
        done = run(upload, work, timeout=300, **online)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert hub.unexpected == [] and hub.repos == ["alice/deltamatch-tiny-matched"]
        committed = hub.commits["alice/deltamatch-tiny-matched"]
        (metadata,) = hub.cards
    results = metadata["model-index"][0]["results"]
    assert any(m["type"] == "cross_entropy" for r in results for m in r["metrics"]) and metadata["language"] == "en"
    assert "uploaded to alice/deltamatch-tiny-matched" in done.stdout and token not in done.stdout + done.stderr
    assert committed["model.safetensors"] == (out / "model.safetensors").read_bytes()  # what the dry run showed
    assert {"config.json", "modeling_hybrid.py", "tokenizer.json"} <= set(committed)
    assert b"alice/deltamatch-tiny-matched" in committed["README.md"] and token.encode() not in committed["README.md"]


@pytest.mark.slow
def test_probe_and_report_on_a_finished_results_folder(default_results):
    work = default_results
    final = "results/default/runs/base/tiny/matched/s0/final"
    command = "dm-probe --checkpoint DIR --data DIR --out FILE.csv"
    done = _run_filled(command, f"dm-probe --checkpoint {final} --data results/default/data --out FILE.csv", work,
                       timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    import pandas as pd

    probes = pd.read_csv(work / "FILE.csv")
    assert set(probes["delta"]) == {"stale", "consistent", "matched"}
    report = run("dm-report all --results results/default", work, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    page = (work / "results/default/report/index.html").read_text()
    assert "data:image/png;base64," in page and 'src="figures/' not in page
    for table in ("main_1p67b", "scale", "table9_probes", "sweep", "gains"):
        assert (work / f"results/default/report/tables/{table}.csv").is_file(), table


@pytest.mark.parametrize("command, marker", [
    ("pytest -m gpu tests/kernels tests/models", "gpu"),
    (".venv/bin/pytest -m cluster tests/cluster", "cluster"),
])
def test_documented_pytest_selections_name_registered_markers_and_marked_tests(command, marker):
    program, option, selected, *paths = _words(command)
    assert program.endswith("pytest") and (BIN / "pytest").exists() and (option, selected) == ("-m", marker)
    assert any(line.startswith(f'"{marker}:') for line in
               (ROOT / "pyproject.toml").read_text().replace("    ", "").splitlines())  # --strict-markers
    marked = [f for path in paths for f in (ROOT / path).rglob("test_*.py")
              if f"pytest.mark.{marker}" in f.read_text()]
    assert len(marked) >= 2, marked


# --- parsing what cannot run here ----------------------------------------------------------------------------------


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace):
        super().__init__(parser.prog)
        self.parser, self.namespace = parser, namespace


@contextmanager
def _stop_after_parsing():
    """The first top-level ``parse_args`` parses for real, then stops the program before it does anything."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise _Parsed(self, original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_and_stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def _main_of(program: str):
    if program in SCRIPTS:
        return SCRIPTS[program].load()
    path = ROOT / program
    assert path.is_file(), f"{program}: neither a console script nor a file of the repository"
    spec = importlib.util.spec_from_file_location(f"_doc_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def parse(program: str, argv: list[str]) -> argparse.Namespace:
    """``program argv`` through the program's own argument parser, stopped right after it (SystemExit 2 fails)."""
    main = _main_of(program)
    with _stop_after_parsing(), pytest.raises(_Parsed) as parsed:
        main(argv)
    return parsed.value.namespace


def _suites() -> list[str]:
    from deltamatch.evals.suites import available_suites

    return available_suites()


def _words(command: str) -> list[str]:
    assert command in DOCUMENTED, f"not a documented command: {command}"
    return shlex.split(command)


def test_sweep_and_benchmarks_parse():
    args = parse("dm-sweep", _words("dm-sweep --out sweep.csv")[1:])
    assert args.out == "sweep.csv"
    python, script, *argv = _words("python benchmarks/kernel_bench.py --out benchmarks/results --memory --profile")
    args = parse(script, argv)
    assert args.out == "benchmarks/results" and args.memory is True and args.profile is True
    script, *argv = _words("benchmarks/train_bench.py h200")  # a preset named in a sentence; --out is required
    assert parse(script, [*argv, "--out", "x.json"]).preset == "h200"
    python, script, *argv = _words("python tools/delta_pv_probe.py --seeds 6")
    assert parse(script, argv).seeds == 6
    script, *argv = _words("tools/device/profile_step.py --pins")  # an option named in a sentence
    assert str(parse(script, ["bf16:4", *argv, "pins.json"]).pins) == "pins.json"


def test_options_named_in_sentences_parse(tmp_path):
    assert parse("dm-sweep", [*_words("dm-sweep --config")[1:], "sweep.yaml"]).config == "sweep.yaml"
    assert parse("dm-kernel-check", [*_words("dm-kernel-check --gpu-tests")[1:], "tests/kernels"]).gpu_tests
    assert parse("dm-kernel-check", _words("dm-kernel-check --cuda")[1:]).cuda
    clock = parse("dm-cuda-build", _words("dm-cuda-build --out build/cuda_clock --define DM_DQ_CLOCK")[1:])
    assert clock.define == ["DM_DQ_CLOCK"] and clock.out == "build/cuda_clock"
    args = parse("dm-publish", ["--checkpoint", "ckpt", "--repo-id", "me/x", *_words("dm-publish --citation")[1:],
                                "reports/paper_reported.yaml", "--dry-run", "--out", str(tmp_path)])
    assert args.citation == "reports/paper_reported.yaml"


def test_torchrun_line_parses_and_its_config_validates():
    from torch.distributed.run import parse_args as torchrun_args

    from deltamatch.models.train.config import RunConfig, load_yaml

    words = _words("torchrun --nproc-per-node 8 -m deltamatch.models.train.cli --config "
                   "config/train/569m_h200_8k.yaml")
    assert shutil.which("torchrun", path=str(BIN))
    args = torchrun_args(words[1:])
    assert args.module and args.nproc_per_node == "8" and importlib.util.find_spec(args.training_script)
    assert parse("dm-train", args.training_script_args).config == "config/train/569m_h200_8k.yaml"
    config = load_yaml(RunConfig, ROOT / "config/train/569m_h200_8k.yaml")
    assert config.model.size == "569M"


def test_eval_commands_parse_with_known_suites():
    suites = _suites()
    template = _words("dm-eval --checkpoint DIR --suite offline|commonsense|ruler_8k|ruler_64k --out FILE.json "
                      "[--data DIR]")
    alternatives = template[template.index("--suite") + 1].split("|")
    assert set(alternatives) <= set(suites)
    for suite in alternatives:
        args = parse("dm-eval", ["--checkpoint", "DIR", "--suite", suite, "--out", "FILE.json", "--data", "DIR"])
        assert args.suite == suite and args.data == "DIR" and not args.online
    args = parse("dm-eval", _words("dm-eval --checkpoint results/paper/runs/base/1.67B/matched/s0/final --suite "
                                   "ruler_8k --data results/paper/data --out ruler_8k.json")[1:])
    assert args.suite in suites and args.out == "ruler_8k.json"
    prefetch = parse("dm-eval-prefetch", _words("dm-eval-prefetch --suite commonsense --suite ruler_8k --suite "
                                                "ruler_64k")[1:])
    assert set(prefetch.suite) == {"commonsense", "ruler_8k", "ruler_64k"} <= set(suites)
    for template in ("dm-eval-prefetch --suite NAME", "dm-eval-prefetch --suite NAME --out "
                     "results/paper/prefetch/NAME.json"):
        for suite in suites:
            args = parse("dm-eval-prefetch", [w.replace("NAME", suite) for w in _words(template)[1:]])
            assert args.suite == [suite]


def test_report_subcommands_take_the_documented_names():
    for command in ("dm-report table main ...", "dm-report figure figure1_loss ..."):
        program, sub, name, dots = _words(command)
        main = _main_of(program)
        with _stop_after_parsing(), pytest.raises(SystemExit) as exited:
            main([sub, name, "--help"])
        assert exited.value.code == 0
        subparsers = next(a for a in _captured_parser(main)._actions if isinstance(a, argparse._SubParsersAction))
        positional = next(a for a in subparsers.choices[sub]._actions if a.dest == "name")
        assert name in positional.choices


def _captured_parser(main) -> argparse.ArgumentParser:
    with _stop_after_parsing(), pytest.raises(_Parsed) as parsed:
        main(["all", "--results", "results/default"])
    return parsed.value.parser


def test_pip_lines_match_the_locks():
    words = _words("pip install --no-deps nvidia-cudnn-frontend==1.32.0")
    lock = (ROOT / "envs/pip-gpu.lock.txt").read_text()
    assert f"# no-deps: {words[-1]}" in lock
    assert (BIN / "pip").exists()
    _words("pip install tensorboard")
    display = (ROOT / "tests/models/train/test_train_display.py").read_text()
    assert "def test_tensorboard_without_the_package_fails_before_training" in display
    _words("pip install deltamatch")
    packaging = (ROOT / "tests/test_packaging.py").read_text()
    assert "def test_models_and_kernels_work_with_core_dependencies_only" in packaging


# --- dm-launch: the documented arguments, and the commands the docs say it builds -------------------------------


def test_launch_lines_parse():
    for command in ("dm-launch --config FILE --nodes N --procs-per-node P", "dm-launch --nodes N",
                    "dm-launch --procs-per-node P"):
        argv = [{"N": "2", "P": "8"}.get(w, w) for w in _words(command)[1:]]
        if "--config" not in argv:
            argv += ["--config", "FILE"]
        args = parse("dm-launch", argv)
        assert (args.nodes, args.procs) == (2 if "--nodes" in argv else 1, 8 if "--procs-per-node" in argv else 1)
    command = ("dm-launch --config results/paper/configs/train/base/1.67B/matched/s0.yaml --nodes 2 "
               "--procs-per-node 8")
    args = parse("dm-launch", _words(command)[1:])
    assert (args.nodes, args.procs) == (2, 8)
    # the path is the one the train rule writes: results/<name>/configs/train/{variant}/{size}/{method}/s{seed}.yaml
    common = (ROOT / "workflow" / "common.smk").read_text()
    assert 'TAG = "{variant}/{size}/{method}/s{seed}"' in common and 'RESULTS = f"results/{' in common
    assert 'f"{RESULTS}/configs/train/{TAG}.yaml"' in (ROOT / "workflow" / "rules" / "train.smk").read_text()


def _options(words: list[str]) -> list[str]:
    """``--a=b`` and ``--a b`` alike: the words with ``=`` split off, the program name dropped."""
    return [part for word in words[1:] for part in (word.split("=", 1) if word.startswith("--") else [word])]


def _in_order(needle: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(any(word == other for other in it) for word in needle)


def test_the_launch_commands_cluster_md_describes_are_the_ones_dm_launch_builds(tmp_path, monkeypatch):
    from deltamatch.models.train import launch

    config = tmp_path / "c.yaml"
    config.write_text("{}")
    fill = {"N": "2", "P": "8"}
    one_node = launch.local_command(launch.LaunchConfig(config=str(config), nodes=1, procs_per_node=8))
    documented = [fill.get(w, w) for w in _words("torchrun --standalone --nproc-per-node P")]
    assert "torch.distributed.run" in one_node and _in_order(_options(documented), _options(one_node)), one_node
    cfg = launch.LaunchConfig(config=str(config), nodes=2, procs_per_node=8)
    srun = launch.srun_command(cfg, "77")
    documented = [fill.get(w, w) for w in _words("srun --overlap --whole --nodes N --ntasks N --ntasks-per-node 1")]
    assert srun[0] == "srun" and _in_order(_options(documented), _options(srun)), srun
    monkeypatch.setattr(launch, "node_address", lambda node: "10.0.0.1")
    node = launch.node_command(cfg, {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]",
                                     "SLURM_NODEID": "0", "SLURM_PROCID": "0"})
    documented = [fill.get(w, w) for w in _words("torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d")]
    assert "torch.distributed.run" in node and _in_order(_options(documented), _options(node)), node


# --- the README's publish-only recipe ----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_publish_only_recipe_plans_only_the_publish_jobs(pipeline, snakemake, stats, tmp_path):
    """"copy the config you ran, change only `publish: {dry_run: false}` ... and rerun the same command with
    `--configfile=` that copy: only the publish jobs run (`-n` shows it first)"."""
    import yaml

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "change only `publish: {dry_run: false}`" in readme and "`--configfile=` that copy" in readme
    # the copy, edited as a person does: one line changed, the rest (key order included) as it was
    ran = (ROOT / "config" / "test.yaml").read_text()
    copy = tmp_path / "upload.yaml"
    copy.write_text(ran.replace("publish: {methods: [matched]}", "publish: {methods: [matched], dry_run: false}"))
    assert copy.read_text() != ran and yaml.safe_load(copy.read_text())["publish"]["dry_run"] is False
    plan = snakemake("-n", f"--configfile={copy}", workdir=pipeline)
    assert plan.returncode == 0, plan.output[-3000:]
    assert stats(plan.output) == {"publish": 1, "all": 1, "total": 2}, plan.output[-3000:]
