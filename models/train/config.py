"""Typed trainer configuration, validated from YAML.

Every section is a dataclass with a default and a one-line docstring per field, read through the project's one loader,
``deltamatch.config`` (``parse``, ``load_yaml``: unknown or ill-typed keys are refused naming the dotted key).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from deltamatch.config import load_yaml, parse  # noqa: F401 -- the loader, re-exported for the trainer's callers
from deltamatch.methods import check_public


@dataclass
class ModelSection:
    """Which model to build."""

    size: str = "tiny"
    """Name passed to ``deltamatch.models.get_config`` (tiny, 569M, 1.67B, 5.29B, 2.58B-gqa)."""
    attn_method: str = "bf16"
    """Attention method (a public name of the registry ``deltamatch.methods``; checked before training)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Extra ``HybridConfig`` fields (e.g. a smaller hidden size for tests)."""
    init_from: str | None = None
    """HF folder or DCP checkpoint to start from (context extension); ignored once the run has its own checkpoint."""

    def __post_init__(self) -> None:
        check_public(self.attn_method, "'model.attn_method'")  # the method registry, once when the config is parsed


@dataclass
class DataSection:
    """Where the token shards are and how they are cut."""

    dir: str = "results/default/data"
    """Folder written by ``dm-prepare-data`` (manifest.json, train/, val/, tokenizer/)."""
    seq_len: int = 256
    """Tokens per training sequence."""
    verify_sha256: bool = True
    """Hash every shard against the manifest and check its ids against the vocabulary before training; the result is
    cached in the data folder per shard (keyed by size and mtime), so each shard is hashed once. Shard sizes are
    always checked."""


@dataclass
class OptimSection:
    """Optimiser: AdamW alone, or Muon for hidden 2-D matrices with AdamW for the rest."""

    name: Literal["adamw", "muon"] = "adamw"
    """``adamw`` for every parameter, or ``muon`` for 2-D hidden matrices (AdamW keeps the rest)."""
    lr: float = 3e-3
    """Peak AdamW learning rate."""
    muon_lr: float = 0.02
    """Peak Muon learning rate (scaled by the schedule like ``lr``)."""
    muon_momentum: float = 0.95
    """Muon momentum."""
    weight_decay: float = 0.1
    """Decoupled weight decay of matrices (hidden matrices, embeddings, LM head, convolutions); norms, biases and the
    linear mixers' gate parameters get none."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""


@dataclass
class ScheduleSection:
    """Learning-rate schedule, a multiplier of the peak rates."""

    kind: Literal["cosine", "wsd", "constant"] = "cosine"
    """Warmup then cosine decay, warmup-stable-decay, or warmup then constant."""
    warmup_steps: int = 10
    """Linear warmup steps from 0 to the peak."""
    decay_fraction: float = 0.2
    """WSD: fraction of the steps spent in the final linear decay."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""


@dataclass
class TrainSection:
    """Steps, batch and numerics."""

    steps: int = 100
    """Optimizer steps of this run."""
    micro_batch: int = 8
    """Sequences per rank per forward/backward."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto`` takes CUDA when present, else the CPU."""
    bf16_autocast: bool = True
    """Autocast matmuls to bf16 on GPU (never on CPU, where it would only slow the run)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass."""
    deterministic: bool = False
    """``torch.use_deterministic_algorithms``; on CPU this makes resumed runs bitwise equal to uninterrupted ones."""
    threads: int = 0
    """CPU threads per process (0 leaves torch's default)."""
    progress: bool = True
    """Show a tqdm bar with tokens/s on rank 0."""
    on_nonfinite: Literal["stop", "raise"] = "stop"
    """A NaN or infinite loss or gradient norm is never applied to the weights. ``stop`` ends the run there (final
    validation and export from the last finite weights; ``summary.json`` names the step in ``diverged_at_step``, so
    a divergent run is still a result for the report); ``raise`` exits dm-train with status 3."""
    final_export: bool = True
    """Write the final checkpoint and the HF export under ``final/`` (benchmarks turn it off to time only steps)."""
    allow_reference_attention: bool = False
    """On a GPU, a softmax-attention layer that no fast backend runs (Triton FP8, cuDNN, SDPA) would train through the
    reference simulation (N x N scores in PyTorch): refused unless this is true, so a GPU run never reports a
    simulation as the method's real kernel."""


@dataclass
class MetricsSection:
    """What the metrics JSONL records besides the per-step ``train`` line."""

    probe_every: int = 50
    """Every K steps: ``gain`` and ``residual`` records per attention layer (0 disables)."""
    probe_batch: int = 1
    """Sequences of the current batch used for the residual probe."""
    probe_seq_len: int = 128
    """Leading tokens of those sequences used for the residual probe (its cost is quadratic)."""
    val_every: int = 100
    """Every K steps: validation cross-entropy (always once at the end; 0 = only at the end)."""
    val_batches: int = 4
    """Micro-batches per rank in one validation pass."""
    tensorboard: bool = False
    """Also log the ``train`` and ``val`` scalars to TensorBoard under run_dir/tensorboard (needs the tensorboard
    package: ``pip install tensorboard``)."""


