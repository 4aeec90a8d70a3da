"""Suite configs load and validate; a suite whose Hub datasets are missing fails fast, naming them."""

import json
import os
import subprocess
import sys
import time

import pytest

from deltamatch.evals.suites import available_suites, load_suite


def test_shipped_suites_load():
    assert {"offline", "commonsense", "ruler"} <= set(available_suites())
    commonsense = load_suite("commonsense")
    averaged = {t.task: t.average for t in commonsense.runs[0].tasks if t.average}
    assert averaged == {"lambada_openai": "acc", "piqa": "acc", "hellaswag": "acc_norm", "winogrande": "acc",
                        "arc_easy": "acc", "arc_challenge": "acc_norm", "social_iqa": "acc", "boolq": "acc",
                        "openbookqa": "acc_norm"}
    ruler = load_suite("ruler")
    assert [r.metadata["max_seq_lengths"] for r in ruler.runs] == [[8192], [65536]]
    assert [r.tasks[0].average for r in ruler.runs] == ["8192", "65536"]


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
    suite = load_suite("ruler")
    manager = TaskManager(include_path=[str(p) for p in suite.include_paths()], include_defaults=True)
    builtin = load_yaml(manager.task_index["ruler"].yaml_path, resolve_func=False)
    for run in suite.runs:
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
