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


def test_config_file_and_flags_give_one_config(tmp_path):
    """dm-sweep, dm-probe and dm-kernel-bench read ``--config FILE`` through the one loader; a flag the user sets
    overrides the file's value, a flag left out keeps it."""
    from deltamatch.config import load_with_flags
    from deltamatch.evals.probe import ProbeConfig
    from deltamatch.kernels.bench import BenchConfig
    from deltamatch.kernels.sweep import SweepConfig

    path = tmp_path / "c.yaml"
    path.write_text("heads: 2\ntokens: 64\nspreads: [1, 4]\n")
    cfg = load_with_flags(SweepConfig, path, {"tokens": 32, "seeds": None})
    assert (cfg.heads, cfg.tokens, cfg.spreads, cfg.seeds) == (2, 32, (1.0, 4.0), SweepConfig.seeds)
    path.write_text("seq_len: 128\n")
    assert load_with_flags(ProbeConfig, path, {"batch_size": 3, "seq_len": None}) == ProbeConfig(3, 128)
    path.write_text("head_dims: [128]\nrep_ms: 100\n")
    bench = load_with_flags(BenchConfig, path, {"seq_lens": [4096], "causal": None})
    assert (bench.head_dims, bench.seq_lens, bench.rep_ms, bench.causal) == ([128], [4096], 100, [True, False])
    path.write_text("- not a mapping\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        load_with_flags(ProbeConfig, path, {})


def test_dm_sweep_reads_its_config_file(tmp_path, capsys):
    from deltamatch.kernels.sweep import main

    flags = ["--seeds", "1", "--tokens", "32", "--heads", "1", "--spreads", "1", "--no-progress"]
    main(["--out", str(tmp_path / "flags.csv"), *flags])
    (tmp_path / "sweep.yaml").write_text("seeds: 1\ntokens: 64\nheads: 1\nspreads: [1]\n")
    main(["--out", str(tmp_path / "file.csv"), "--config", str(tmp_path / "sweep.yaml"), "--tokens", "32",
          "--no-progress"])
    assert (tmp_path / "flags.csv").read_bytes() == (tmp_path / "file.csv").read_bytes()
    (tmp_path / "bad.yaml").write_text("head: 2\n")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "bad.csv"), "--config", str(tmp_path / "bad.yaml")])
    assert "unknown config key 'head'" in capsys.readouterr().err and not (tmp_path / "bad.csv").exists()
