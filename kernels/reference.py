"""The FP8 attention reference: the numerics spec (kernels/README.md) written in plain PyTorch.

Everything is computed in FP32 on dequantised operands (code · scale), which is exactly what an FP8 tensor core with
FP32 accumulation computes up to summation order: products of two E4M3 codes are exact in FP32. The reference
materialises the N×N score matrix, so it is the oracle and the CPU simulation, not a fast path.

Forward, every method: S = Q̂K̂ᵀ·scale, lse = logsumexp(S), P = exp(S − lse), O = P̂V̂, O stored (BF16, or E4M3 for the
cuDNN baseline). Backward recomputes S and P from Q̂, K̂ and the saved lse, then

    dP̂ = dÔ V̂ᵀ,   dS = P ⊙ (dP̂ − δ),   dV = P̂ᵀ dÔ,   dQ = dŜ K̂·scale,   dK = dŜᵀ Q̂·scale,

with δ chosen by the method (stale: dO·O; consistent: dÔ·O; matched: Σ_j P dP̂). Two methods vary the operands instead
(the paper's Appendix C.4 alternatives, as ``deltamatch/methods.py`` defines them): ``bf16_dp`` forms dP from dO and V
rounded to BF16, ``maxshift`` casts the forward's P by its row maximum (``p_encoding``). ``stale_factored`` and
``matched_factored`` move the scales so that each is constant along its matmul's contraction (``scale_layout``,
kernels/README.md). The stale δ reads dO and O as
the backward receives them: the input dO and the BF16-stored O under block scales, but under the cuDNN baseline's
per-tensor scales the FP8 dÔ and the E4M3-stored Ô, since cuDNN's FP8 backward gets both as FP8 tensors and forms δ from
them. There, and for BF16 (whose dO operand is the rounded dO the stale δ reads), consistent is the same number as
stale.
``probe_backward`` returns the backward's intermediates for each δ that differs on the same activations, which is what
the paper's Table 9 measures.
"""

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from deltamatch.kernels import quant
from deltamatch.kernels.inputs import validate_attention_inputs
from deltamatch.methods import DELTA_KINDS, AttentionMethod, get_method, reference_twin

Q_ROWS, KV_ROWS, P_GROUP, DS_TILE = 128, 64, 64, 64
P_FIXED_SCALE = 1.0 / quant.E4M3_MAX  # cuDNN quantises P in [0, 1] with a fixed scale

quantization_disabled = quant.rounding_disabled


@dataclass
class Probe:
    """The backward's intermediates for one δ, internal layout ``(B, H, N, ·)``; gradients in the public layout."""

    delta: torch.Tensor  # (B, H, N)
    ds_before_cast: torch.Tensor  # (B, H, N, N) FP32
    ds_after_cast: torch.Tensor  # (B, H, N, N) dequantised dŜ
    dq: torch.Tensor  # (B, N, H, D)
    dk: torch.Tensor  # (B, N, H_kv, D)
    dv: torch.Tensor  # (B, N, H_kv, D)


def _bhnd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2).float()


def _operands(q, k, v, method: AttentionMethod):
    """Q̂, K̂, V̂ (dequantised, FP32, ``(B, H, N, D)``; K̂ and V̂ still with H_kv heads) as the method rounds them."""
    if method.scaling == "none":
        return quant.round_bf16(q), quant.round_bf16(k), quant.round_bf16(v)
    if method.scaling == "tensor":
        return (quant.quantize_tensor(t)[0] for t in (q, k, v))
    return (
        quant.quantize_tiles(q, Q_ROWS, None)[0],
        quant.quantize_tiles(_centred(k), KV_ROWS, None)[0],
        quant.quantize_tiles(v, KV_ROWS, None)[0],
    )


def _centred(k: torch.Tensor) -> torch.Tensor:
    """K − its mean over tokens, per (batch, kv head): softmax is shift-invariant, so P is unchanged and K's range
    shrinks."""
    return k - k.mean(dim=2, keepdim=True)


def _per_channel(x: torch.Tensor) -> torch.Tensor:
    """The factored layout's operand of a token-contracting matmul: one scale per channel (column), over every token
    of its (batch, head), so the scale is constant along the contraction."""
    return quant.quantize_tiles(x, None, 1)[0]


def _grad_operand(do, method: AttentionMethod) -> torch.Tensor:
    if method.scaling == "none":
        return quant.round_bf16(do)
    if method.scaling == "tensor":
        return quant.quantize_tensor(do)[0]
    return quant.quantize_tiles(do, Q_ROWS, None)[0]


