"""fla's autotuning: narrowed for tests, and recorded choices pinned so a run skips autotuning (CPU checks; Triton's
interpreter runs the kernel, and its autotuner is Triton's own)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("fla")

from deltamatch.models.train import fla_autotune  # noqa: E402
from deltamatch.models.train.fla_autotune import autotuner_of  # noqa: E402


def test_narrow_autotuning_narrows_every_kda_kernel_and_restores_them():
    from fla.ops.kda import chunk_bwd, chunk_intra

    kernels = [autotuner_of(k) for k in (chunk_bwd.chunk_kda_bwd_kernel_wy_dqkg_fused,
                                       chunk_intra.chunk_kda_fwd_kernel_inter_solve_fused)]
    before = [list(t.configs) for t in kernels]
    assert all(len(c) > 4 for c in before)
    with fla_autotune.narrow_autotuning("fla.ops.kda", "fla.ops.common") as narrowed:
        assert narrowed >= 10
        for tuner, configs in zip(kernels, before):
            assert 0 < len(tuner.configs) < len(configs) and {c.num_warps for c in tuner.configs} == {4}
            assert all(c in configs for c in tuner.configs)
        assert max(c.num_stages for c in kernels[0].configs) <= 2
    assert [list(t.configs) for t in kernels] == before
    with pytest.raises(ValueError, match="no autotuned kernels"):
        with fla_autotune.narrow_autotuning("fla.utils"):
            pass


def test_every_fla_kernel_is_found_once_under_the_module_that_defines_it():
    from fla.ops.gated_delta_rule import wy_fast

    tuners = fla_autotune.loaded_autotuners(*fla_autotune.PINNED_PACKAGES)
    assert len(tuners) > 100 and len({id(t) for t in tuners.values()}) == len(tuners)
    name = "fla.ops.gated_delta_rule.wy_fast:prepare_wy_repr_bwd_kernel"
    assert tuners[name] is autotuner_of(wy_fast.prepare_wy_repr_bwd_kernel)


def test_restrict_warps_narrows_and_restores_the_autotuner():
    from fla.ops.gated_delta_rule import wy_fast

    tuner = fla_autotune.autotuner_of(wy_fast.prepare_wy_repr_bwd_kernel)
    configs = list(tuner.configs)
    assert {c.num_warps for c in configs} >= {2}
    with fla_autotune.restrict_warps(wy_fast.prepare_wy_repr_bwd_kernel, 2):
        assert tuner.configs and {c.num_warps for c in tuner.configs} == {2}
    assert tuner.configs == configs
    with pytest.raises(ValueError, match="no config with 3 warps"):
        with fla_autotune.restrict_warps(wy_fast.prepare_wy_repr_bwd_kernel, 3):
            pass
    assert tuner.configs == configs


def test_a_narrowing_inside_another_chooses_from_all_configs_and_keeps_choices_if_asked():
    from fla.ops.gated_delta_rule import wy_fast

    tuner = fla_autotune.autotuner_of(wy_fast.prepare_wy_repr_bwd_kernel)
    configs = list(tuner.configs)
    two_warps = [c for c in configs if c.num_warps == 2]
    tuner.cache[("pinned-key",)] = configs[0]
    try:
        with fla_autotune.narrow_autotuning("fla.ops.gated_delta_rule", keep_choices=True):
            narrowed = list(tuner.configs)
            assert {c.num_warps for c in narrowed} == {4} and tuner.cache[("pinned-key",)] is configs[0]
            with fla_autotune.restrict_warps(wy_fast.prepare_wy_repr_bwd_kernel, 2):
                assert tuner.configs == two_warps and not tuner.cache  # from all configs, choices forgotten
                assert fla_autotune.own_configs(tuner) == configs
            assert tuner.configs == narrowed and tuner.cache[("pinned-key",)] is configs[0]
        assert tuner.configs == configs and fla_autotune.own_configs(tuner) == configs
        assert tuner.cache[("pinned-key",)] is configs[0]
        with fla_autotune.narrow_autotuning("fla.ops.gated_delta_rule"):
            assert not tuner.cache  # forgotten inside, by default
        assert tuner.cache[("pinned-key",)] is configs[0]
    finally:
        tuner.cache.pop(("pinned-key",), None)


KERNEL = '''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
from deltamatch.models.train import fla_autotune

@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=2), triton.Config({"BLOCK": 32}, num_warps=4,
                 num_stages=2)], key=["n"])
@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

tuners = {"kernel:add_one": add_one}
benched = []
def bench(*args, config, **kwargs):  # stands in for timing on a GPU: BLOCK 32 "wins"
    benched.append(config.kwargs["BLOCK"])
    return [1.0 if config.kwargs["BLOCK"] == 32 else 2.0]
def no_bench(*args, **kwargs):
    raise AssertionError("autotuning ran although the choice was pinned")
'''


def _run(script: str, tmp_path):
    path = tmp_path / "script.py"
    path.write_text(KERNEL + textwrap.dedent(script))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=120)


def test_recorded_choices_are_pinned_and_skip_autotuning(tmp_path):
    recorded = _run('''
        add_one._bench = bench
        x = torch.zeros(100)
        add_one[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, 100)
        assert x.eq(1).all() and sorted(benched) == [16, 32]
        print(__import__("json").dumps(fla_autotune.record_choices(tuners)))
    ''', tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    kernels = json.loads(recorded.stdout.splitlines()[-1])
    assert kernels == {"kernel:add_one": [{"key": [100, "torch.float32"], "config": {
        "kwargs": {"BLOCK": 32}, "num_warps": 4, "num_stages": 2, "num_ctas": 1, "maxnreg": None}}]}

    pinned = _run(f'''
        add_one._bench = no_bench
        assert fla_autotune.pin_choices(tuners, {kernels!r}) == 1
        assert fla_autotune.pin_choices(tuners, {kernels!r}) == 0  # a key already chosen keeps its choice
        x = torch.zeros(100)
        add_one[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, 100)
        assert x.eq(1).all() and add_one.best_config.kwargs == {{"BLOCK": 32}}
        print("pinned key ran without autotuning")
        x = torch.zeros(50)  # another key autotunes as usual
        add_one[lambda m: (triton.cdiv(50, m["BLOCK"]),)](x, 50)
    ''', tmp_path)
    assert "pinned key ran without autotuning" in pinned.stdout, pinned.stderr
    assert pinned.returncode != 0 and "autotuning ran although the choice was pinned" in pinned.stderr


def test_pins_apply_only_to_the_combination_they_were_recorded_for(tmp_path, monkeypatch):
    now = {"fla": "0.6.0", "triton": "3.6.0", "gpu": "NVIDIA H200"}
    monkeypatch.setattr(fla_autotune, "versions", lambda: dict(now))
    monkeypatch.setattr(fla_autotune, "PINS_DIR", tmp_path)
    monkeypatch.delenv(fla_autotune.ENV_SWITCH, raising=False)
    name = "fla.ops.gated_delta_rule.wy_fast:prepare_wy_repr_bwd_kernel"
    tuner = fla_autotune.loaded_autotuners("fla.ops.gated_delta_rule")[name]
    entry = {"key": [9, 128, 256, 64, "pinned-test"], "config": {"kwargs": {}, "num_warps": 2, "num_stages": 3,
                                                                  "num_ctas": 1, "maxnreg": None}}

    def apply(**recorded):
        fla_autotune.apply_pins.cache_clear()
        (tmp_path / "NVIDIA_H200.json").write_text(json.dumps({**now, **recorded, "kernels": {name: [entry]}}))
        return fla_autotune.apply_pins()

    try:
        assert "recorded for" in apply(triton="3.7.1") and tuple(entry["key"]) not in tuner.cache
        monkeypatch.setenv(fla_autotune.ENV_SWITCH, "0")
        assert "pins off" in apply() and tuple(entry["key"]) not in tuner.cache
        monkeypatch.delenv(fla_autotune.ENV_SWITCH)
        assert "1 recorded choices pinned" in apply()
        assert tuner.cache[tuple(entry["key"])].num_warps == 2
    finally:
        tuner.cache.pop(tuple(entry["key"]), None)
        fla_autotune.apply_pins.cache_clear()


@pytest.mark.parametrize("path", sorted(fla_autotune.PINS_DIR.glob("*.json")), ids=lambda p: p.name)
def test_committed_pin_files_name_kernels_of_their_fla_build(path):
    """A committed pin file is for its GPU, names only kernels the installed fla defines (when it is the fla it was
    recorded with), and every choice converts to a Triton config (a broken file would fail at a GPU run's start)."""
    import fla
    import triton

    data = json.loads(path.read_text())
    assert fla_autotune.pin_file(data["gpu"]) == path
    assert {"fla", "triton", "gpu", "kernels"} <= data.keys() and data["kernels"]
    if data["fla"] == fla.__version__:
        tuners = fla_autotune.loaded_autotuners(*fla_autotune.PINNED_PACKAGES)
        assert data["kernels"].keys() <= tuners.keys()
    for name, entries in data["kernels"].items():
        for entry in entries:
            record = entry["config"]
            assert entry["key"] and record["num_warps"] in (1, 2, 4, 8, 16, 32) and record["num_stages"] >= 1, name
            triton.Config(dict(record["kwargs"]), num_warps=record["num_warps"], num_stages=record["num_stages"],
                          num_ctas=record["num_ctas"], maxnreg=record["maxnreg"])
