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
from pathlib import Path

KINDS = ("train", "gain", "residual", "val", "diverged", "config_change", "backends")


class MetricsWriter:
    """Appends records to ``path`` (a no-op object on ranks other than 0)."""

    def __init__(self, path: str | Path, enabled: bool = True):
        self.path, self.enabled = Path(path), enabled
        self._fh = None

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

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


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
