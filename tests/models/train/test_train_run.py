"""End-to-end trainer runs on the CPU: FSDP2 over 2 gloo ranks + DCP, kill -9 and bitwise resume, cut-off checkpoints,
context extension, metrics and export. A tiny 2-block model (1 GDN + 1 GQA) keeps each run to seconds."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from deltamatch.models.data import cli as data_cli
from deltamatch.models.train.checkpoint import complete_checkpoints
from deltamatch.models.train.config import RunConfig, parse
from deltamatch.models.train.loop import train
from deltamatch.models.train.metrics import read_metrics

STEPS = 12


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_data")
    cfg = root / "data.yaml"
    cfg.write_text(yaml.safe_dump({"out_dir": str(root / "data"), "corpus": {"max_bytes": 1_000_000}}))
    assert data_cli.main(["--config", str(cfg)]) == 0
    return root / "data"


def run_config(data_dir, run_dir, **sections) -> dict:
    config = {
        "run_dir": str(run_dir), "seed": 0,
        "model": {"size": "tiny", "attn_method": "matched",
                  "overrides": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "attn_every": 2}},
        "data": {"dir": str(data_dir), "seq_len": 32},
        "optim": {"name": "muon", "lr": 1e-2, "muon_lr": 0.05},
        "schedule": {"kind": "wsd", "warmup_steps": 2},
        "train": {"steps": STEPS, "micro_batch": 2, "grad_accum": 2, "deterministic": True, "threads": 1,
                  "progress": False},
        "metrics": {"probe_every": 4, "probe_seq_len": 32, "val_every": 6, "val_batches": 2},
        "checkpoint": {"every": 3, "keep": 10},
    }
    for section, values in sections.items():
        config[section] = {**config[section], **values} if isinstance(values, dict) else values
    return config


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(Path(run_dir) / "metrics.jsonl", "train")}


def cli_command(config_path, nproc: int = 1) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "deltamatch.models.train.cli", "--config", str(config_path)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "deltamatch.models.train.cli", "--config", str(config_path)]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """One uninterrupted single-process run: the baseline the other runs must reproduce."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    summary = train(parse(RunConfig, run_config(data_dir, run_dir)))
    return run_dir, summary


def test_single_process_run_writes_the_contract(reference, data_dir):
    run_dir, summary = reference
    records = read_metrics(run_dir / "metrics.jsonl")
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train_records] == list(range(1, STEPS + 1))
    assert train_records[-1]["tokens"] == STEPS * 4 * 32
    assert set(train_records[0]) == {"kind", "step", "tokens", "loss", "lr", "muon_lr", "grad_norm", "tokens_per_s",
                                     "peak_mem_bytes"}  # the run uses Muon: its rate is recorded beside AdamW's
    assert train_records[0]["muon_lr"] / train_records[0]["lr"] == pytest.approx(0.05 / 1e-2)
    assert train_records[-1]["loss"] < train_records[0]["loss"]
    gains = [r for r in records if r["kind"] == "gain"]
    assert [(r["step"], r["layer"]) for r in gains] == [(4, 1), (8, 1), (12, 1)]
    assert 0 < gains[0]["concentration"] <= 1 and len(gains[0]["top_channels"]) == 5
    residual = [r for r in records if r["kind"] == "residual"]
    assert {(r["step"], r["delta"]) for r in residual} == {(s, d) for s in (4, 8, 12)
                                                          for d in ("stale", "consistent", "matched")}
    by_delta = {r["delta"]: r for r in residual if r["step"] == 12}
    # the paper's invariant: matched δ keeps dS rows summing to ~0 before the cast, the stale δ does not
    assert by_delta["matched"]["before_cast"] < 1e-5 < by_delta["stale"]["before_cast"]
    vals = [r for r in records if r["kind"] == "val"]
    assert [r["step"] for r in vals] == [6, 12] and vals[-1]["loss"] == summary["final_val_loss"]
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert summary["method"] == "matched" and summary["size"] == "tiny" and summary["tokens"] == STEPS * 128
    assert summary["diverged_at_step"] is None


