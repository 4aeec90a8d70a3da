"""The metrics JSONL: one JSON object per line, each with a ``kind``, flushed as it is written.

Kinds (the contract the reports read): ``train`` {step, tokens, loss, lr, [muon_lr,] grad_norm, tokens_per_s,
peak_mem_bytes}; ``gain`` {step, layer, concentration, top_channels, q_gain_max, k_gain_max}; ``residual`` {step,
layer, delta, before_cast, after_cast, dk_colsum}; ``val`` {step, loss}; ``diverged`` {step, message} (the step whose
loss or gradient norm was not finite, never applied); ``config_change`` {step, changed: {key: [old, new]},
fingerprint} (a resume under another config, allowed by ``dm-train --allow-config-change``). Only rank 0 writes. A resumed run first drops the records
logged after its checkpoint, so the file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

KINDS = ("train", "gain", "residual", "val", "diverged", "config_change", "backends")


def require_tensorboard() -> None:
    """ValueError naming the config key when TensorBoard logging is asked for but tensorboard is not installed
    (dm-train checks it on every rank before training)."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        raise ValueError("config key 'metrics.tensorboard' is true but the tensorboard package is not installed "
                         "(pip install tensorboard)")


def tensorboard_writer(log_dir: str | Path):
    """A ``torch.utils.tensorboard.SummaryWriter`` for ``log_dir``."""
    require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir))


class MetricsWriter:
    """Appends records to ``path`` (a no-op object on ranks other than 0). With ``tensorboard``, the numeric fields
    of ``train`` and ``val`` records also go to TensorBoard under ``path``'s folder ``/tensorboard``
    (``train/loss``, ``val/loss``, ... at their step)."""

    def __init__(self, path: str | Path, enabled: bool = True, tensorboard: bool = False):
        self.path, self.enabled = Path(path), enabled
        self._fh = None
        self._board = tensorboard_writer(self.path.parent / "tensorboard") if enabled and tensorboard else None

    def truncate_after(self, step: int) -> None:
        """Keep only records with ``step <= step`` (atomically), before a resumed run appends."""
        self._keep(lambda record: record["step"] <= step)

    def drop(self, kind: str, step: int) -> None:
        """Remove the ``kind`` records of ``step`` (atomically): a final record rewritten by a rerun stays single."""
        self._keep(lambda record: not (record["kind"] == kind and record["step"] == step))

    def _keep(self, keep) -> None:
        if not self.enabled or not self.path.exists():
            return
        self.close()
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and _complete(line) and keep(json.loads(line))]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def write(self, kind: str, **fields) -> None:
        """Append one record of ``kind``; non-finite floats are written as null (JSON has no NaN)."""
        if kind not in KINDS:
            raise ValueError(f"unknown metrics kind {kind!r}; choose from {KINDS}")
        if not self.enabled:
            return
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a")
        record = {"kind": kind, **{k: _finite(v) for k, v in fields.items()}}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        if self._board is not None and kind in ("train", "val"):
            for name, value in fields.items():
                if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._board.add_scalar(f"{kind}/{name}", value, fields["step"])

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._board is not None:
            self._board.close()
            self._board = None


class _LogLines:
    """A stream for tqdm that turns its carriage-return redraws into whole lines (readable in a log file)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(total: int, initial: int, desc: str, enabled: bool, stream=None):
    """The training progress bar, on stderr: redrawn in place on a terminal; on anything else (a log file, a pipe)
    one line a minute, so ``tail -f`` of a job's log shows progress. ``enabled`` False shows nothing."""
    from tqdm.auto import tqdm

    stream = sys.stderr if stream is None else stream
    terminal = hasattr(stream, "isatty") and stream.isatty()
    return tqdm(total=total, initial=initial, unit="step", desc=desc, disable=not enabled, dynamic_ncols=terminal,
                file=stream if terminal else _LogLines(stream), mininterval=0.1 if terminal else 60.0,
                ncols=None if terminal else 100)


def _finite(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _complete(line: str) -> bool:
    """A line cut by a kill is not valid JSON; it is dropped."""
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict]:
    """Records of ``path``, optionally only those of ``kind``."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in records if kind is None or r["kind"] == kind]
