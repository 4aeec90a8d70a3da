"""The training run, top to bottom: set up, resume, step, measure, checkpoint, export.

One function, :func:`train`, runs on one CPU process and on every rank of a ``torchrun`` job alike:

1. layout and numerics: torchrun environment, device, threads, deterministic algorithms;
2. model: ``get_config(size, attn_method, vocab and special tokens of the data, **overrides)``, seeded identically on
   every rank; for a context-extension phase its weights come from ``model.init_from``; activation checkpointing;
   FSDP2 sharding;
3. optimizers (AdamW, or Muon + AdamW) and the newest complete checkpoint of the run, if any (automatic resume: the
   checkpoint holds the samples consumed, so the next batch is rebuilt exactly, also under another rank count);
4. per step: ``grad_accum`` micro-batches (gradient sync only on the last), clipping, schedule, a ``train`` record;
   every ``probe_every`` steps ``gain`` and ``residual`` records; every ``val_every`` steps a ``val`` record;
   every ``checkpoint.every`` steps an atomic checkpoint;
5. at the end: validation, a final checkpoint, the HF export under ``final/`` and ``summary.json``.

A run directory is bound to the config that trained it (``fingerprint.py``): resuming under another result-affecting
config is refused unless asked for. SIGTERM/SIGINT end the run after the current step with a checkpoint
(``signals.py``).

A step whose loss or gradient norm is NaN or infinite is never applied. With ``train.on_nonfinite: stop`` (the default)
the run ends there as in 5., from the weights of the step before, and ``summary.json`` names the step in
``diverged_at_step`` (the paper's divergent runs are results, and the report shows them); with ``raise`` it exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

import torch

from deltamatch.models.data.loader import TokenWindows, TrainBatches, val_batches
from deltamatch.models.data.shards import read_manifest, verify
from deltamatch.models.train import probes
from deltamatch.models.train.backends import training_backends
from deltamatch.models.train.checkpoint import Checkpointer, load_model_weights
from deltamatch.models.train.config import RunConfig
from deltamatch.models.train.distributed import (Layout, init_distributed, mean_over_ranks, shard_model, shutdown,
                                                 sum_over_ranks)
from deltamatch.models.train.export import export_hf, write_summary
from deltamatch.models.train.fingerprint import bind_run, run_meta
from deltamatch.models.train.fla_autotune import apply_pins
from deltamatch.models.train.metrics import MetricsWriter, progress_bar
from deltamatch.models.train.optim import build_optimizers, set_lr
from deltamatch.models.train.schedule import lr_multiplier
from deltamatch.models.train.throughput import flops_per_token, peak_tflops
from deltamatch.models.train.signals import Interrupted, StopRequest, stop_on_signals


class NonFiniteError(FloatingPointError):
    """A training step or a validation pass produced a NaN or an infinity."""


@contextlib.contextmanager
def configured_numerics(config: RunConfig, layout: Layout):
    """Threads and determinism for the run (set before the first CUDA matmul), restored afterwards so an in-process
    caller (tests, notebooks) gets its own settings back."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    if config.train.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        if layout.device.type == "cuda":
            torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def check_model_names(config: RunConfig) -> None:
    """``model.size``, ``model.attn_method`` and the override keys exist (before any data or weights are touched)."""
    from deltamatch.kernels import METHODS
    from deltamatch.models import list_configs
    from deltamatch.models.sizes import check_overrides

    if config.model.size not in list_configs():
        raise ValueError(f"config key 'model.size' is {config.model.size!r}; choose one of {list_configs()}")
    if config.model.attn_method not in METHODS:
        raise ValueError(f"config key 'model.attn_method' is {config.model.attn_method!r}; "
                         f"choose one of {sorted(METHODS)}")
    check_overrides(config.model.overrides, prefix="model.overrides.")


def build_model(config: RunConfig, manifest: dict) -> torch.nn.Module:
    """The configured model with the data's vocabulary and special tokens, seeded by ``config.seed``."""
    from deltamatch.models import HybridForCausalLM, get_config

    special = manifest["special_tokens"]
    fields = {"vocab_size": manifest["vocab_size"], "bos_token_id": special.get("bos"),
              "eos_token_id": special.get("eos"), "pad_token_id": special.get("pad"),
              "attn_method": config.model.attn_method, **config.model.overrides}
    if fields["vocab_size"] < manifest["vocab_size"]:
        raise ValueError(f"config key 'model.overrides.vocab_size' ({fields['vocab_size']}) is smaller than the "
                         f"data's vocabulary ({manifest['vocab_size']})")
    torch.manual_seed(config.seed)
    return HybridForCausalLM(get_config(config.model.size, **fields))


