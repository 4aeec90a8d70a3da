"""The paper's measures of the softmax-gradient invariant, and relative error against exact attention."""

import torch

from deltamatch.kernels.reference import probe_backward


def rowsum_residual(ds: torch.Tensor) -> float:
    """Median over query rows of |Σ_j dS_ij| / Σ_j |dS_ij| (rows with Σ_j |dS_ij| = 0 are skipped)."""
    ds = ds.double()
    num, den = ds.sum(-1).abs().flatten(), ds.abs().sum(-1).flatten()
    keep = den > 0
    if not keep.any():
        raise ValueError("rowsum_residual: every row of dS is zero")
    return (num[keep] / den[keep]).median().item()


def dk_colsum_share(dk: torch.Tensor) -> float:
    """Median over (batch, head, channel) of |Σ_tokens dK| / Σ_tokens |dK|; ``dk`` in the public layout (B, N, H, D)."""
    if dk.dim() != 4:
        raise ValueError(f"dk must be (B, N, H, D), got shape {tuple(dk.shape)}")
    dk = dk.double()
    num, den = dk.sum(1).abs().flatten(), dk.abs().sum(1).flatten()
    keep = den > 0
    if not keep.any():
        raise ValueError("dk_colsum_share: dK is zero in every (batch, head, channel)")
    return (num[keep] / den[keep]).median().item()


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ in FP64."""
    if x.shape != ref.shape:
        raise ValueError(f"relative_error: shapes differ {tuple(x.shape)} vs {tuple(ref.shape)}")
    ref = ref.double().to(x.device)
    norm = ref.norm()
    if norm == 0:
        raise ValueError("relative_error: the reference is zero, so the error relative to it is undefined")
    return ((x.double() - ref).norm() / norm).item()


def residual_summary(q, k, v, do, causal: bool = True, softmax_scale=None) -> dict[str, dict[str, float]]:
    """Row-sum residual before/after the dS cast and the dK column-sum share, for each δ on the same activations."""
    probes = probe_backward(q, k, v, do, causal=causal, softmax_scale=softmax_scale)
    return {
        kind: {
            "before_cast": rowsum_residual(p.ds_before_cast),
            "after_cast": rowsum_residual(p.ds_after_cast),
            "dk_colsum": dk_colsum_share(p.dk),
        }
        for kind, p in probes.items()
    }
