"""The run fingerprint: which config a run directory's weights came from.

A run directory resumes from its newest checkpoint. If the config changed in between (another learning rate, seed,
method or data), resuming would silently return weights trained under the old config as the result of the new one.
So every checkpoint (its ``COMPLETE`` marker) and ``summary.json`` carry the *result-affecting* part of the config:

* every key of the ``RunConfig`` as a dotted name (``optim.lr``, ``model.overrides.hidden_size``), except the keys in
  :data:`COSMETIC` (where things are written and how often they are logged, probed, checkpointed; threads, device,
  progress bars), which change nothing about the weights;
* ``train.global_batch`` (micro-batch x accumulation x ranks) instead of ``train.micro_batch``/``train.grad_accum``:
  the same global batch on another rank count is the same run (DCP reshards the checkpoint);
* ``data.manifest_sha256`` instead of ``data.dir``: the data by content (its manifest lists every shard's sha256).
* ``model.init_from_digest`` beside ``model.init_from``: which weights the path held (:func:`init_from_digest`), so
  a context extension whose base run was retrained under the same path starts afresh too. Once the source is gone
  (cleaned up after the extension started) it is not compared: the run's checkpoints no longer need it.

``fingerprint`` is the sha256 of the canonical JSON of those fields; :func:`differing_keys` names what changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from deltamatch.atomic import write_text
from deltamatch.models.data.shards import MANIFEST
from deltamatch.models.train.checkpoint import COMPLETE, Checkpointer, checkpoint_info, complete_checkpoints
from deltamatch.models.train.config import RunConfig
from deltamatch.models.train.distributed import Layout, barrier

COSMETIC = frozenset({
    "run_dir", "data.dir", "data.verify_sha256",
    "train.progress", "train.threads", "train.device", "train.deterministic", "train.activation_checkpointing",
    "train.final_export", "train.on_nonfinite", "train.micro_batch", "train.grad_accum",
    "train.allow_reference_attention",
})
"""Keys (or whole sections, by prefix) left out of the fingerprint: they change where and how a run is written or
laid out, never its weights. ``metrics.*`` and ``checkpoint.*`` are left out whole."""
COSMETIC_SECTIONS = ("metrics.", "checkpoint.")


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = list(value) if isinstance(value, tuple) else value


def fingerprint_fields(config: RunConfig, world: int, manifest_sha256: str) -> dict[str, Any]:
    """The result-affecting fields of ``config`` on ``world`` ranks, as ``{dotted key: value}``."""
    flat: dict[str, Any] = {}
    _flatten(dataclasses.asdict(config), "", flat)
    fields = {k: v for k, v in flat.items() if k not in COSMETIC and not k.startswith(COSMETIC_SECTIONS)}
    fields["train.global_batch"] = config.train.micro_batch * config.train.grad_accum * world
    fields["data.manifest_sha256"] = manifest_sha256
    if config.model.init_from:
        fields["model.init_from_digest"] = init_from_digest(config.model.init_from)
    return dict(sorted(fields.items()))


def init_from_digest(source: str | Path) -> str | None:
    """Which weights ``model.init_from`` names, cheaply: an HF folder by its ``config.json`` and the names, sizes and
    mtimes of its weight files (a re-export gets new mtimes); a DCP checkpoint (or a run dir's newest) by its
    ``COMPLETE`` and ``.metadata``. None if the source no longer exists."""
    source, digest = Path(source), hashlib.sha256()
    if (source / "config.json").is_file():
        digest.update((source / "config.json").read_bytes())
        for file in sorted(source.glob("*.safetensors")):
            stat = file.stat()
            digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        return digest.hexdigest()[:16]
    if not (source / ".metadata").is_file():
        found = complete_checkpoints(source) or complete_checkpoints(source / "checkpoints")
        if not found:
            return None
        source = found[-1][1]
    for name in (COMPLETE, ".metadata"):
        if (source / name).is_file():
            digest.update((source / name).read_bytes())
    return digest.hexdigest()[:16]


def manifest_digest(data_dir: str | Path) -> str:
    """sha256 of the data folder's ``manifest.json`` bytes (which list every shard's own sha256)."""
    return hashlib.sha256((Path(data_dir) / MANIFEST).read_bytes()).hexdigest()


def fingerprint(fields: dict[str, Any]) -> str:
    """Short sha256 of the canonical JSON of ``fields``."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def differing_keys(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (old value, new value)}`` for every key whose value differs (absent: None)."""
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def describe(changes: dict[str, tuple[Any, Any]]) -> str:
    """``optim.lr 0.003 -> 0.001, seed 0 -> 1`` (the first few)."""
    parts = [f"{k} {a!r} -> {b!r}" for k, (a, b) in list(changes.items())[:8]]
    more = len(changes) - 8
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


