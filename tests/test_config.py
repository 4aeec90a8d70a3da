"""One YAML -> dataclass loader (deltamatch/config.py) for every config file: the trainer's, the data build's and the
evaluation suites' errors come from the same place and name the same way."""

import re

import pytest

from deltamatch.config import load_yaml, parse
from deltamatch.evals.suites import Suite, load_suite
from deltamatch.models.data.prepare import PrepareConfig
from deltamatch.models.train.config import RunConfig

CASES = {
    "train": (RunConfig, "run_dir: r\noptim: {lr: 1e-3, momentm: 0.9}\n", "optim.momentm"),
    "data": (PrepareConfig, "out_dir: d\ncorpus: {max_byte: 10}\n", "corpus.max_byte"),
    "suite": (Suite, "name: s\nruns:\n  - tasks: [{task: t, averge: acc}]\n", "runs[0].tasks[0].averge"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_an_unknown_key_is_named_by_the_one_loader(kind, tmp_path):
    cls, text, key = CASES[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"unknown config key '{key}'")):
        load_suite(path) if kind == "suite" else load_yaml(cls, path)


def test_types_and_the_yaml_float_quirk():
    config = parse(RunConfig, {"run_dir": "r", "optim": {"lr": "3e-4"}, "seed": 3})
    assert config.optim.lr == 3e-4 and config.seed == 3
    for bad, message in (({"seed": True}, "'seed': expected int"), ({"optim": {"lr": "inf"}}, "finite float"),
                         ({"train": {"device": "tpu"}}, r"'train.device': expected one of")):
        with pytest.raises(ValueError, match=message):
            parse(RunConfig, {"run_dir": "r", **bad})


def test_suite_checks_beyond_types(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nruns:\n  - tasks: [{task: t, average: 8192, limit: 0}]\n")
    with pytest.raises(ValueError, match="limit must be >= 1"):
        load_suite(path)
    path.write_text("name: s\nruns:\n  - tasks: [{task: t, average: 8192}]\n")
    assert load_suite(path).runs[0].tasks[0].average == "8192"
    path.write_text("name: s\nruns: []\n")
    with pytest.raises(ValueError, match="non-empty list of runs"):
        load_suite(path)
