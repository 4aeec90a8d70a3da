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
