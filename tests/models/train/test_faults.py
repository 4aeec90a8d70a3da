"""Fault injection: every way a run could report something wrong as a result, and what it does instead (issue 18).

Each test reproduces one case a skeptical user tried — a changed config over an old run dir, a kill during pruning or
the final export, SIGTERM/SIGINT, corrupt shards, a non-finite config float, a full disk — and asserts the named
error, the exit status or the clean state the README's reliability table promises. The tiny 2-block model of
``test_train_run`` keeps each run to a second or two.
"""

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from deltamatch.models.data import cli as data_cli
from deltamatch.models.data.shards import read_manifest, verify
from deltamatch.models.train import cli as train_cli
from deltamatch.models.train.checkpoint import checkpoint_info, complete_checkpoints
from deltamatch.models.train.config import RunConfig, parse
from deltamatch.models.train.fingerprint import ConfigChangedError
from deltamatch.models.train.loop import train
from deltamatch.models.train.metrics import read_metrics
from test_train_run import ENV, cli_command, data_dir, losses, run_config, write_config  # noqa: F401 (fixture)

QUIET = {"probe_every": 0, "val_every": 0}


def short(data_dir, run_dir, steps=4, **sections):
    sections.setdefault("metrics", QUIET)
    sections["train"] = {"steps": steps, **sections.get("train", {})}
    sections.setdefault("checkpoint", {"every": 2, "keep": 10})
    return run_config(data_dir, run_dir, **sections)


def run(cfg: dict, **kwargs) -> dict:
    return train(parse(RunConfig, cfg), **kwargs)


# --- 1. a run dir is bound to its config ----------------------------------------------------------------------------

