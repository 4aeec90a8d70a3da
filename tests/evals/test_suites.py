"""Suite configs load and validate; a suite whose Hub datasets are missing fails fast, naming them."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from deltamatch.evals.suites import available_suites, load_suite


def test_shipped_suites_load():
    assert {"offline", "commonsense", "ruler_8k", "ruler_64k"} <= set(available_suites())
    commonsense = load_suite("commonsense")
    averaged = {t.task: t.average for t in commonsense.runs[0].tasks if t.average}
    assert averaged == {"lambada_openai": "acc", "piqa": "acc", "hellaswag": "acc_norm", "winogrande": "acc",
                        "arc_easy": "acc", "arc_challenge": "acc_norm", "social_iqa": "acc", "boolq": "acc",
                        "openbookqa": "acc_norm"}
    for name, length in (("ruler_8k", 8192), ("ruler_64k", 65536)):
        ruler = load_suite(name)
        assert [r.metadata["max_seq_lengths"] for r in ruler.runs] == [[length]]
        assert [(t.task, t.average) for r in ruler.runs for t in r.tasks] == [(f"dm_{name}", str(length))]


def test_no_suite_averages_ruler_over_two_lengths():
    """A suite average is one number per suite (``<suite>_avg`` in the report): RULER at 8K and at 64K in one suite
    would average two context lengths into a number the paper never reports."""
    assert "ruler" not in available_suites()
    for name in available_suites():
        suite = load_suite(name)
        groups = {t.task for run in suite.runs for t in run.tasks if t.average and re.fullmatch(r"dm_ruler_\d+k", t.task)}
        assert len(groups) <= 1, f"suite {name} averages {sorted(groups)} into one number"


def test_bad_suite_names_the_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nruns:\n  - tasks:\n      - {task: piqa, averge: acc}\n")
    with pytest.raises(ValueError, match=r"runs\[0\]\.tasks\[0\].*averge"):
        load_suite(path)
    with pytest.raises(ValueError, match="unknown suite 'nope'"):
        load_suite("nope")


def test_missing_hub_dataset_fails_fast(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "deltamatch_hybrid"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "deltamatch.evals.cli", "--checkpoint", str(ckpt), "--suite",
                           "commonsense", "--out", str(tmp_path / "out.json")],
                          capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.perf_counter() - start
    assert proc.returncode != 0
    assert "Hugging Face dataset 'baber/piqa'" in proc.stderr
    assert "'allenai/winogrande' (config 'winogrande_xl')" in proc.stderr
    assert not (tmp_path / "out.json").exists()
    assert elapsed < 60, f"took {elapsed:.0f} s to fail"


def test_ruler_groups_average_the_chosen_length_and_need_network(monkeypatch):
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    from deltamatch.evals.preflight import check_offline, set_hub_offline

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")  # restored after the test; set_hub_offline below also flips the imported switches
    set_hub_offline(True)
    suites = [load_suite("ruler_8k"), load_suite("ruler_64k")]
    manager = TaskManager(include_path=[str(p) for p in suites[0].include_paths()], include_defaults=True)
    builtin = load_yaml(manager.task_index["ruler"].yaml_path, resolve_func=False)
    for suite in suites:
        (run,) = suite.runs
        group = load_yaml(manager.task_index[run.tasks[0].task].yaml_path, resolve_func=False)
        assert group["task"] == builtin["task"]  # all thirteen of lm-eval's RULER tasks
        assert [m["metric"] for m in group["aggregate_metric_list"]] == [str(run.metadata["max_seq_lengths"][0])]
        assert all(str(run.metadata["max_seq_lengths"][0]) in
                   [m["metric"] for m in load_yaml(manager.task_index[t].yaml_path, resolve_func=False)["metric_list"]]
                   for t in group["task"])
        with pytest.raises(ValueError, match=r"baber/paul_graham_essays.*SQuAD-explorer"):
            check_offline(suite, manager)


def test_adapter_is_registered_with_lm_eval():
    import lm_eval.api.registry as registry

    from deltamatch.evals.adapter import DeltaMatchLM

    assert registry.get_model("deltamatch") is DeltaMatchLM