class ConfigChangedError(ValueError):
    """The run directory holds a run of another config."""


def bind_run(run_dir: Path, ckpt: Checkpointer, meta: dict, layout: Layout, *, allow_change: bool,
             restart: bool) -> dict[str, tuple[Any, Any]] | None:
    """Check that the newest checkpoint of ``ckpt`` was written under ``meta['fields']``.

    Returns ``None`` when it was (or there is none), the changes when ``allow_change`` adopts them (the newest
    checkpoint's ``COMPLETE`` is rewritten with the new fingerprint; the caller records the change in the metrics).
    With ``restart`` a run of another config is deleted (checkpoints, metrics, summary, export) and ``None`` returned:
    the pipeline's rerun of a changed config starts afresh. Otherwise :class:`ConfigChangedError` names the keys.
    """
    latest = ckpt.latest()
    info = checkpoint_info(latest[1]) if latest is not None else {}
    barrier(layout)  # every rank has read the state (and so takes the same branch) before rank 0 changes it below
    if latest is None or info.get("fingerprint") == meta["fingerprint"]:
        return None
    old = info.get("fields")
    changes = differing_keys(old, meta["fields"]) if old is not None else {"fingerprint": (None, meta["fingerprint"])}
    if changes.get("model.init_from_digest", (None, ""))[1] is None:
        del changes["model.init_from_digest"]  # the source is gone: the run's own checkpoints carry its weights on
    if not changes:
        return None
    what = (describe(changes) if old is not None
            else "its checkpoints record no config fingerprint (written by an older deltamatch)")
    if restart:
        if layout.is_main:
            print(f"dm-train: {run_dir} was trained under another config ({what}); starting afresh",
                  file=sys.stderr, flush=True)
            for name in ("checkpoints", "final"):  # renamed first: no half-deleted folder keeps a loadable name
                if (run_dir / name).exists():
                    trash = run_dir / f".trash-{name}"
                    shutil.rmtree(trash, ignore_errors=True)
                    os.replace(run_dir / name, trash)
                    shutil.rmtree(trash, ignore_errors=True)
            for name in ("summary.json", "metrics.jsonl"):
                (run_dir / name).unlink(missing_ok=True)
        barrier(layout)
        return None
    if not allow_change:
        raise ConfigChangedError(
            f"{run_dir} holds a run (checkpoint {latest[1].name}) of another config: {what}. Resuming would report "
            f"the old weights as this config's result. Use a new run_dir, or pass --allow-config-change to go on "
            f"from that checkpoint under the new config (recorded in metrics.jsonl as a 'config_change' record)")
    if layout.is_main:
        write_text(latest[1] / COMPLETE, json.dumps({**info, **meta}) + "\n")
    barrier(layout)
    return changes


def run_meta(config: RunConfig, world: int, data_dir: str | Path) -> dict[str, Any]:
    """``{"fingerprint", "fields"}`` of ``config`` on ``world`` ranks over the data of ``data_dir``."""
    fields = fingerprint_fields(config, world, manifest_digest(data_dir))
    return {"fingerprint": fingerprint(fields), "fields": fields}
