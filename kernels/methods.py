"""The attention methods the paper compares, as data: one registry that models, trainer and reports read."""

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionMethod:
    name: str
    """Config name (``attn_method``)."""
    fp8: bool
    """Whether the seven attention matmuls run on FP8 operands."""
    delta: str
    """Which δ the backward subtracts: ``exact`` (Σ dO·O on BF16 numbers), ``stale`` (Σ dO·O from the dO and O the
    backward receives: the input dO and BF16 O under block scales; the FP8 dÔ and E4M3 Ô under per-tensor scales, as
    cuDNN's FP8 backward forms it), ``consistent`` (Σ dÔ·O) or ``matched`` (Σ_j P dP̂)."""
    scaling: str
    """``block`` (the paper's Appendix B.6 block scales), ``tensor`` (per-tensor, cuDNN/TE) or ``none`` (BF16)."""
    label: str
    """Name used in tables and figures."""


METHODS: dict[str, AttentionMethod] = {
    m.name: m
    for m in (
        AttentionMethod("bf16", False, "exact", "none", "BF16/FP32"),
        AttentionMethod("stale", True, "stale", "block", "naive FP8 (stale δ)"),
        AttentionMethod("consistent", True, "consistent", "block", "consistent-dO"),
        AttentionMethod("matched", True, "matched", "block", "Delta-Matching"),
        AttentionMethod("cudnn_fp8", True, "stale", "tensor", "cuDNN/TE FP8"),
        AttentionMethod("cudnn_fp8_sim", True, "stale", "tensor", "cuDNN/TE FP8 (simulated)"),
    )
}

# What a user may ask ``dm_attn_func`` for; ``cudnn_fp8_sim`` is the reference stand-in for ``cudnn_fp8`` off Hopper.
PUBLIC_MODES = ("bf16", "stale", "consistent", "matched", "cudnn_fp8")


def get_method(name: str) -> AttentionMethod:
    if name not in METHODS:
        raise ValueError(f"unknown attention method {name!r}; choose one of {sorted(METHODS)}")
    return METHODS[name]
