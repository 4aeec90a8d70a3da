"""Process layout: one CPU process, or ``torchrun`` ranks on one or many nodes, through the same calls.

``torchrun`` (and ``srun`` + ``torchrun`` on SLURM) sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; with more than one
rank a process group is started (NCCL on GPUs, gloo on CPUs) and the model is sharded with FSDP2: ``fully_shard`` on
every block of ``model.model.layers``, then on the root (embeddings, final norm, LM head). With one rank nothing is
started and the model stays a plain module; checkpoints (DCP) and metrics take the same path either way.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Layout:
    """Where this process sits."""

    rank: int
    """Global rank."""
    world: int
    """Number of ranks."""
    local_rank: int
    """Rank on this node (the GPU index)."""
    device: torch.device
    """Device of this rank."""

    @property
    def is_main(self) -> bool:
        """Rank 0 writes metrics, exports and logs."""
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """Whether a process group is running and the model is FSDP-sharded."""
        return self.world > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as err:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from err


def init_distributed(device: str = "auto") -> Layout:
    """Read the torchrun environment, pick the device and start the process group when there are several ranks."""
    rank, world, local = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0)
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("config key 'train.device' is 'cuda' but no CUDA device is visible")
    if use_cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30),
                                device_id=dev if use_cuda else None)
    return Layout(rank=rank, world=world, local_rank=local, device=dev)


def shard_model(model: nn.Module, layout: Layout) -> nn.Module:
    """FSDP2 per block, then the root; a no-op on one rank."""
    if not layout.sharded:
        return model
    from torch.distributed.fsdp import fully_shard

    for block in model.model.layers:
        fully_shard(block)
    fully_shard(model)
    return model


def barrier(layout: Layout) -> None:
    """Wait for every rank (a no-op on one rank)."""
    if layout.sharded:
        dist.barrier()


def mean_over_ranks(value: float, layout: Layout) -> float:
    """The mean of a scalar over ranks."""
    if not layout.sharded:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=layout.device)
    dist.all_reduce(t)
    return float(t) / layout.world


def sum_over_ranks(values: list[float], layout: Layout) -> list[float]:
    """Element-wise sums of a few scalars over ranks."""
    if not layout.sharded:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=layout.device)
    dist.all_reduce(t)
    return t.tolist()


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a DTensor shard (a collective), or ``t`` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def shutdown(layout: Layout) -> None:
    """Destroy the process group if one was started."""
    if layout.sharded and dist.is_initialized():
        dist.destroy_process_group()