def peak_memory(device: torch.device) -> int:
    """Peak bytes: CUDA allocator peak on GPU, the process's peak resident set on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def train_step(model, micro_batches: list[torch.Tensor], optimizers, config: RunConfig, layout: Layout,
               autocast) -> tuple[float, float]:
    """Accumulate gradients over the micro-batches, clip, step; returns (mean loss over ranks, grad norm)."""
    total = torch.zeros((), device=layout.device)  # summed on the device: one host sync per step, below
    for i, batch in enumerate(micro_batches):
        batch = batch.to(layout.device, non_blocking=True)
        if layout.sharded:
            model.set_requires_gradient_sync(i == len(micro_batches) - 1)
        with autocast():
            loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        (loss / len(micro_batches)).backward()
        total += loss.detach().float() / len(micro_batches)
    max_norm = config.optim.grad_clip or float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    total, grad_norm = (float(t) for t in torch.stack([total, grad_norm.float()]).cpu())
    loss = mean_over_ranks(total, layout)
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        # Every rank sees the same mean loss and global norm, so every rank stops here, before the weights change.
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        raise NonFiniteError(f"training loss {loss} / gradient norm {grad_norm} is not finite "
                             f"(method {config.model.attn_method!r}, size {config.model.size!r}); the optimizer step "
                             f"was not taken, and the run's checkpoints hold only finite weights")
    for opt in optimizers:
        opt.step()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return loss, grad_norm


@torch.no_grad()
def evaluate(model, batches: list[torch.Tensor], layout: Layout, autocast) -> float:
    """Mean next-token cross-entropy over this rank's validation batches, averaged over ranks by token count."""
    was_training = model.training
    model.eval()
    loss_sum = count = 0.0
    for batch in batches:
        batch = batch.to(layout.device)
        with autocast():
            loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        n = batch.numel() - batch.shape[0]  # predictions per batch (HF shift)
        loss_sum += float(loss) * n
        count += n
    model.train(was_training)
    loss_sum, count = sum_over_ranks([loss_sum, count], layout)
    if not math.isfinite(loss_sum):
        raise NonFiniteError(f"validation loss is not finite ({loss_sum / count}) over {len(batches)} batch(es) of "
                             f"shape {tuple(batches[0].shape)}; the evaluation forward (model.eval(), no grad) "
                             f"produced it")
    return loss_sum / count


def muon_lr(config: RunConfig, lr_mult: float) -> dict[str, float]:
    """The Muon rate of this step for the ``train`` record, when Muon is in use (``lr`` is AdamW's)."""
    return {"muon_lr": config.optim.muon_lr * lr_mult} if config.optim.name == "muon" else {}


def _due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def train(config: RunConfig, *, allow_config_change: bool = False, restart_on_config_change: bool = False) -> dict:
    """Run (or resume, or finish) the training run of ``config``; returns the summary on rank 0, {} elsewhere.

    A run dir whose checkpoints were written under another result-affecting config raises
    ``fingerprint.ConfigChangedError``, unless ``allow_config_change`` (go on from them, recorded in the metrics) or
    ``restart_on_config_change`` (delete them and start afresh, as the pipeline does). SIGTERM/SIGINT raise
    ``signals.Interrupted`` after the current step's checkpoint."""
    layout = init_distributed(config.train.device)
    try:
        with configured_numerics(config, layout), stop_on_signals(layout) as stop:
            return _train(config, layout, stop, allow_config_change, restart_on_config_change)
    finally:
        shutdown(layout)