@dataclass
class CheckpointSection:
    """Distributed checkpoints under run_dir/checkpoints."""

    every: int = 100
    """Save every K steps (0 = only at the end)."""
    keep: int = 2
    """Complete checkpoints kept; older ones are deleted."""


@dataclass
class RunConfig:
    """One training run."""

    run_dir: str
    """Output folder: metrics.jsonl, checkpoints/, final/, summary.json."""
    seed: int = 0
    """Seed of the model initialisation and the data order."""
    model: ModelSection = field(default_factory=ModelSection)
    """Which model to build."""
    data: DataSection = field(default_factory=DataSection)
    """Where the token shards are."""
    optim: OptimSection = field(default_factory=OptimSection)
    """Optimiser."""
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    """Learning-rate schedule."""
    train: TrainSection = field(default_factory=TrainSection)
    """Steps, batch and numerics."""
    metrics: MetricsSection = field(default_factory=MetricsSection)
    """Probes and validation."""
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    """Checkpointing."""

    def __post_init__(self) -> None:
        positive = {"train.steps": self.train.steps, "train.micro_batch": self.train.micro_batch,
                    "train.grad_accum": self.train.grad_accum, "data.seq_len": self.data.seq_len,
                    "metrics.probe_batch": self.metrics.probe_batch, "metrics.probe_seq_len": self.metrics.probe_seq_len,
                    "metrics.val_batches": self.metrics.val_batches, "checkpoint.keep": self.checkpoint.keep}
        for key, value in positive.items():
            if value < 1:
                raise ValueError(f"config key '{key}' must be >= 1, got {value}")
        non_negative = {"metrics.probe_every": self.metrics.probe_every, "metrics.val_every": self.metrics.val_every,
                        "checkpoint.every": self.checkpoint.every, "schedule.warmup_steps": self.schedule.warmup_steps,
                        "optim.grad_clip": self.optim.grad_clip, "train.threads": self.train.threads}
        for key, value in non_negative.items():
            if value < 0:
                raise ValueError(f"config key '{key}' must be >= 0, got {value}")
        if self.data.seq_len < 2:
            raise ValueError(f"config key 'data.seq_len' must be >= 2 (one prediction needs two tokens), "
                             f"got {self.data.seq_len}")
        positive_reals = {"optim.lr": self.optim.lr, "optim.muon_lr": self.optim.muon_lr, "optim.eps": self.optim.eps}
        for key, value in positive_reals.items():
            if not value > 0:
                raise ValueError(f"config key '{key}' must be > 0, got {value}")
        if self.optim.weight_decay < 0:
            raise ValueError(f"config key 'optim.weight_decay' must be >= 0, got {self.optim.weight_decay}")
        unit = {"optim.betas[0]": self.optim.betas[0], "optim.betas[1]": self.optim.betas[1],
                "optim.muon_momentum": self.optim.muon_momentum}
        for key, value in unit.items():
            if not 0.0 <= value < 1.0:
                raise ValueError(f"config key '{key}' must be in [0, 1), got {value}")
        if not 0.0 <= self.schedule.min_lr_ratio <= 1.0:
            raise ValueError(f"config key 'schedule.min_lr_ratio' must be in [0, 1], got {self.schedule.min_lr_ratio}")
        if not 0.0 <= self.schedule.decay_fraction <= 1.0:
            raise ValueError(f"config key 'schedule.decay_fraction' must be in [0, 1], got {self.schedule.decay_fraction}")


# Keys that change what a run shows, never what it computes.
COSMETIC = ("train.progress", "metrics.tensorboard")
"""The pipeline leaves these out of the run configs it renders (so changing one reruns nothing) and hands their values
to dm-train through the environment variable :data:`COSMETIC_ENV` instead."""
COSMETIC_ENV = "DM_TRAIN_COSMETIC"


def apply_cosmetic(config: RunConfig, encoded: str | None) -> RunConfig:
    """Set the COSMETIC keys named in ``encoded`` (a JSON object ``{"train.progress": false}``) on ``config``."""
    if not encoded:
        return config
    try:
        values = json.loads(encoded)
    except json.JSONDecodeError as err:
        raise ValueError(f"{COSMETIC_ENV} is not a JSON object: {err}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{COSMETIC_ENV} must be a JSON object, got {encoded!r}")
    for key, value in values.items():
        if key not in COSMETIC:
            raise ValueError(f"{COSMETIC_ENV}: {key!r} is not one of the cosmetic keys {COSMETIC}")
        section, name = key.split(".")
        if not isinstance(value, bool):
            raise ValueError(f"{COSMETIC_ENV}: config key '{key}' must be a bool, got {value!r}")
        setattr(getattr(config, section), name, value)
    return config
