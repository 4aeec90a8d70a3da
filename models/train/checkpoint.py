"""Atomic distributed checkpoints (``torch.distributed.checkpoint``) and automatic resume.

A checkpoint holds the model and optimizer state (sharded as FSDP2 holds them, so any rank count can save it), the
trainer state (optimizer steps done, training samples consumed — the data position — and the wall time so far) and every rank's RNG state.

Atomicity: all ranks write into ``checkpoints/.tmp-step_XXXXXXXX``; after a barrier rank 0 writes ``COMPLETE`` into it
and renames it to ``checkpoints/step_XXXXXXXX`` (a rename within one folder is atomic on POSIX and on Lustre/GPFS).
Only folders with the final name *and* ``COMPLETE`` *and* DCP's ``.metadata`` *and* every data file that metadata
names, at its full length, are ever loaded, so a run killed in the middle of a save resumes from the previous
checkpoint and deletes the leftover temporary folder. Old checkpoints are pruned the same way round: renamed to
``.trash-step_XXXXXXXX`` first (one atomic step that takes them out of the complete set), then deleted. ``COMPLETE``
also records the run's config fingerprint (``models/train/fingerprint.py``).

A save that fails (a full disk, an unwritable folder) deletes its temporary folder and raises ``OSError``; a full disk
says "No space left on device" and names the folder, however deep in DCP the write failed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from deltamatch.models.train.distributed import Layout, barrier

COMPLETE = "COMPLETE"
_NAME = re.compile(r"^step_(\d{8})$")


@contextlib.contextmanager
def _single_process_ok():
    """DCP warns when no process group runs; one process is a supported layout here, not a mistake."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rng_state(layout: Layout) -> dict[str, torch.Tensor]:
    state = {f"cpu.rank{layout.rank}": torch.get_rng_state()}
    if layout.device.type == "cuda":
        state[f"cuda.rank{layout.rank}"] = torch.cuda.get_rng_state(layout.device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], layout: Layout) -> None:
    torch.set_rng_state(state[f"cpu.rank{layout.rank}"])
    if layout.device.type == "cuda":
        torch.cuda.set_rng_state(state[f"cuda.rank{layout.rank}"], layout.device)


