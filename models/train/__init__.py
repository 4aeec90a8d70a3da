"""deltamatch.models.train: one trainer from a single CPU process to many GPUs (torchrun, FSDP2, DCP).

``config`` (typed YAML) -> ``distributed`` (torchrun env, process group, FSDP2) -> ``optim`` / ``schedule`` ->
``loop`` (steps, probes, validation) with ``checkpoint`` (atomic DCP, automatic resume) and ``metrics`` (JSONL).
``dm-train`` is ``cli``.
"""