def _train(config: RunConfig, layout: Layout, stop: StopRequest, allow_change: bool, restart: bool) -> dict:
    start_wall = time.perf_counter()
    check_model_names(config)
    run_dir, data_dir = Path(config.run_dir), Path(config.data.dir)
    manifest = read_manifest(data_dir)
    if config.data.verify_sha256 and layout.is_main:
        verify(data_dir)
    meta = run_meta(config, layout.world, data_dir)
    ckpt = Checkpointer(run_dir / "checkpoints", config.checkpoint.keep, layout, meta)
    changes = bind_run(run_dir, ckpt, meta, layout, allow_change=allow_change, restart=restart)
    latest = ckpt.latest()
    if _finished(config, latest, meta["fingerprint"]):
        return json.loads((run_dir / "summary.json").read_text()) if layout.is_main else {}
    model, optimizers = _model_and_optimizers(config, manifest, layout, init_from_source=latest is None)
    ckpt.clean_partial()
    position, wall_before = Position(0, 0), 0.0
    if latest is not None:
        state = ckpt.load(latest[1], model, optimizers)
        position, wall_before = Position.from_state(state), state["wall_s"]
        if layout.is_main:
            print(f"dm-train: resumed from {latest[1]} (step {position.step})", file=sys.stderr, flush=True)
    metrics = MetricsWriter(run_dir / "metrics.jsonl", enabled=layout.is_main, tensorboard=config.metrics.tensorboard)
    metrics.truncate_after(position.step)
    backends = _record_backends(config, layout, model, metrics, position.step)
    if changes:
        metrics.write("config_change", step=position.step, changed={k: list(v) for k, v in changes.items()},
                      fingerprint=meta["fingerprint"])

    def wall() -> float:
        return wall_before + time.perf_counter() - start_wall

    autocast = probes.autocast_for(layout.device, config.train.bf16_autocast)
    val = val_batches(TokenWindows(data_dir, "val", config.data.seq_len), config.train.micro_batch,
                      config.metrics.val_batches, layout.rank, layout.world)
    end, diverged_at = _run_steps(config, layout, model, optimizers, ckpt, metrics, val, position, wall, stop)
    if end.step == position.step and latest is not None:
        metrics.drop("val", end.step)  # a rerun after a kill during the export: the final record stays single
    val_loss = _final_validation(config, model, val, layout, autocast)
    metrics.write("val", step=end.step, loss=val_loss)
    metrics.close()
    if config.train.final_export:
        if end.step > position.step or latest is None:
            ckpt.save(end.step, model, optimizers, {**end.state(), "wall_s": wall()})
        export_hf(model, data_dir / "tokenizer", run_dir / "final", layout)
    summary = {"final_val_loss": val_loss, "steps": end.step, "tokens": end.samples * config.data.seq_len,
               "method": config.model.attn_method, "size": config.model.size, "seed": config.seed, "wall_s": wall(),
               "diverged_at_step": diverged_at, "fingerprint": meta["fingerprint"], "backends": backends}
    if not layout.is_main:
        return {}
    write_summary(run_dir / "summary.json", summary)
    return summary