def _probabilities(qh, kh, lse, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores → (P, lse). With ``lse`` given (the backward) P is recomputed from it, as a kernel does."""
    s = (qh @ kh.transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        future = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    if lse is None:
        lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]), lse


def _cast_p(p, method: AttentionMethod, for_dv: bool) -> torch.Tensor:
    """P̂ for PV (per row, per 64-key group) or P̂ᵀ for dV (per key, per 64-query group)."""
    if method.scaling == "none":
        return quant.round_bf16(p)
    if method.scaling == "tensor" or (for_dv and method.scale_layout == "factored"):
        return quant.quantize_fixed(p, P_FIXED_SCALE)
    rows, cols = (P_GROUP, 1) if for_dv else (1, P_GROUP)
    return quant.quantize_tiles(p, rows, cols)[0]


def _cast_ds(ds, method: AttentionMethod) -> torch.Tensor:
    if method.scaling == "none":
        return quant.round_bf16(ds)
    if method.scaling == "tensor":
        return quant.quantize_tensor(ds)[0]
    return quant.quantize_tiles(ds, DS_TILE, DS_TILE)[0]


def _pv(p, vh, method: AttentionMethod) -> torch.Tensor:
    """O = P̂V̂ in FP32. Under the max-shift encoding P/max_j P (row max 1) is cast with the scale that maps 1 to 448
    and the row's max is multiplied back after the matmul, as a kernel would from its running max."""
    if method.p_encoding == "row_max":
        row_max = p.amax(-1, keepdim=True)
        return (quant.quantize_fixed(p / row_max, 1.0 / quant.E4M3_MAX) @ vh) * row_max
    if method.p_encoding == "running_max":
        running = _running_max(p)
        return (quant.quantize_fixed(p / running, 1.0 / quant.E4M3_MAX) * running) @ vh
    return _cast_p(p, method, for_dv=False) @ vh


def _running_max(p: torch.Tensor) -> torch.Tensor:
    """For each key, the row's max of P over the keys up to the end of its 64-key tile: what a one-pass kernel's
    online softmax holds when it casts that tile (its P = exp(S − m) relative to the running max m, ≤ 1). Rows whose
    P is zero so far get 1 (their codes are 0 whatever the scale)."""
    n = p.shape[-1]
    tiles = -(-n // P_GROUP)
    tile_max = torch.nn.functional.pad(p, (0, tiles * P_GROUP - n)).unflatten(-1, (tiles, P_GROUP)).amax(-1)
    running = tile_max.cummax(-1).values.repeat_interleave(P_GROUP, dim=-1)[..., :n]
    return torch.where(running > 0, running, torch.ones_like(running))


def _dp(do, do_hat, v, vh, group: int, method: AttentionMethod) -> torch.Tensor:
    """dP = dO Vᵀ: FP32 products of the FP8 operands dÔ, V̂ (``vh``, already expanded to the query heads), or under
    ``dp_operands="bf16"`` of the incoming dO and V (``v``, H_kv heads) rounded to BF16."""
    if method.dp_operands == "bf16":
        return quant.round_bf16(do) @ quant.round_bf16(_expand(v, group)).transpose(-1, -2)
    return do_hat @ vh.transpose(-1, -2)


def _store_o(o, method: AttentionMethod) -> torch.Tensor:
    if method.scaling == "tensor":
        return quant.quantize_tensor(o)[0]
    return quant.round_bf16(o)


def _expand(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.repeat_interleave(group, dim=1) if group > 1 else x


def _reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    b, h, n, d = x.shape
    return x.reshape(b, h // group, group, n, d).sum(2) if group > 1 else x


def _forward(q, k, v, causal: bool, scale: float, method: AttentionMethod):
    """Internal-layout forward: returns (O as stored, lse)."""
    group = q.shape[1] // k.shape[1]
    qh, kh, vh = _operands(q, k, v, method)
    p, lse = _probabilities(qh, _expand(kh, group), None, causal, scale)
    v_pv = _per_channel(v) if method.scale_layout == "factored" else vh
    return _store_o(_pv(p, _expand(v_pv, group), method), method), lse


def _factored_dq_dk(ds, p, dp, delta, q, k, group: int, scale: float):
    """dŜ and the products dQ = dŜ K̂ᶜ·scale, dK = dŜᵀ Q̂'·scale under the factored layout.

    dŜ has one scale per query row, s_i = (max_j P_ij |dP̂_ij| + |δ_i| max_j P_ij) / 448: a bound on max_j |dS_ij|
    (within 2× of it) that a kernel's δ pass over the row's keys can form, since it needs δ only at the end. s_i is
    constant along dQ's contraction (keys), against K̂ᶜ per channel. Along dK's contraction (queries) it varies, so it
    is folded into the other operand before its cast: dK_jd = Σ_i code_ij (s_i Q_id), with Q' = s ⊙ Q quantised per
    channel. Returns (dŜ, dQ, dK per query head)."""
    bound = (p * dp.abs()).amax(-1, keepdim=True) + delta[..., None].abs() * p.amax(-1, keepdim=True)
    row_scales = torch.where(bound > 0, bound / quant.E4M3_MAX, torch.ones_like(bound))
    codes = quant.round_e4m3(ds / row_scales)
    ds_hat = codes * row_scales
    dq = (ds_hat @ _expand(_per_channel(_centred(k)), group)) * scale
    dk = (codes.transpose(-1, -2) @ _per_channel(row_scales * q)) * scale
    return ds_hat, dq, dk


FORWARD_PV_KINDS = {"pv_fp32": lambda p: p, "pv_tf32": quant.round_tf32, "pv_bf16": quant.round_bf16}
"""Matched's δ reassociated, a proposal (kernels/NOTES.md, session 27): Σ_j P_ij dP̂_ij = Σ_k dÔ_ik (P V̂)_ik, so the
forward could form Ô' = P V̂ beside O = P̂ V̂ (P as the named tensor-core operand: FP32 exact, TF32 or BF16) and the
backward take δ = rowsum(dÔ ⊙ Ô') as FlashAttention takes rowsum(dO ⊙ O), without the δ pass. ``pv_fp32`` is matched's
δ up to FP32 summation order; the other two show what the operand's rounding of P costs the row-sum invariant."""


def _backward(q, k, v, o, lse, do, causal: bool, scale: float, method: AttentionMethod, delta_kind: str) -> Probe:
    """Internal-layout backward for one δ (``stale``, ``consistent``, ``matched`` or one of ``FORWARD_PV_KINDS``)."""
    group = q.shape[1] // k.shape[1]
    qh, kh, vh = _operands(q, k, v, method)
    kh, vh = _expand(kh, group), _expand(vh, group)
    do_hat = _grad_operand(do, method)
    p, _ = _probabilities(qh, kh, lse, causal, scale)
    dp = _dp(do, do_hat, v, vh, group, method)
    if delta_kind == "matched":
        delta = (p * dp).sum(-1)
    elif delta_kind in FORWARD_PV_KINDS:  # dP̂ = dÔ V̂ᵀ (checked by probe_backward), so Σ_j P dP̂ = rowsum(dÔ ⊙ P V̂)
        delta = (do_hat * (FORWARD_PV_KINDS[delta_kind](p) @ vh)).sum(-1)
    elif delta_kind == "consistent" or method.scaling == "tensor":  # cuDNN's stale δ: its FP8 dÔ against Ô
        delta = (do_hat * o).sum(-1)
    else:  # stale (and BF16's FlashAttention δ): the incoming dO in its own precision against the stored O
        delta = (quant.round_bf16(do) if method.scaling == "none" else do).mul(o).sum(-1)
    ds = p * (dp - delta[..., None])
    if method.scale_layout == "factored":  # every scale constant along its matmul's contraction
        ds_hat, dq, dk = _factored_dq_dk(ds, p, dp, delta, q, k, group, scale)
        dv = _cast_p(p, method, for_dv=True).transpose(-1, -2) @ _per_channel(do)
    else:
        ds_hat = _cast_ds(ds, method)
        dv = _cast_p(p, method, for_dv=True).transpose(-1, -2) @ do_hat
        dq = (ds_hat @ kh) * scale
        dk = (ds_hat.transpose(-1, -2) @ qh) * scale
    return Probe(
        delta=delta,
        ds_before_cast=ds,
        ds_after_cast=ds_hat,
        dq=dq.transpose(1, 2),
        dk=_reduce(dk, group).transpose(1, 2),
        dv=_reduce(dv, group).transpose(1, 2),
    )


@contextlib.contextmanager
def _fp32_math(device: torch.device) -> Iterator[None]:
    """No autocast and no TF32 inside the reference: its FP32 must be FP32."""
    with torch.autocast(device.type, enabled=False):
        if device.type == "cuda":
            previous = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = False
            try:
                yield
            finally:
                torch.backends.cuda.matmul.allow_tf32 = previous
        else:
            yield


class _ReferenceAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, method_name, scale):
        method = get_method(method_name)
        with _fp32_math(q.device):
            o, lse = _forward(_bhnd(q), _bhnd(k), _bhnd(v), causal, scale, method)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.method, ctx.scale = causal, method, scale
        return o.transpose(1, 2).to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        with _fp32_math(q.device):
            parts = _backward(
                _bhnd(q), _bhnd(k), _bhnd(v), o, lse, _bhnd(do),
                ctx.causal, ctx.scale, ctx.method, ctx.method.delta_kind,
            )  # fmt: skip
        return parts.dq.to(q.dtype), parts.dk.to(k.dtype), parts.dv.to(v.dtype), None, None, None


def _scale(q: torch.Tensor, softmax_scale: float | None) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])


def attention_reference(q, k, v, causal: bool, method: str, softmax_scale: float | None = None) -> torch.Tensor:
    """Attention under ``method``'s numerics; layout ``(B, N, H, D)``, GQA through ``H % H_kv == 0``."""
    validate_attention_inputs(q, k, v, method, softmax_scale)
    return _ReferenceAttention.apply(q, k, v, bool(causal), method, _scale(q, softmax_scale))


def attention_exact(q, k, v, causal: bool, softmax_scale: float | None = None) -> torch.Tensor:
    """Exact attention in FP64 with plain autograd (the ground truth the methods are measured against)."""
    validate_attention_inputs(q, k, v, "bf16", softmax_scale)
    scale = _scale(q, softmax_scale)
    q64, k64, v64 = (t.double().transpose(1, 2) for t in (q, k, v))
    group = q64.shape[1] // k64.shape[1]
    s = (q64 @ _expand(k64, group).transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return (torch.softmax(s, dim=-1) @ _expand(v64, group)).transpose(1, 2)


def probe_kinds(method: AttentionMethod) -> tuple[str, ...]:
    """The δ that differ under ``method``'s rounding: consistent is its own δ only under block scales, where stale
    reads the unquantised dO; BF16 and the per-tensor baseline read the dO operand of their backward in both."""
    return DELTA_KINDS if method.scaling == "block" else tuple(k for k in DELTA_KINDS if k != "consistent")


def probe_backward(q, k, v, do, causal: bool = True, softmax_scale: float | None = None, method: str = "matched",
                   kinds: tuple[str, ...] | None = None):
    """The backward's intermediates for each δ on the same activations: stale, consistent and matched under the
    paper's block scales (``method="matched"``), stale and matched under ``bf16`` or ``cudnn_fp8_sim`` (per-tensor
    scales), whose consistent δ would repeat the stale one (``probe_kinds``). ``kinds``: these δ instead, among them
    ``FORWARD_PV_KINDS`` (for a method whose dP is dÔ V̂ᵀ of its FP8 operands).

    The forward is shared (the δ differ only in the backward). Returns ``{delta_kind: Probe}``.
    """
    validate_attention_inputs(q, k, v, method, softmax_scale)
    if do.shape != q.shape:
        raise ValueError(f"do must have the shape of q {tuple(q.shape)}, got {tuple(do.shape)}")
    spec, scale = get_method(method), _scale(q, softmax_scale)
    if kinds is not None:
        known = (*DELTA_KINDS, *FORWARD_PV_KINDS)
        unknown = [kind for kind in kinds if kind not in known]
        if unknown:
            raise ValueError(f"unknown delta kinds {unknown}; choose from {list(known)}")
        if any(kind in FORWARD_PV_KINDS for kind in kinds) and (spec.scaling == "none" or spec.dp_operands == "bf16"):
            raise ValueError(f"method {method!r} does not form dP from FP8 dÔ and V̂, which the forward-PV δ "
                             f"{[k for k in kinds if k in FORWARD_PV_KINDS]} reassociate")
    with torch.no_grad(), _fp32_math(q.device):
        qf, kf, vf, dof = (_bhnd(t) for t in (q, k, v, do))
        o, lse = _forward(qf, kf, vf, causal, scale, spec)
        return {
            kind: _backward(qf, kf, vf, o, lse, dof, causal, scale, spec, kind)
            for kind in (probe_kinds(spec) if kinds is None else kinds)
        }


class ReferenceBackend:
    """The reference as a ``dm_attn_func`` backend: runs every valid input, on any device."""

    name = "reference"

    def supports(self, q, k, v, causal, mode) -> str | None:
        twin = reference_twin(mode)
        if twin != mode and q.is_cuda:
            return (f"{mode!r} on CUDA runs on the {'/'.join(get_method(mode).backends)} backend; "
                    f"use mode {twin!r} for the simulation")
        return None

    def apply(self, q, k, v, causal, mode, softmax_scale):
        return attention_reference(q, k, v, causal, reference_twin(mode), softmax_scale)