def _data_files_whole(path: Path) -> bool:
    """Every file DCP's ``.metadata`` names exists and is long enough for every item stored in it."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception:  # a cut or foreign .metadata: not a checkpoint we can load
        return False
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in needed.items():
        file = path / name
        if not file.is_file() or file.stat().st_size < size:
            return False
    return True


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every complete checkpoint under ``root``, oldest first: final name, ``COMPLETE``,
    ``.metadata`` and every data file the metadata names."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if (match and (path / COMPLETE).is_file() and (path / ".metadata").is_file()
                and _data_files_whole(path)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def checkpoint_info(path: str | Path) -> dict:
    """What ``COMPLETE`` records: ``step``, ``world`` and, since fingerprints exist, ``fingerprint`` and ``fields``."""
    try:
        return json.loads((Path(path) / COMPLETE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _failures(err: BaseException) -> list[BaseException]:
    """``err`` and what it wraps: causes, contexts and DCP's per-rank failures (``CheckpointException`` is a
    ``BaseException`` holding ``{rank: (exception, traceback)}``)."""
    seen, todo, out = set(), [err], []
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        wrapped = [f[0] if isinstance(f, tuple) else f for f in getattr(e, "failures", {}).values()]
        todo += [e.__cause__, e.__context__, *wrapped]
    return out


def save_error(err: BaseException, tmp: Path, what: str = "checkpoint") -> OSError | None:
    """The ``OSError`` naming ``tmp`` that a failed write of ``what`` into the (already deleted) temporary folder
    ``tmp`` raises instead of ``err`` (DCP's wrapper, a library's own error); None: re-raise ``err`` as it is."""
    errors = [e for e in _failures(err) if isinstance(e, OSError)]
    if any(e.errno == errno.ENOSPC for e in errors) or any("No space left" in str(e) for e in _failures(err)):
        return OSError(errno.ENOSPC, f"No space left on device while writing {what} {tmp} (deleted it); free "
                                     f"space under {tmp.parent} and rerun to resume")
    if errors:
        return OSError(errors[0].errno, f"writing {what} {tmp} failed (deleted it): {errors[0]}")
    return None


def _remove(path: Path) -> None:
    """Delete a folder so that no half of it keeps a loadable name: rename to ``.trash-*``, then delete."""
    trash = path.with_name(f".trash-{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


class Checkpointer:
    """Saves and restores the training state under ``root``; ``keep`` newest complete checkpoints are kept."""

    def __init__(self, root: str | Path, keep: int, layout: Layout, meta: dict | None = None):
        self.root, self.keep, self.layout = Path(root), keep, layout
        self.meta = meta or {}
        """Recorded in every ``COMPLETE`` (the run's config fingerprint)."""

    def latest(self) -> tuple[int, Path] | None:
        """The newest complete checkpoint, or None."""
        found = complete_checkpoints(self.root)
        return found[-1] if found else None

    def _state(self, model: nn.Module, optimizers: list[torch.optim.Optimizer], trainer: dict[str, int | float]):
        model_sd, optim_sd = get_state_dict(model, optimizers)
        trainer_sd = {k: torch.tensor(v, dtype=torch.float64) for k, v in trainer.items()}
        return {"model": model_sd, "optim": optim_sd, "trainer": trainer_sd, "rng": _rng_state(self.layout)}

    def save(self, step: int, model: nn.Module, optimizers: list[torch.optim.Optimizer],
             trainer: dict[str, int | float]) -> Path:
        """Write checkpoint ``step`` atomically; ``trainer`` holds scalars (``step``, ``samples``, ``wall_s``)."""
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f".tmp-{final.name}"
        if self.layout.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            self.root.mkdir(parents=True, exist_ok=True)
        barrier(self.layout)
        try:
            with _single_process_ok():
                dcp.save(self._state(model, optimizers, trainer), checkpoint_id=str(tmp))
        except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
            shutil.rmtree(tmp, ignore_errors=True)
            named = save_error(err, tmp)
            if named is not None:
                raise named from err
            raise
        barrier(self.layout)
        if self.layout.is_main:
            (tmp / COMPLETE).write_text(json.dumps({"step": step, "world": self.layout.world, **self.meta}) + "\n")
            if final.exists():  # re-saving the same step (e.g. the final save after a periodic one)
                _remove(final)
            os.replace(tmp, final)
            self._prune()
        barrier(self.layout)
        return final

    def load(self, path: Path, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict[str, float]:
        """Restore model, optimizers and RNG from ``path``; returns the trainer scalars."""
        state = self._state(model, optimizers, {"step": 0, "samples": -1, "wall_s": 0.0})
        # another rank count leaves some rank's RNG key absent: load what exists, keep the fresh seed for the rest
        with _single_process_ok():
            dcp.load(state, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=True))
        set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])
        _set_rng_state(state["rng"], self.layout)
        trainer = {k: float(v) for k, v in state["trainer"].items()}
        if trainer["samples"] < 0:
            raise ValueError(f"checkpoint {path} records no data position (trainer.samples); it was written by an "
                             f"older deltamatch: start the run in a new run_dir with model.init_from={path}")
        return trainer

    def clean_partial(self) -> None:
        """Delete temporary folders of saves that never completed and of prunes cut short (rank 0)."""
        if self.layout.is_main and self.root.is_dir():
            for path in [*self.root.glob(".tmp-step_*"), *self.root.glob(".trash-step_*")]:
                shutil.rmtree(path, ignore_errors=True)
        barrier(self.layout)

    def _prune(self) -> None:
        for _, path in complete_checkpoints(self.root)[: -self.keep]:
            _remove(path)


def load_model_weights(model: nn.Module, source: str | Path) -> None:
    """Initialise an unsharded ``model`` from an HF folder (``config.json`` + safetensors) or a DCP checkpoint
    (a ``step_*`` folder, or a run's ``checkpoints/`` whose newest complete one is taken): the context-extension start.
    """
    source = Path(source)
    if (source / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        src = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32)
        missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    else:
        if not (source / ".metadata").is_file():
            found = complete_checkpoints(source) or complete_checkpoints(source / "checkpoints")
            if not found:
                raise ValueError(f"config key 'model.init_from': {source} is neither an HF folder nor a checkpoint")
            source = found[-1][1]
        state = {"model": model.state_dict()}
        with _single_process_ok():
            dcp.load(state, checkpoint_id=str(source), planner=DefaultLoadPlanner(allow_partial_load=True))
        missing, unexpected = model.load_state_dict(state["model"], strict=False)
    if missing or unexpected:
        raise ValueError(f"config key 'model.init_from': {source} does not match the model "
                         f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