def test_export_reloads_and_reproduces_the_val_loss(reference, data_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from deltamatch.models.data.loader import TokenWindows, val_batches

    run_dir, summary = reference
    model = AutoModelForCausalLM.from_pretrained(run_dir / "final", trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(run_dir / "final")
    assert tok.eos_token_id == model.config.eos_token_id and len(tok) == model.config.vocab_size
    batches = val_batches(TokenWindows(data_dir, "val", 32), 2, 2, rank=0, world=1)
    with torch.no_grad():
        loss = sum(float(model(input_ids=b, labels=b).loss) for b in batches) / len(batches)
    assert loss == pytest.approx(summary["final_val_loss"], rel=1e-6)


def test_two_gloo_ranks_fsdp2_match_one_process_and_reshard_through_dcp(reference, data_dir, tmp_path):
    ref_dir, _ = reference
    run_dir = tmp_path / "fsdp"
    # the same global batch (2 ranks x micro-batch 1 x 2 accumulations), stopped after 6 of the 12 steps
    cfg = run_config(data_dir, run_dir, train={"micro_batch": 1, "steps": 6})
    cfg["schedule"]["decay_fraction"] = 0.0  # the reference's WSD decay only starts at step 11
    proc = subprocess.run(cli_command(write_config(tmp_path / "fsdp.yaml", cfg), nproc=2), env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [s for s, _ in complete_checkpoints(run_dir / "checkpoints")] == [3, 6]
    ref, got = losses(ref_dir), losses(run_dir)
    # sharded reductions change rounding only: FP32 noise through a few steps of simulated FP8
    for step in range(1, 7):
        assert got[step] == pytest.approx(ref[step], rel=2e-3, abs=0), step
    assert got[1] == pytest.approx(ref[1], rel=1e-5)  # same weights, same tokens: only the reduction order differs
    # one process resumes the 2-rank checkpoint (DCP reshards it) and finishes the 12 steps
    cfg["train"] = {**cfg["train"], "steps": STEPS, "micro_batch": 2}
    cfg["schedule"]["decay_fraction"] = 0.2
    summary = train(parse(RunConfig, cfg), allow_config_change=True)  # longer, with the decay: a changed config
    got = losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(7, STEPS + 1):
        assert got[step] == pytest.approx(ref[step], rel=5e-3), step
    assert summary["steps"] == STEPS


def test_kill_9_then_resume_is_bitwise_equal_to_uninterrupted(reference, data_dir, tmp_path):
    ref_dir, _ = reference
    run_dir = tmp_path / "killed"
    # The victim is configured to run far longer, so a loaded machine that is slow to deliver the kill cannot let it
    # finish first; until the reference's final decay (step 11) its schedule and data are the reference's.
    long = run_config(data_dir, run_dir, train={"steps": 10_000}, schedule={"decay_fraction": 0.0})
    proc = subprocess.Popen(cli_command(write_config(tmp_path / "long.yaml", long)), env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not complete_checkpoints(run_dir / "checkpoints") and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = complete_checkpoints(run_dir / "checkpoints")[-1][0]
    assert killed_at <= 9, "killed too late to compare with the reference's schedule"
    config_path = write_config(tmp_path / "run.yaml", run_config(data_dir, run_dir))
    resumed = subprocess.run([*cli_command(config_path), "--allow-config-change"], env=ENV, capture_output=True,
                             text=True, timeout=300)  # the victim's steps and decay differ from the reference's
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(step {killed_at})" in resumed.stderr
    assert losses(run_dir) == losses(ref_dir)  # bitwise, every step
    ref_val = [r["loss"] for r in read_metrics(ref_dir / "metrics.jsonl", "val")]
    assert [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl", "val")] == ref_val


def test_a_checkpoint_cut_off_mid_write_is_never_loaded(reference, data_dir, tmp_path, monkeypatch, capsys):
    import torch.distributed.checkpoint as dcp

    ref_dir, _ = reference
    run_dir = tmp_path / "cut"
    config = parse(RunConfig, run_config(data_dir, run_dir))
    real_save, calls = dcp.save, []

    def crash_on_second(state, checkpoint_id):  # writes the shards, then dies before COMPLETE and the rename
        calls.append(checkpoint_id)
        real_save(state, checkpoint_id=checkpoint_id)
        if len(calls) == 2:
            raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(dcp, "save", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        train(config)
    monkeypatch.setattr(dcp, "save", real_save)
    ckpts = run_dir / "checkpoints"
    assert (ckpts / ".tmp-step_00000006" / ".metadata").exists()
    # also a folder with a final name but no COMPLETE marker (e.g. a copy cut short)
    shutil.copytree(ckpts / "step_00000003", ckpts / "step_00000009")
    (ckpts / "step_00000009" / "COMPLETE").unlink()
    assert [s for s, _ in complete_checkpoints(ckpts)] == [3]
    capsys.readouterr()
    train(config)
    assert "(step 3)" in capsys.readouterr().err
    assert not (ckpts / ".tmp-step_00000006").exists()
    assert losses(run_dir) == losses(ref_dir)


def test_context_extension_starts_from_the_trained_weights(reference, data_dir, tmp_path):
    from deltamatch.models.train.checkpoint import load_model_weights
    from deltamatch.models.train.loop import build_model
    from deltamatch.models.data.shards import read_manifest

    ref_dir, _ = reference
    cfg = parse(RunConfig, run_config(data_dir, tmp_path / "ext"))
    manifest = read_manifest(data_dir)
    from_hf, from_dcp = build_model(cfg, manifest), build_model(cfg, manifest)
    load_model_weights(from_hf, ref_dir / "final")
    load_model_weights(from_dcp, ref_dir)  # the run folder: its newest complete checkpoint
    for (name, a), b in zip(from_hf.state_dict().items(), from_dcp.state_dict().values()):
        assert torch.equal(a, b), name
    fresh = build_model(cfg, manifest)
    assert not torch.equal(fresh.lm_head.weight, from_hf.lm_head.weight)

    ext = run_config(data_dir, tmp_path / "ext", data={"seq_len": 64}, train={"steps": 2},
                     optim={"lr": 1e-3, "muon_lr": 5e-3}, model={"init_from": str(ref_dir / "final")},
                     metrics={"probe_every": 0, "val_every": 0})
    summary = train(parse(RunConfig, ext))
    fresh_loss = losses(ref_dir)[1]
    assert losses(tmp_path / "ext")[1] < fresh_loss - 0.05  # starts where the short run ended, not from scratch
    assert summary["tokens"] == 2 * 4 * 64
    with pytest.raises(ValueError, match="init_from"):
        load_model_weights(fresh, tmp_path)


def test_rerunning_a_finished_run_changes_nothing(reference, data_dir):
    run_dir, summary = reference
    before = (run_dir / "metrics.jsonl").read_text()
    assert train(parse(RunConfig, run_config(data_dir, run_dir))) == summary
    assert (run_dir / "metrics.jsonl").read_text() == before
    with pytest.raises(ValueError, match="train.steps"):
        train(parse(RunConfig, run_config(data_dir, run_dir, train={"steps": STEPS - 1})))


def test_activation_checkpointing_recomputes_blocks_with_equal_losses(data_dir, tmp_path, monkeypatch):
    from deltamatch.models.modeling_hybrid import HybridBlock

    calls = []
    real_forward = HybridBlock.forward

    def counting(self, *args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(HybridBlock, "forward", counting)
    counts, runs = {}, {}
    for ckpt in (False, True):
        calls.clear()
        run_dir = tmp_path / f"ac{ckpt}"
        cfg = run_config(data_dir, run_dir, train={"steps": 2, "activation_checkpointing": ckpt},
                         metrics={"probe_every": 0, "val_every": 0})
        train(parse(RunConfig, cfg))
        counts[ckpt], runs[ckpt] = sum(calls), losses(run_dir)
    # 2 steps x 2 micro-batches x 2 blocks are run once more in the backward pass
    assert counts[True] - counts[False] == 2 * 2 * 2
    assert runs[True] == runs[False]


def test_misspelt_model_override_is_rejected(data_dir, tmp_path):
    cfg = run_config(data_dir, tmp_path / "bad", model={"overrides": {"attn_type": "mla"}})
    with pytest.raises(ValueError, match="'model.overrides.attn_type'"):
        train(parse(RunConfig, cfg))
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def _poison_step_5(monkeypatch):
    """Step 5's second micro-batch (grad_accum 2) returns a NaN loss."""
    from deltamatch.models.modeling_hybrid import HybridForCausalLM

    real_forward, calls = HybridForCausalLM.forward, []

    def poisoned(self, *args, **kwargs):
        out = real_forward(self, *args, **kwargs)
        if torch.is_grad_enabled():
            calls.append(None)
            if len(calls) == 10:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(HybridForCausalLM, "forward", poisoned)


def test_a_nan_loss_raises_before_the_optimizer_step(data_dir, tmp_path, monkeypatch):
    from deltamatch.models.train.loop import NonFiniteError

    _poison_step_5(monkeypatch)
    run_dir = tmp_path / "nan"
    cfg = run_config(data_dir, run_dir, train={"on_nonfinite": "raise"}, metrics={"probe_every": 0, "val_every": 0})
    with pytest.raises(NonFiniteError, match=r"step 5: training loss nan .*method 'matched'.*step_00000003"):
        train(parse(RunConfig, cfg))
    assert sorted(losses(run_dir)) == [1, 2, 3, 4]
    assert [s for s, _ in complete_checkpoints(run_dir / "checkpoints")] == [3]
    assert not (run_dir / "summary.json").exists()


def test_a_nan_loss_ends_the_run_with_the_weights_of_the_step_before(reference, data_dir, tmp_path, monkeypatch):
    """``on_nonfinite: stop`` (the default): the run ends at step 4 with exactly the weights step 4 left (the
    poisoned step 5 is never applied), and says so in its summary; rerunning it changes nothing."""
    from deltamatch.models.train.checkpoint import Checkpointer, load_model_weights
    from deltamatch.models.train.loop import build_model
    from deltamatch.models.data.shards import read_manifest

    ref_dir, _ = reference
    _poison_step_5(monkeypatch)
    real_save, after_step_4 = Checkpointer.save, {}

    def save(self, step, model, optimizers, trainer):  # the periodic save right after step 4, before step 5 runs
        after_step_4.setdefault(step, {k: v.detach().clone() for k, v in model.state_dict().items()})
        return real_save(self, step, model, optimizers, trainer)

    monkeypatch.setattr(Checkpointer, "save", save)
    run_dir = tmp_path / "stop"
    cfg = parse(RunConfig, run_config(data_dir, run_dir, checkpoint={"every": 4, "keep": 10},
                                      metrics={"probe_every": 0, "val_every": 0}))
    summary = train(cfg)
    assert summary["diverged_at_step"] == 5 and summary["steps"] == 4 and summary["tokens"] == 4 * 4 * 32
    assert losses(run_dir) == {k: v for k, v in losses(ref_dir).items() if k <= 4}
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl", "diverged")] == [5]
    stopped = build_model(cfg, read_manifest(data_dir))
    load_model_weights(stopped, run_dir / "final")
    assert list(after_step_4) == [4]
    for name, value in stopped.state_dict().items():
        assert torch.isfinite(value).all() and torch.equal(value, after_step_4[4][name]), name
    monkeypatch.undo()
    assert train(cfg) == summary  # finished: not resumed into the same divergence


def test_resume_under_another_batch_layout_continues_from_the_sample_reached(data_dir, tmp_path):
    """6 steps of 4 samples, then the run goes on with 2 samples per step: step 7 starts at sample 24, not 12."""
    from deltamatch.models.data.loader import TokenWindows, TrainBatches

    run_dir = tmp_path / "layout"
    first = run_config(data_dir, run_dir, train={"steps": 6}, metrics={"probe_every": 0, "val_every": 0})
    train(parse(RunConfig, first))
    shutil.rmtree(run_dir / "final")
    (run_dir / "summary.json").unlink()
    second = run_config(data_dir, run_dir, train={"steps": 8, "grad_accum": 1},
                        metrics={"probe_every": 0, "val_every": 0})
    summary = train(parse(RunConfig, second), allow_config_change=True)
    tokens = {r["step"]: r["tokens"] for r in read_metrics(run_dir / "metrics.jsonl", "train")}
    assert tokens[6] == 24 * 32 and tokens[7] == 26 * 32 and summary["tokens"] == 28 * 32
    windows = TokenWindows(data_dir, "train", 32)
    resumed = TrainBatches(windows, 0, 2, 1, 0, 1, start_step=6, start_sample=24).step(6)
    straight = TrainBatches(windows, 0, 2, 2, 0, 1).step(6)[0]  # samples 24, 25 of the same stream
    assert torch.equal(resumed[0], straight)
    with pytest.raises(ValueError, match="precedes"):
        TrainBatches(windows, 0, 2, 1, 0, 1, start_step=6, start_sample=24).step(5)