def test_resuming_under_another_config_is_refused_naming_the_keys(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = run(short(data_dir, run_dir))
    assert json.loads((run_dir / "summary.json").read_text())["fingerprint"] == first["fingerprint"]
    assert checkpoint_info(complete_checkpoints(run_dir / "checkpoints")[-1][1])["fingerprint"] == first["fingerprint"]
    changed = short(data_dir, run_dir, model={"attn_method": "bf16"})
    changed["seed"] = 1
    # a finished run is not returned as the result of another config ...
    with pytest.raises(ConfigChangedError, match=r"model\.attn_method 'matched' -> 'bf16'.*seed 0 -> 1"):
        run(changed)
    # ... nor is an unfinished one resumed (lr, batch and schedule count too); the CLI says so in one line, exit 2
    shutil.rmtree(run_dir / "final")
    (run_dir / "summary.json").unlink()
    for section, values in {"optim": {"lr": 2e-2}, "train": {"grad_accum": 1}, "schedule": {"kind": "cosine"}}.items():
        with pytest.raises(ConfigChangedError, match=f"{section}."):
            run(short(data_dir, run_dir, **{section: values}))
    capsys.readouterr()
    path = write_config(tmp_path / "lr.yaml", short(data_dir, run_dir, optim={"lr": 2e-2}))
    assert train_cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "optim.lr 0.01 -> 0.02" in err and "--allow-config-change" in err
    assert not (run_dir / "summary.json").exists()


def test_cosmetic_keys_do_not_change_the_fingerprint(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    run(short(data_dir, run_dir, steps=2))
    shutil.rmtree(run_dir / "final")
    (run_dir / "summary.json").unlink()
    cosmetic = short(data_dir, run_dir, steps=2, metrics={"probe_every": 1, "val_every": 1, "val_batches": 1},
                     checkpoint={"every": 1, "keep": 1}, train={"progress": True, "threads": 2})
    assert run(cosmetic)["steps"] == 2


def test_allow_config_change_goes_on_and_records_the_change(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    run(short(data_dir, run_dir, steps=4))
    longer = short(data_dir, run_dir, steps=6)
    summary = run(longer, allow_config_change=True)
    assert summary["steps"] == 6 and sorted(losses(run_dir)) == list(range(1, 7))
    records = read_metrics(run_dir / "metrics.jsonl", "config_change")
    assert [(r["step"], r["changed"]) for r in records] == [(4, {"train.steps": [4, 6]})]
    assert run(longer) == summary  # adopted: the same config now resumes (here: is finished) without the flag


def test_an_allowed_change_of_a_finished_run_exports_it_again_under_the_new_fingerprint(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    old = run(short(data_dir, run_dir, steps=2))
    changed = short(data_dir, run_dir, steps=2, optim={"lr": 2e-2})
    new = run(changed, allow_config_change=True)
    assert new["fingerprint"] != old["fingerprint"] and new["final_val_loss"] == old["final_val_loss"]
    assert json.loads((run_dir / "summary.json").read_text())["fingerprint"] == new["fingerprint"]
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl", "val")] == [2]  # re-validated, one record
    assert run(changed) == new


def test_restart_on_config_change_starts_afresh_like_a_new_run(data_dir, tmp_path):
    run_dir, fresh_dir = tmp_path / "run", tmp_path / "fresh"
    run(short(data_dir, run_dir))
    new = dict(short(data_dir, run_dir), seed=1)
    summary = run(new, restart_on_config_change=True)
    reference = run(dict(short(data_dir, fresh_dir), seed=1))
    assert losses(run_dir) == losses(fresh_dir)
    assert summary["final_val_loss"] == reference["final_val_loss"]
    assert not read_metrics(run_dir / "metrics.jsonl", "config_change")


def test_a_retrained_init_from_source_restarts_the_extension(data_dir, tmp_path, capsys):
    """Context extension: the base run is retrained under the same path (another seed), so the extension's config is
    unchanged but the weights it started from are not; it must start afresh, not resume."""
    base, ext = tmp_path / "base", tmp_path / "ext"
    run(short(data_dir, base, steps=2))
    extension = short(data_dir, ext, steps=2, model={"init_from": str(base / "final")})
    first = run(extension)
    run(dict(short(data_dir, base, steps=2), seed=1), restart_on_config_change=True)
    with pytest.raises(ConfigChangedError, match="model.init_from_digest"):
        run(extension)
    capsys.readouterr()
    again = run(extension, restart_on_config_change=True)
    assert "starting afresh" in capsys.readouterr().err
    assert again["final_val_loss"] != first["final_val_loss"]
    # once the source is cleaned up, the extension's own checkpoints carry on without it
    shutil.rmtree(base)
    shutil.rmtree(ext / "final")
    (ext / "summary.json").unlink()
    assert run(extension)["final_val_loss"] == again["final_val_loss"]


def test_the_pipeline_train_rule_restarts_changed_runs():
    rule = (Path(__file__).parents[3] / "workflow" / "rules" / "train.smk").read_text()
    shell = rule[rule.index("rule train:"):].split("shell:")[1]
    assert "-- --restart-on-config-change" in shell


# --- 2. pruning and the final export cannot leave a half-state that counts ------------------------------------------

def test_complete_checkpoints_verifies_every_data_file(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    run(short(data_dir, run_dir))
    ckpts = run_dir / "checkpoints"
    assert [s for s, _ in complete_checkpoints(ckpts)] == [2, 4]
    data_files = sorted((ckpts / "step_00000002").glob("*.distcp"))
    assert data_files
    data_files[0].unlink()  # what a kill during an in-place prune left
    with open(sorted((ckpts / "step_00000004").glob("*.distcp"))[0], "r+b") as fh:
        fh.truncate(100)  # and a copy cut short
    assert complete_checkpoints(ckpts) == []


def test_a_kill_during_pruning_leaves_no_checkpoint_that_counts(data_dir, tmp_path, monkeypatch):
    import deltamatch.models.train.checkpoint as checkpoint

    run_dir = tmp_path / "run"
    real_rmtree = shutil.rmtree

    def killed_midway(path, *args, **kwargs):  # deletes the data file, then the process dies
        for file in Path(path).glob("*.distcp"):
            file.unlink()
        raise KeyboardInterrupt("killed while pruning")

    cfg = short(data_dir, run_dir, checkpoint={"every": 1, "keep": 1})
    monkeypatch.setattr(checkpoint.shutil, "rmtree", lambda p, *a, **k: (
        killed_midway(p) if Path(p).name.startswith((".trash-step", "step_")) and Path(p).exists()
        else real_rmtree(p, *a, **k)))
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    monkeypatch.undo()
    assert [s for s, _ in complete_checkpoints(run_dir / "checkpoints")] == [2]
    assert run(cfg)["steps"] == 4  # resumes from step 2 and finishes
    assert not list((run_dir / "checkpoints").glob(".trash-*"))


def test_a_kill_during_the_final_export_leaves_one_final_val_record(data_dir, tmp_path, monkeypatch):
    import deltamatch.models.train.loop as loop

    run_dir = tmp_path / "run"
    cfg = short(data_dir, run_dir)
    real_export = loop.export_hf

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed during the export")

    monkeypatch.setattr(loop, "export_hf", killed)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    monkeypatch.setattr(loop, "export_hf", real_export)
    summary = run(cfg)
    vals = read_metrics(run_dir / "metrics.jsonl", "val")
    assert [r["step"] for r in vals] == [4] and vals[0]["loss"] == summary["final_val_loss"]
    assert (run_dir / "final" / "model.safetensors").is_file()


# --- 3. SIGTERM and SIGINT end the run with a checkpoint -------------------------------------------------------------

@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_finishes_the_step_writes_a_checkpoint_and_exits_with_its_status(data_dir, tmp_path, sig, status):
    run_dir = tmp_path / "run"
    cfg = short(data_dir, run_dir, steps=10_000, checkpoint={"every": 5_000, "keep": 2})
    proc = subprocess.Popen(cli_command(write_config(tmp_path / "long.yaml", cfg)), env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (run_dir / "metrics.jsonl").exists():
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err[-2000:]
    assert "Traceback" not in err and f"{sig.name} received" in err
    last_step = max(losses(run_dir))
    assert [s for s, _ in complete_checkpoints(run_dir / "checkpoints")] == [last_step]
    assert f"step {last_step} " in err


def test_a_second_sigint_aborts_at_once_in_one_line(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    # 40 micro-batches a step: the second SIGINT lands while the first one's step is still running
    cfg = short(data_dir, run_dir, steps=10_000, train={"grad_accum": 40}, checkpoint={"every": 5_000, "keep": 2})
    proc = subprocess.Popen(cli_command(write_config(tmp_path / "long.yaml", cfg)), env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (run_dir / "metrics.jsonl").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)  # two signals at once reach Python's handler as one
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert "interrupted by a second SIGINT" in err


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_every_rank_after_the_same_step(data_dir, tmp_path):
    """torchrun forwards SIGTERM to its 2 gloo ranks; they agree (a CPU all-reduce) on the step to stop after and
    write one checkpoint together. torchrun itself then exits non-zero (its own SignalException)."""
    run_dir = tmp_path / "run"
    cfg = short(data_dir, run_dir, steps=10_000, train={"micro_batch": 1}, checkpoint={"every": 5_000, "keep": 2})
    proc = subprocess.Popen(cli_command(write_config(tmp_path / "long.yaml", cfg), nproc=2), env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (run_dir / "metrics.jsonl").exists():
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    last_step = max(losses(run_dir))
    assert [s for s, _ in complete_checkpoints(run_dir / "checkpoints")] == [last_step]
    assert err.count(f"SIGTERM received: stopped after step {last_step} ") == 2, err[-3000:]


# --- 4. corrupt data is named ------------------------------------------------------------------------------------

@pytest.fixture
def data_copy(data_dir, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    return copy


def _first_shard(folder):
    return folder / read_manifest(folder)["splits"]["train"]["shards"][0]["file"]


def test_a_flipped_byte_stops_training_naming_the_shard(data_copy, tmp_path):
    shard = _first_shard(data_copy)
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=f"shard {shard} does not match its sha256"):
        run(short(data_copy, tmp_path / "run"))  # verified by default: the pipeline's runs included
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_verification_hashes_each_shard_once(data_copy, monkeypatch):
    import deltamatch.models.data.shards as shards

    scanned = []
    real_scan = shards._scan
    monkeypatch.setattr(shards, "_scan", lambda path, dtype: scanned.append(path) or real_scan(path, dtype))
    (data_copy / shards.VERIFIED).unlink(missing_ok=True)  # the fixture's runs verified the original already
    verify(data_copy)
    first = len(scanned)
    assert first == sum(len(s["shards"]) for s in read_manifest(data_copy)["splits"].values())
    verify(data_copy)
    assert len(scanned) == first  # cached by size and mtime
    shard = _first_shard(data_copy)
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))
    verify(data_copy)
    assert scanned[first:] == [shard]


def test_a_fresh_data_folder_needs_no_rehash(tmp_path, monkeypatch):
    """dm-prepare-data seeds the cache from the bytes it wrote: the training jobs that start together on a new data
    folder only stat its shards (a cluster's 30 runs would otherwise each read the whole corpus)."""
    import deltamatch.models.data.shards as shards

    cfg = tmp_path / "data.yaml"
    cfg.write_text(yaml.safe_dump({"out_dir": str(tmp_path / "data"), "corpus": {"max_bytes": 400_000}}))
    assert data_cli.main(["--config", str(cfg)]) == 0
    scanned = []
    monkeypatch.setattr(shards, "_scan", lambda path, dtype: scanned.append(path))
    verify(tmp_path / "data")
    assert scanned == []
    assert len(json.loads((tmp_path / "data" / shards.VERIFIED).read_text())) == 2


def _rewrite_manifest(folder, edit):
    manifest = read_manifest(folder)
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_out_of_vocabulary_ids_are_named_with_the_shard(data_copy, tmp_path):
    shard = _first_shard(data_copy)
    manifest = read_manifest(data_copy)
    ids = np.fromfile(shard, dtype=manifest["dtype"])
    ids[7] = manifest["vocab_size"] + 3
    ids.tofile(shard)

    def rehash(m):
        import hashlib

        m["splits"]["train"]["shards"][0]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()

    _rewrite_manifest(data_copy, rehash)
    with pytest.raises(ValueError, match=f"shard {shard} holds token id {manifest['vocab_size'] + 3}, outside"):
        verify(data_copy)


def test_a_zero_token_shard_is_named(data_copy, tmp_path):
    shard = _first_shard(data_copy)
    shard.write_bytes(b"")

    def empty(m):
        m["splits"]["train"]["shards"][0]["tokens"] = 0

    _rewrite_manifest(data_copy, empty)
    cfg = short(data_copy, tmp_path / "run", data={"verify_sha256": False})  # sizes are checked even then
    with pytest.raises(ValueError, match=f"shard {shard} holds no tokens"):
        run(cfg)


# --- 5. floats are finite; on_nonfinite: stop keeps its promise at step 1 -------------------------------------------

@pytest.mark.parametrize("key, value", [("lr", float("inf")), ("lr", "inf"), ("eps", float("nan")),
                                        ("grad_clip", "-inf")])
def test_non_finite_config_floats_are_refused(data_dir, tmp_path, key, value):
    with pytest.raises(ValueError, match=f"config key 'optim.{key}': expected a finite float"):
        parse(RunConfig, short(data_dir, tmp_path / "run", optim={key: value}))


def test_a_divergence_at_step_1_still_writes_summary_and_export(data_dir, tmp_path, monkeypatch):
    """Step 1 is applied, step 2 is not finite, and the weights step 1 left give a NaN validation loss: the run is a
    result (summary.json, final/), not exit 3."""
    from deltamatch.models.modeling_hybrid import HybridForCausalLM

    real_forward, calls = HybridForCausalLM.forward, []

    def poisoned(self, *args, **kwargs):
        out = real_forward(self, *args, **kwargs)
        calls.append(None)
        if len(calls) > 2:  # step 1's two micro-batches are clean
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(HybridForCausalLM, "forward", poisoned)
    run_dir = tmp_path / "run"
    summary = run(short(data_dir, run_dir))
    assert summary["diverged_at_step"] == 2 and summary["steps"] == 1
    assert summary["final_val_loss"] != summary["final_val_loss"]  # NaN, recorded
    assert json.loads((run_dir / "summary.json").read_text())["diverged_at_step"] == 2
    assert (run_dir / "final" / "model.safetensors").is_file()
    assert [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl", "val")] == [None]


# --- 6. dm-train's boundary: one line naming the input, exit 2 -------------------------------------------------------

def test_malformed_yaml_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("run_dir: x\noptim: {lr: 1e-3\n")
    assert train_cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path} is not valid YAML" in err


def test_an_unwritable_run_dir_is_one_line_exit_2(data_dir, tmp_path, capsys):
    path = write_config(tmp_path / "proc.yaml", short(data_dir, "/proc/deltamatch-run"))
    assert train_cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/proc/deltamatch-run" in err


def one_error_line(err: str) -> bool:
    """The failure is one ``dm-train: error:`` line and no traceback (the run's informational lines, such as which
    backend trains each mixer, may come before it)."""
    lines = err.splitlines()
    return "Traceback" not in err and sum(line.startswith("dm-train: error") for line in lines) == 1 \
        and lines[-1].startswith("dm-train: error")


def test_a_full_disk_is_named_and_the_temporary_checkpoint_deleted(data_dir, tmp_path, monkeypatch, capsys):
    from torch.distributed.checkpoint.filesystem import FileSystem

    real_create = FileSystem.create_stream

    class Full:  # a file on a full disk: every write fails with ENOSPC
        def __init__(self, stream):
            self.stream = stream

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.stream, name)

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with real_create(self, path, mode) as stream:
            yield Full(stream) if "w" in mode else stream

    monkeypatch.setattr(FileSystem, "create_stream", create_stream)
    run_dir = tmp_path / "run"
    path = write_config(tmp_path / "full.yaml", short(data_dir, run_dir))
    assert train_cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert one_error_line(err) and "No space left on device" in err and ".tmp-step_00000002" in err
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))


# --- 6b. the other dm-* boundaries --------------------------------------------------------------------------------

def test_dm_eval_names_a_truncated_weights_file(tmp_path, monkeypatch, capsys):
    import torch
    from safetensors.torch import save_file

    import deltamatch.evals.preflight as preflight
    from deltamatch.evals import cli as eval_cli

    ckpt = tmp_path / "final"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    weights = ckpt / "model.safetensors"
    save_file({"w": torch.zeros(64, 64)}, str(weights))
    weights.write_bytes(weights.read_bytes()[:5000])  # a copy cut short
    monkeypatch.setattr(preflight, "set_hub_offline", lambda offline=True: None)  # the test process stays as it is
    out = tmp_path / "eval.json"
    with pytest.raises(SystemExit) as exited:
        eval_cli.main(["--checkpoint", str(ckpt), "--suite", "offline", "--out", str(out)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"weights file {weights} is corrupt or truncated" in err
    assert not out.exists()


@pytest.mark.parametrize("args, message", [(["--spreads", "-1"], "--spreads must be finite and > 0"),
                                           (["--spreads", "nan"], "--spreads must be finite and > 0"),
                                           (["--seeds", "0"], "--seeds must be a positive integer"),
                                           (["--tokens", "-4"], "--tokens must be a positive integer")])
def test_dm_sweep_checks_its_arguments_before_any_output(tmp_path, capsys, args, message):
    from deltamatch.kernels.sweep import main as sweep_main

    out = tmp_path / "sweep.csv"
    with pytest.raises(SystemExit) as exited:
        sweep_main(["--out", str(out), "--no-progress", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert list(tmp_path.iterdir()) == []


def test_dm_prepare_data_names_an_unwritable_out_dir_and_malformed_yaml(tmp_path, capsys):
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump({"out_dir": "/proc/deltamatch-data", "corpus": {"max_bytes": 20_000}}))
    assert data_cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/proc/deltamatch-data" in err
    path.write_text("out_dir: [x\n")
    assert data_cli.main(["--config", str(path)]) == 2
    assert f"{path} is not valid YAML" in capsys.readouterr().err


def test_a_full_disk_during_the_export_is_named_and_leaves_no_half_folder(data_dir, tmp_path, monkeypatch, capsys):
    from deltamatch.models.modeling_hybrid import HybridForCausalLM

    def full(self, folder, *args, **kwargs):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(HybridForCausalLM, "save_pretrained", full)
    run_dir = tmp_path / "run"
    path = write_config(tmp_path / "full.yaml", short(data_dir, run_dir, steps=2))
    assert train_cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert one_error_line(err) and "No space left on device while writing the HF export" in err
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "metrics.jsonl"]