def _record_backends(config: RunConfig, layout: Layout, model, metrics: MetricsWriter, step: int) -> list[dict]:
    """Say once which implementation trains each kind of mixer, and why (stderr on rank 0, and a metrics record);
    on a GPU, refuse attention that only the reference simulation would run (``train.allow_reference_attention``)."""
    dtype = torch.bfloat16 if layout.device.type == "cuda" and config.train.bf16_autocast else None
    backends = training_backends(getattr(model, "module", model), layout.device, dtype)
    # fla's recorded launch choices, before the first step, so pinned keys skip autotuning (fla_autotune.py)
    pins = {"fla_autotuning": apply_pins()} if any(e["backend"] == "fla" for e in backends) else {}
    metrics.write("backends", step=step, backends=backends, **pins)  # first: an unwritable run dir fails in one line
    if layout.is_main:
        for entry in backends:
            print(f"dm-train: {entry['mixer']} layers {entry['layers']}: {entry['backend']} ({entry['why']})",
                  file=sys.stderr, flush=True)
        for line in pins.values():
            print(f"dm-train: {line}", file=sys.stderr, flush=True)
    simulated = [e for e in backends if e["backend"] == "reference"]
    if layout.device.type == "cuda" and simulated and not config.train.allow_reference_attention:
        raise ValueError(f"attention layers {simulated[0]['layers']} would train method "
                         f"{config.model.attn_method!r} through the reference simulation on the GPU (no fast backend "
                         "runs these shapes; dm_attn_func's warning says why); set train.allow_reference_attention: "
                         "true to accept that")
    return backends


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a run stands: optimizer steps done and training samples consumed (the data position).

    The two are kept apart so that a run resumed with another rank count or batch layout goes on from the sample it
    reached rather than from ``step * samples_per_step`` of the new layout."""

    step: int
    samples: int

    @classmethod
    def from_state(cls, state: dict[str, float]) -> Position:
        return cls(int(state["step"]), int(state["samples"]))

    def state(self) -> dict[str, int]:
        return {"step": self.step, "samples": self.samples}


def _finished(config: RunConfig, latest: tuple[int, Path] | None, fingerprint: str) -> bool:
    """Whether the run already completed under this config, or stopped on a divergence (then rerunning it changes
    nothing); ValueError if it went further than ``train.steps``."""
    if latest is None:
        return False
    run_dir = Path(config.run_dir)
    if latest[0] > config.train.steps:
        raise ValueError(f"config key 'train.steps' is {config.train.steps}, but {run_dir} already holds a "
                         f"checkpoint at step {latest[0]}; use a new run_dir (and model.init_from) instead")
    if not ((run_dir / "summary.json").is_file() and (run_dir / "final").is_dir()):
        return False
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("fingerprint") != fingerprint:  # exported under another config: validate and export again
        return False
    return latest[0] == config.train.steps or (summary.get("diverged_at_step") is not None
                                               and latest[0] == summary.get("steps"))


def _final_validation(config: RunConfig, model, val: list[torch.Tensor], layout: Layout, autocast) -> float:
    """The final validation loss; under ``on_nonfinite: stop`` a non-finite one is the run's result (NaN), not a
    crash."""
    try:
        return evaluate(model, val, layout, autocast)
    except NonFiniteError as err:
        if config.train.on_nonfinite == "raise":
            raise
        if layout.is_main:
            print(f"dm-train: {err}; recorded as NaN (train.on_nonfinite: stop)", file=sys.stderr, flush=True)
        return float("nan")


def _model_and_optimizers(config: RunConfig, manifest: dict, layout: Layout, init_from_source: bool):
    """The model on its device (weights from ``model.init_from`` for a fresh run that names one), activation
    checkpointing, FSDP2, and its optimizers."""
    model = build_model(config, manifest)
    if init_from_source and config.model.init_from:
        load_model_weights(model, config.model.init_from)
    model.to(layout.device)
    if config.train.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    shard_model(model, layout)
    return model, build_optimizers(model, config.optim)


def _run_steps(config: RunConfig, layout: Layout, model, optimizers, ckpt: Checkpointer, metrics: MetricsWriter,
               val: list[torch.Tensor], start: Position, wall, stop: StopRequest) -> tuple[Position, int | None]:
    """Optimizer steps from ``start`` to ``train.steps`` with their records and periodic checkpoints.

    Returns where the run ended and, if a step's loss or gradient norm was not finite and ``train.on_nonfinite`` is
    ``stop``, that step (the run then ends before it, with the finite weights of the step before)."""
    batches = TrainBatches(TokenWindows(config.data.dir, "train", config.data.seq_len), config.seed,
                           config.train.micro_batch, config.train.grad_accum, layout.rank, layout.world,
                           start_step=start.step, start_sample=start.samples)
    tokens_per_step = batches.samples_per_step * config.data.seq_len
    flops = flops_per_token(model, config.data.seq_len)
    peak = peak_tflops(layout.device)
    autocast = probes.autocast_for(layout.device, config.train.bf16_autocast)
    steps, position = config.train.steps, start
    bar = progress_bar(steps, start.step, f"train {config.model.attn_method}", layout.is_main and config.train.progress)
    for step in range(start.step, steps):
        tick = time.perf_counter()
        lr_mult = lr_multiplier(step, steps, config.schedule)
        set_lr(optimizers, lr_mult)
        micro = batches.step(step)
        try:
            loss, grad_norm = train_step(model, micro, optimizers, config, layout, autocast)
        except NonFiniteError as err:
            bar.close()
            if config.train.on_nonfinite == "raise":
                latest = ckpt.latest()
                raise NonFiniteError(f"step {step + 1}: {err}; the newest checkpoint is "
                                     f"{latest[1] if latest else 'none'}") from None
            metrics.write("diverged", step=step + 1, message=str(err))
            if layout.is_main:
                print(f"dm-train: step {step + 1}: {err}; the run ends at step {step} (train.on_nonfinite: stop)",
                      file=sys.stderr, flush=True)
            return position, step + 1
        if layout.device.type == "cuda":
            torch.cuda.synchronize(layout.device)  # the optimizer step is in the step's time
        position = Position(step + 1, position.samples + batches.samples_per_step)
        done, tok_s = position.step, tokens_per_step / (time.perf_counter() - tick)
        mfu = {"mfu": tok_s * flops / (peak * 1e12)} if peak else {}
        metrics.write("train", step=done, tokens=position.samples * config.data.seq_len, loss=loss,
                      lr=config.optim.lr * lr_mult, grad_norm=grad_norm, tokens_per_s=tok_s,
                      peak_mem_bytes=peak_memory(layout.device), **mfu, **muon_lr(config, lr_mult))
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}")
        bar.update(1)
        if _due(done, config.metrics.probe_every):
            _probe(model, micro[0], config, layout, autocast, metrics, done)
        if _due(done, config.metrics.val_every) and done != steps:
            metrics.write("val", step=done, loss=evaluate(model, val, layout, autocast))
        if _due(done, config.checkpoint.every) and done != steps:
            ckpt.save(done, model, optimizers, {**position.state(), "wall_s": wall()})
        if done != steps and (signum := stop.agreed()):
            bar.close()
            if not _due(done, config.checkpoint.every):
                ckpt.save(done, model, optimizers, {**position.state(), "wall_s": wall()})
            raise Interrupted.after_step(signum, done, ckpt.latest()[1])
    bar.close()
    return position, None


def _probe(model, batch: torch.Tensor, config: RunConfig, layout: Layout, autocast, metrics: MetricsWriter,
           step: int) -> None:
    for record in probes.gain_records(model):
        metrics.write("gain", step=step, **record)
    probe_batch = batch[: config.metrics.probe_batch, : config.metrics.probe_seq_len].to(layout.device)
    for record in probes.residual_records(model, probe_batch, layout, autocast):
        metrics.write("residual", step=step, **record)
