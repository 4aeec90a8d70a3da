"""Fixed-length training windows from token shards, in a seeded order that resumes from a sample count.

Each shard is cut into non-overlapping windows of ``seq_len`` tokens (the tail shorter than a window is dropped;
windows never straddle two shards). The global sample stream visits every window once per epoch in the order of a
permutation drawn from ``seed + epoch``, so the whole data position is one integer — samples consumed — and the
batch of any step can be rebuilt from it after a restart, on any machine.

A step on ``world`` ranks consumes ``world * grad_accum * micro_batch`` consecutive samples of the stream; rank ``r``
takes micro-batch ``m`` from offset ``(m * world + r) * micro_batch`` inside that step, so changing the rank count
changes which rank sees a sample but never the samples of a step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from deltamatch.models.data.shards import open_split


class TokenWindows:
    """Windows of ``seq_len`` tokens over the shards of one split."""

    def __init__(self, folder: str | Path, split: str, seq_len: int):
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2 (one prediction needs two tokens), got {seq_len}")
        self.seq_len = seq_len
        self.shards = open_split(folder, split)
        counts = np.array([len(s) // seq_len for s in self.shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        if self.starts[-1] == 0:
            raise ValueError(f"split {split!r} of {folder} has no window of {seq_len} tokens; lower data.seq_len")

    def __len__(self) -> int:
        return int(self.starts[-1])

    def window(self, index: int) -> np.ndarray:
        """Tokens of window ``index`` as int64."""
        shard = int(np.searchsorted(self.starts, index, side="right") - 1)
        offset = (index - int(self.starts[shard])) * self.seq_len
        return np.asarray(self.shards[shard][offset: offset + self.seq_len], dtype=np.int64)

    def batch(self, indices: list[int]) -> torch.Tensor:
        """Windows ``indices`` stacked into a ``(len(indices), seq_len)`` int64 tensor."""
        return torch.from_numpy(np.stack([self.window(i) for i in indices]))


class SampleOrder:
    """Position-addressable, seeded order over ``n`` windows: sample ``i`` is window ``perm(seed + i // n)[i % n]``."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._epoch, self._perm = -1, None

    def __getitem__(self, sample: int) -> int:
        epoch, offset = divmod(sample, self.n)
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.n, generator=gen)
        return int(self._perm[offset])


class TrainBatches:
    """The micro-batches of each optimizer step for one rank.

    Step ``start_step`` begins at sample ``start_sample`` of the stream (the position a checkpoint recorded, whatever
    batch layout wrote it); each later step follows ``samples_per_step`` further on."""

    def __init__(self, windows: TokenWindows, seed: int, micro_batch: int, grad_accum: int, rank: int, world: int,
                 start_step: int = 0, start_sample: int = 0):
        self.windows, self.order = windows, SampleOrder(len(windows), seed)
        self.micro_batch, self.grad_accum, self.rank, self.world = micro_batch, grad_accum, rank, world
        self.start_step, self.start_sample = start_step, start_sample

    @property
    def samples_per_step(self) -> int:
        """Sequences consumed by one optimizer step across all ranks."""
        return self.world * self.grad_accum * self.micro_batch

    def step(self, step: int) -> list[torch.Tensor]:
        """The ``grad_accum`` micro-batches, each ``(micro_batch, seq_len)``, of optimizer step ``step`` (0-based)."""
        if step < self.start_step:
            raise ValueError(f"step {step} precedes the data position this loader starts from (step {self.start_step})")
        base = self.start_sample + (step - self.start_step) * self.samples_per_step
        out = []
        for m in range(self.grad_accum):
            first = base + (m * self.world + self.rank) * self.micro_batch
            out.append(self.windows.batch([self.order[first + j] for j in range(self.micro_batch)]))
        return out


def val_batches(windows: TokenWindows, micro_batch: int, batches: int, rank: int, world: int) -> list[torch.Tensor]:
    """This rank's share of the leading validation windows, in file order (no shuffling).

    Every rank gets the same number of micro-batches (FSDP needs the same collectives on all ranks); a split smaller
    than one micro-batch per rank wraps around.
    """
    per_rank = max(1, min(batches, len(windows) // (world * micro_batch)))
    out = []
    for b in range(per_rank):
        first = (b * world + rank) * micro_batch
        out.append(windows.batch([(first + j) % len(windows) for j in range(micro_batch)]))
    return out
