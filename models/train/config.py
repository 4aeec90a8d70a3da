"""Typed trainer configuration, validated from YAML.

Every section is a dataclass with a default and a one-line docstring per field. ``parse(cls, mapping)`` turns a
YAML mapping into the dataclass and rejects what it cannot place: an unknown key or a value of the wrong type raises
``ValueError`` naming the dotted key (``optim.lr``), so a typo never silently falls back to a default.

One YAML quirk is absorbed on purpose: PyYAML reads ``3e-4`` (no dot) as a string, so float fields accept strings that
``float()`` parses. Nothing else is coerced. A float must be finite: ``inf`` or ``nan`` (which YAML reads as ``.inf``,
``.nan``, and ``float()`` from ``"inf"``) is refused wherever a float is expected.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

# --------------------------------------------------------------------------------------------------------------------
# Generic validation


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` as type ``tp`` or raise ``ValueError`` naming ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ValueError as err:
                errors.append(str(err))
        if len(errors) == 1:  # ``float | None``: the float's own message (e.g. not finite)
            raise ValueError(errors[0])
        raise ValueError(f"config key '{key}': expected {_type_name(tp)}, got {type(value).__name__} ({value!r})")
    if origin is Literal:
        if value not in args:
            raise ValueError(f"config key '{key}': expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"config key '{key}': expected a mapping, got {type(value).__name__}")
        return parse(tp, value, prefix=key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key '{key}': expected a list, got {type(value).__name__} ({value!r})")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ValueError(f"config key '{key}': expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        out = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"config key '{key}': expected a mapping, got {type(value).__name__} ({value!r})")
        return {str(k): _coerce(v, args[1] if args else Any, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"config key '{key}': expected bool, got {type(value).__name__} ({value!r})")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config key '{key}': expected int, got {type(value).__name__} ({value!r})")
        return value
    if tp is float:
        number = None
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        if number is None:
            raise ValueError(f"config key '{key}': expected float, got {type(value).__name__} ({value!r})")
        if not math.isfinite(number):
            raise ValueError(f"config key '{key}': expected a finite float, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"config key '{key}': expected str, got {type(value).__name__} ({value!r})")
        return value
    raise TypeError(f"config field '{key}' has unsupported annotation {tp!r}")


def parse(cls: type, mapping: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``mapping``; unknown or ill-typed keys raise ``ValueError`` naming the key."""
    mapping = {} if mapping is None else mapping
    if not isinstance(mapping, dict):
        raise ValueError(f"config section '{prefix or '<root>'}': expected a mapping, got {type(mapping).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in mapping:
        if key not in names:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise ValueError(f"unknown config key '{where}' (known keys: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in mapping.items()}
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        where = ", ".join(f"{prefix}.{m}" if prefix else m for m in missing)
        raise ValueError(f"missing required config key '{where}'")
    return cls(**kwargs)


def load_yaml(cls: type, path: str | Path) -> Any:
    """Read YAML file ``path`` and validate it into dataclass ``cls``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    try:
        with path.open() as fh:
            mapping = yaml.safe_load(fh)
    except yaml.YAMLError as err:
        raise ValueError(f"config file {path} is not valid YAML: {' '.join(str(err).split())}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"config file {path} cannot be read: {err}") from None
    return parse(cls, mapping)


# --------------------------------------------------------------------------------------------------------------------
# Trainer sections


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


# --------------------------------------------------------------------------------------------------------------------
# Keys that change what a run shows, never what it computes

COSMETIC = ("train.progress", "metrics.tensorboard")
"""The pipeline leaves these out of the run configs it renders (so changing one reruns nothing) and hands their values
to dm-train through the environment variable :data:`COSMETIC_ENV` instead."""
COSMETIC_ENV = "DM_TRAIN_COSMETIC"


def apply_cosmetic(config: RunConfig, encoded: str | None) -> RunConfig:
    """Set the COSMETIC keys named in ``encoded`` (a JSON object ``{"train.progress": false}``) on ``config``."""
    import json

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
