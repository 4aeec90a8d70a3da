"""The backward passes of the Triton FP8 attention: matched δ, dK/dV, dQ — five FP8 matmuls, no N² buffer.

Each pass recomputes S = Q̂K̂ᵀ (matmul 3) and P = exp2(S − lse2) in FP32 from the forward's codes, and dP̂ = dÔ V̂ᵀ
(matmul 4) — so nothing of size N² is ever stored, only O(B·H·N) rows (lse2, δ):

- ``_attn_bwd_delta_matched_kernel`` (matched only): per query block, δ_i = Σ_j P_ij dP̂_ij, one FP32 per row.
  ``stale`` and ``consistent`` get δ from the dO quantisation pass instead (``triton_quant``): the same code path
  below, a different δ.
- ``_attn_bwd_dkdv_kernel``: per key block (and kv head; GQA sums its query heads in registers), loops over queries:
  dSᵀ = Pᵀ ⊙ (dPᵀ − δ), dV += P̂ᵀ dÔ (matmul 5, Pᵀ quantised per key per 64-query group), dK += dŜᵀ Q̂ (matmul 7).
- ``_attn_bwd_dq_kernel``: per query block, loops over keys: dQ += dŜ K̂ (matmul 6).

dS is quantised in 64×64 (query × key) tiles, one scale per tile; both dS kernels compute the same tile values (up to
FP32 accumulation order in the recomputed products). Programs own disjoint outputs: no atomics, so the result is
deterministic.
"""

import math
import os

import torch
import triton
import triton.language as tl

from deltamatch.kernels.triton_fwd import (CUDA_FWD_SWITCH, TMA_SWITCH, ensure_allocator, env_switch,
                                          factored_acc_promote, tma_enabled, cuda_variant)
from deltamatch.kernels.triton_quant import (BLOCK_KV, fragment_token_order, quantize_per_channel,
                                             round_fp32_in_kernels, to_e4m3)

DS_TILE = 64
"""dŜ scale tile (queries × keys)."""


@triton.jit
def _tile_scale_rows(x_abs_rowmax, ROWS: tl.constexpr):
    """Per-row view of a per-64-row-group scale: amax over each group of 64 rows, broadcast back to its rows."""
    if ROWS == 64:
        amax = tl.max(x_abs_rowmax, 0)
        s = tl.where(amax > 0, amax * (1.0 / 448.0), 1.0)
        return tl.full([ROWS], 1.0, tl.float32) * s
    else:
        grouped = tl.max(tl.reshape(x_abs_rowmax, [ROWS // 64, 64]), 1)  # [ROWS / 64]
        grouped = tl.where(grouped > 0, grouped * (1.0 / 448.0), 1.0)
        return tl.reshape(tl.broadcast_to(grouped[:, None], [ROWS // 64, 64]), [ROWS])


@triton.jit
def _recompute_p_dp(q, do, s_q, s_do, lse, k8_ptr, v8_ptr, sk_ptr, sv_ptr, kv_base, skv_base, offs_m, start_n, N,
                    qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                    CAUSAL: tl.constexpr, TMA: tl.constexpr = False, bh_kv=0, RAW_DP: tl.constexpr = False):
    """Matmuls 3 and 4 for one [BLOCK_M, BLOCK_N] tile: P (FP32, from lse) and dP̂, as both row-wise passes see them,
    and the tile's K̂ scale. With TMA, ``k8_ptr``/``v8_ptr`` are descriptors of (B·H_kv, N_pad, D) views and ``bh_kv``
    picks the head. RAW_DP: dÔ V̂ᵀ without its scales, and the tile's V̂ scale in the K̂ scale's place."""
    cols = start_n + tl.arange(0, BLOCK_N)
    if TMA:
        k = k8_ptr.load([bh_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v8_ptr.load([bh_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        kv_ptrs = kv_base + cols.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k8_ptr + kv_ptrs)  # [BLOCK_N, D]
        v = tl.load(v8_ptr + kv_ptrs)  # [BLOCK_N, D]
    s_k = tl.load(sk_ptr + skv_base + start_n // BLOCK_N)
    s_v = tl.load(sv_ptr + skv_base + start_n // BLOCK_N)
    s = tl.dot(q, tl.trans(k)) * (s_q * s_k * qk_scale)  # matmul 3: [BLOCK_M, BLOCK_N]
    p = tl.math.exp2(s - lse[:, None])
    if MASKED:
        visible = (cols[None, :] < N) & (offs_m[:, None] < N)
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None])
        p = tl.where(visible, p, 0.0)
    if RAW_DP:
        return p, tl.dot(do, tl.trans(v)), s_v  # matmul 4, its scales left to the caller
    dp = tl.dot(do, tl.trans(v)) * (s_do * s_v)  # matmul 4
    return p, dp, s_k


@triton.jit
def _load_rows(q8_ptr, do8_ptr, sq_ptr, sdo_ptr, lse_ptr, bh, start_m, offs_m, N, N_PAD, HEAD_DIM: tl.constexpr):
    """A query block's Q̂, dÔ codes, their scales, and lse2."""
    offs_d = tl.arange(0, HEAD_DIM)
    row_ptrs = bh.to(tl.int64) * N_PAD * HEAD_DIM + offs_m.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q8_ptr + row_ptrs)  # [BLOCK_M, D]
    do = tl.load(do8_ptr + row_ptrs)  # [BLOCK_M, D]
    scale_idx = bh.to(tl.int64) * (N_PAD // 128) + start_m // 128
    s_q = tl.load(sq_ptr + scale_idx)
    s_do = tl.load(sdo_ptr + scale_idx)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * N_PAD + offs_m, mask=offs_m < N, other=0.0)
    return q, do, s_q, s_do, lse


@triton.jit
def _kv_sources(k8_ptr, v8_ptr, kv_heads, N_PAD, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """K̂ and V̂ as the row-wise passes read them: TMA descriptors of (B·H_kv, N_pad, D) views, or the pointers."""
    if TMA:
        k_src = tl.make_tensor_descriptor(k8_ptr, shape=[kv_heads, N_PAD, HEAD_DIM],
                                          strides=[N_PAD * HEAD_DIM, HEAD_DIM, 1], block_shape=[1, BLOCK_N, HEAD_DIM])
        v_src = tl.make_tensor_descriptor(v8_ptr, shape=[kv_heads, N_PAD, HEAD_DIM],
                                          strides=[N_PAD * HEAD_DIM, HEAD_DIM, 1], block_shape=[1, BLOCK_N, HEAD_DIM])
    else:
        k_src, v_src = k8_ptr, v8_ptr
    return k_src, v_src


@triton.jit
def _key_ranges(pid_m, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """[0, full_end) needs no mask; [full_end, hi) holds the causal diagonal and the ragged end."""
    full_end = (N // BLOCK_N) * BLOCK_N
    hi = N
    if CAUSAL:
        full_end = tl.minimum(full_end, pid_m * BLOCK_M)
        hi = (pid_m + 1) * BLOCK_M  # <= N_pad; keys >= N are masked
    return full_end, hi


@triton.jit
def _delta_terms(delta, pdp_max, p_max, p, dp, s_v, ROW_SCALES: tl.constexpr, SCALE_AFTER_SUM: tl.constexpr):
    """One tile's share of δ (and of the row-scale maxima): ``dp`` is dP̂, or with SCALE_AFTER_SUM dÔ V̂ᵀ unscaled and
    ``s_v`` its tile's V̂ scale (s_dO is applied once, after the last tile)."""
    if SCALE_AFTER_SUM:
        pdp = p * dp
        delta += tl.sum(pdp, 1) * s_v
        if ROW_SCALES:
            pdp_max = tl.maximum(pdp_max, tl.max(tl.abs(pdp), 1) * s_v)
    else:
        delta += tl.sum(p * dp, 1)
        if ROW_SCALES:
            pdp_max = tl.maximum(pdp_max, tl.max(p * tl.abs(dp), 1))
    if ROW_SCALES:
        p_max = tl.maximum(p_max, tl.max(p, 1))
    return delta, pdp_max, p_max


@triton.jit
def _attn_bwd_delta_matched_kernel(
    q8_ptr, k8_ptr, v8_ptr, do8_ptr,  # codes (.., N_pad, D)
    sq_ptr, sk_ptr, sv_ptr, sdo_ptr, lse_ptr, delta_ptr,
    rs_ptr, irs_ptr,  # ROW_SCALES only: dŜ's row scales s and 1 / s (B, H, N_pad) fp32
    qk_scale, N, N_PAD, H, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    TMA: tl.constexpr = False, ROW_SCALES: tl.constexpr = False, SCALE_AFTER_SUM: tl.constexpr = False,
):
    """δ_i = Σ_j P_ij dP̂_ij per query row; with ROW_SCALES also the factored layout's dŜ row scale
    s_i = (max_j P_ij |dP̂_ij| + |δ_i| max_j P_ij) / 448, a bound on max_j |dS_ij| within 2× of it (kernels/README.md)
    that this pass can form because it needs δ only at the end, and 1 / s_i (the ``1.0 / s`` of the dK launch, which
    the CUDA dK/dV kernel reads instead of dividing per tile).

    SCALE_AFTER_SUM: dP̂'s scales (s_dO per row block, s_V per key tile: constant along the row sum) multiply each
    tile's row sum and row max of P ⊙ (dÔ V̂ᵀ) instead of every element, two multiplies fewer per element; δ and the
    row scales differ from the default's by FP32 rounding (the scales are applied after the sum and the max)."""
    tl.static_assert(BLOCK_N == 64, "K̂/V̂ scales are per 64 keys")
    tl.static_assert(128 % BLOCK_M == 0 and BLOCK_M % BLOCK_N == 0, "blocks nest in the scale blocks")
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    bh_kv = b * (H // GROUP) + h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q, do, s_q, s_do, lse = _load_rows(q8_ptr, do8_ptr, sq_ptr, sdo_ptr, lse_ptr, bh, pid_m * BLOCK_M, offs_m, N,
                                       N_PAD, HEAD_DIM)
    kv_base = bh_kv.to(tl.int64) * N_PAD * HEAD_DIM
    skv_base = bh_kv.to(tl.int64) * (N_PAD // BLOCK_N)
    delta = tl.zeros([BLOCK_M], tl.float32)
    pdp_max = tl.zeros([BLOCK_M], tl.float32)  # ROW_SCALES: max_j P_ij |dP̂_ij| and max_j P_ij
    p_max = tl.zeros([BLOCK_M], tl.float32)
    k_src, v_src = _kv_sources(k8_ptr, v8_ptr, tl.num_programs(1) // GROUP, N_PAD, HEAD_DIM, BLOCK_N, TMA)
    full_end, hi = _key_ranges(pid_m, N, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in range(0, full_end, BLOCK_N):
        p, dp, s_v = _recompute_p_dp(q, do, s_q, s_do, lse, k_src, v_src, sk_ptr, sv_ptr, kv_base, skv_base, offs_m,
                                     start_n, N, qk_scale, HEAD_DIM, BLOCK_N, False, CAUSAL, TMA, bh_kv,
                                     SCALE_AFTER_SUM)
        delta, pdp_max, p_max = _delta_terms(delta, pdp_max, p_max, p, dp, s_v, ROW_SCALES, SCALE_AFTER_SUM)
    for start_n in range(full_end, hi, BLOCK_N):
        p, dp, s_v = _recompute_p_dp(q, do, s_q, s_do, lse, k_src, v_src, sk_ptr, sv_ptr, kv_base, skv_base, offs_m,
                                     start_n, N, qk_scale, HEAD_DIM, BLOCK_N, True, CAUSAL, TMA, bh_kv,
                                     SCALE_AFTER_SUM)
        delta, pdp_max, p_max = _delta_terms(delta, pdp_max, p_max, p, dp, s_v, ROW_SCALES, SCALE_AFTER_SUM)
    if SCALE_AFTER_SUM:
        delta = delta * s_do
        pdp_max = pdp_max * s_do
    tl.store(delta_ptr + bh.to(tl.int64) * N_PAD + offs_m, delta)
    if ROW_SCALES:
        bound = pdp_max + tl.abs(delta) * p_max
        s = tl.where(bound > 0, tl.math.div_rn(bound, 448.0), 1.0)
        tl.store(rs_ptr + bh.to(tl.int64) * N_PAD + offs_m, s)
        tl.store(irs_ptr + bh.to(tl.int64) * N_PAD + offs_m, 1.0 / s)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, s_k, s_v, q8_ptr, q8t_ptr, do8_ptr, do8t_ptr, sq_ptr, sdo_ptr, lse_ptr, delta_ptr,
                stats_ptr, bh, offs_n, qk_scale, N, N_PAD, lo, hi, jump_from, jump_to, k_tok, dq_acc_ptr, rs_ptr,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                CAUSAL: tl.constexpr, ROUND_FP32: tl.constexpr, DS_STATS: tl.constexpr,
                DO_DK: tl.constexpr, DO_DV: tl.constexpr, TMA: tl.constexpr = False,
                DQ_ATOMIC: tl.constexpr = False, FACTORED: tl.constexpr = False, ACC_PROMOTE: tl.constexpr = None):
    """Accumulate dV and (unscaled) dK of one key block over the query tiles [lo, hi) of one query head, skipping
    from ``jump_from`` to ``jump_to`` (one loop body serves both masked ranges: the diagonal and the ragged end).
    With TMA the four code arguments are descriptors of (B·H, rows, cols) views (``_descriptors``).

    DQ_ATOMIC: also add this key block's share of dQ, dŜ K̂ (matmul 6, the same 64 × 64 dŜ tiles and scales as the
    dQ kernel's), to the FP32 accumulator ``dq_acc_ptr`` (B, H, N_pad, D) by atomic adds; ``k_tok`` is the block's
    K̂ᵀ [D, BLOCK_N] (keys contiguous, the wgmma B operand).

    FACTORED (the factored scale layout, kernels/README.md): every scale is constant along the dots' contraction
    (queries), so dV and dK accumulate in place and the caller applies the channel scales once. dV: Pᵀ (<= 1) at
    the fixed scale 1/448 against dÔ with one scale per channel (``do8t_ptr`` holds those codes). dK: dŜᵀ with one
    scale per query (``rs_ptr``, from matched's δ pass) against Q' = s ⊙ Q with one scale per channel (``q8t_ptr``
    holds those codes)."""
    offs_d = tl.arange(0, HEAD_DIM)
    row_base = bh.to(tl.int64) * N_PAD * HEAD_DIM
    for tile_m in range(lo, hi - (jump_to - jump_from), BLOCK_M):
        start_m = tl.where(tile_m < jump_from, tile_m, tile_m + (jump_to - jump_from))
        offs_m = start_m + tl.arange(0, BLOCK_M)
        # B operands, contraction dim contiguous: Q̂ᵀ/dÔᵀ tiles [D, BLOCK_M] read D-major for matmuls 3/4,
        # token-major (from the transposed copies) for matmuls 5/7.
        if TMA:
            qT = tl.trans(q8_ptr.load([bh, start_m, 0]).reshape(BLOCK_M, HEAD_DIM))
        else:
            qT = tl.load(q8_ptr + row_base + offs_m.to(tl.int64)[None, :] * HEAD_DIM + offs_d[:, None])
        s_q = tl.load(sq_ptr + bh.to(tl.int64) * (N_PAD // 128) + start_m // 128)
        s_do = tl.load(sdo_ptr + bh.to(tl.int64) * (N_PAD // 128) + start_m // 128)
        lse = tl.load(lse_ptr + bh.to(tl.int64) * N_PAD + offs_m, mask=offs_m < N, other=0.0)
        sT = tl.dot(k, qT) * (s_k * (s_q * qk_scale))[:, None]  # matmul 3: [BLOCK_N, BLOCK_M]
        pT = tl.math.exp2(sT - lse[None, :])
        if MASKED:
            visible = (offs_n[:, None] < N) & (offs_m[None, :] < N)
            if CAUSAL:
                visible = visible & (offs_m[None, :] >= offs_n[:, None])
            pT = tl.where(visible, pT, 0.0)
        if DO_DV:
            if TMA:
                do_tok = do8t_ptr.load([bh, 0, start_m]).reshape(HEAD_DIM, BLOCK_M)
            else:
                do_tok = tl.load(do8t_ptr + row_base + offs_d[:, None] * N_PAD + offs_m[None, :])  # [D, BLOCK_M]
            if FACTORED:  # matmul 5: dV += P̂ᵀ dÔ, accumulated in place (every scale factors out of the dot)
                dv = tl.dot(to_e4m3(pT * 448.0, ROUND_FP32), tl.trans(do_tok), dv,
                            max_num_imprecise_acc=ACC_PROMOTE)
            else:
                # matmul 5: dV += P̂ᵀ dÔ, Pᵀ scaled per key row for this 64-query group
                pt_max = tl.max(pT, 1)
                s_pt = tl.where(pt_max > 0, pt_max * (1.0 / 448.0), 1.0)
                pt8 = to_e4m3(pT * (1.0 / s_pt)[:, None], ROUND_FP32)
                dv += tl.dot(pt8, tl.trans(do_tok)) * (s_pt * s_do)[:, None]
        if DO_DK:
            if TMA:
                doT = tl.trans(do8_ptr.load([bh, start_m, 0]).reshape(BLOCK_M, HEAD_DIM))
            else:
                doT = tl.load(do8_ptr + row_base + offs_m.to(tl.int64)[None, :] * HEAD_DIM + offs_d[:, None])
            delta = tl.load(delta_ptr + bh.to(tl.int64) * N_PAD + offs_m, mask=offs_m < N, other=0.0)
            dpT = tl.dot(v, doT) * (s_v * s_do)[:, None]  # matmul 4
            dsT = pT * (dpT - delta[None, :])
            if DS_STATS:  # diagnostics: dS row sums (over keys) before the cast, summed across key blocks
                stats = stats_ptr + bh.to(tl.int64) * 2 * N_PAD + offs_m
                tl.atomic_add(stats, tl.sum(dsT, 0), mask=offs_m < N)
                tl.atomic_add(stats + N_PAD, tl.sum(tl.abs(dsT), 0), mask=offs_m < N)
            if TMA:
                q_tok = q8t_ptr.load([bh, 0, start_m]).reshape(HEAD_DIM, BLOCK_M)
            else:
                q_tok = tl.load(q8t_ptr + row_base + offs_d[:, None] * N_PAD + offs_m[None, :])  # [D, BLOCK_M]
            if FACTORED:  # matmul 7: dK += dŜᵀ Q̂', dŜ per query row, Q' = s ⊙ Q per channel: in place
                s_row = tl.load(rs_ptr + bh.to(tl.int64) * N_PAD + offs_m, mask=offs_m < N, other=1.0)
                ds8 = to_e4m3(dsT * (1.0 / s_row)[None, :], ROUND_FP32)
                dk = tl.dot(ds8, tl.trans(q_tok), dk, max_num_imprecise_acc=ACC_PROMOTE)
            else:
                # matmul 7: dK += dŜᵀ Q̂, one dŜ scale per 64×64 tile
                s_ds = _tile_scale_rows(tl.max(tl.abs(dsT), 1), BLOCK_N)
                ds8 = to_e4m3(dsT * (1.0 / s_ds)[:, None], ROUND_FP32)
                dk += tl.dot(ds8, tl.trans(q_tok)) * (s_ds * s_q)[:, None]
            if DQ_ATOMIC:  # matmul 6 here instead of in the dQ kernel: dQ += dŜ K̂, one scale per 64 × 64 tile
                dq_part = tl.dot(tl.trans(ds8), tl.trans(k_tok)) * tl.max(s_ds * s_k, 0)  # [BLOCK_M, D]
                dq_ptrs = dq_acc_ptr + row_base + offs_m.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
                tl.atomic_add(dq_ptrs, dq_part, mask=(offs_m < N)[:, None], sem="relaxed")
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    q8_ptr, q8t_ptr, k8_ptr, v8_ptr, do8_ptr, do8t_ptr,  # codes; *t are (.., D, N_pad)
    sq_ptr, sk_ptr, sv_ptr, sdo_ptr, lse_ptr, delta_ptr,
    dk_ptr, dv_ptr,  # (B, N, H_kv, D)
    stats_ptr,  # DS_STATS only: (B, H, 2, N_pad) fp32, Σ_j dS_ij and Σ_j |dS_ij|
    k8t_ptr, dq_acc_ptr,  # DQ_ATOMIC only: K̂ᵀ codes (B, H_kv, D, N_pad); dQ's FP32 accumulator (B, H, N_pad, D)
    sdoc_ptr, sqc_ptr, rs_ptr,  # FACTORED only: dÔ's and Q''s channel scales (B, H, D), dŜ's row scales (B, H, N_pad)
    stride_kb, stride_kn, stride_kh,
    qk_scale, softmax_scale, N, N_PAD, H, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, ROUND_FP32: tl.constexpr, DS_STATS: tl.constexpr = False, SPLIT: tl.constexpr = True,
    DO_DK: tl.constexpr = True, DO_DV: tl.constexpr = True, TMA: tl.constexpr = False,
    DQ_ATOMIC: tl.constexpr = False, FACTORED: tl.constexpr = False, ACC_PROMOTE: tl.constexpr = None,
):
    """dK and dV of one key block (DO_DK / DO_DV: only one of them, when the two run as separate launches), and with
    DQ_ATOMIC the block's share of dQ (atomic adds; the dQ kernel is then not launched). FACTORED: the factored scale
    layout (``_dkdv_tiles``)."""
    tl.static_assert(not (FACTORED and DQ_ATOMIC), "atomic dQ adds tile-scaled dŜ; the factored dQ is its own kernel")
    tl.static_assert(BLOCK_M == 64, "P̂ᵀ and dŜ scales are per 64 queries along dV's and dK's contraction")
    tl.static_assert(BLOCK_N % 64 == 0, "a key block holds whole 64-key scale groups")
    tl.static_assert(not DQ_ATOMIC or (BLOCK_N == 64 and DO_DK), "atomic dQ: 64 x 64 dŜ tiles, in the dK launch")
    pid_n, bh_kv = tl.program_id(0), tl.program_id(1)
    H_KV = H // GROUP
    b, h_kv = bh_kv // H_KV, bh_kv % H_KV
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_ptrs = bh_kv.to(tl.int64) * N_PAD * HEAD_DIM + offs_n.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k8_ptr + kv_ptrs)  # [BLOCK_N, D]
    v = tl.load(v8_ptr + kv_ptrs)  # [BLOCK_N, D]
    s_k = tl.load(sk_ptr + bh_kv.to(tl.int64) * (N_PAD // 64) + offs_n // 64)  # [BLOCK_N], per row of A
    s_v = tl.load(sv_ptr + bh_kv.to(tl.int64) * (N_PAD // 64) + offs_n // 64)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # query tiles: [lo, diag_end) the causal diagonal (masked), [diag_end, full_end) unmasked, [full_end, N) ragged
    full_end = (N // BLOCK_M) * BLOCK_M
    lo = 0
    diag_end = 0
    if CAUSAL:
        lo = start_n
        diag_end = tl.maximum(lo, tl.minimum(start_n + BLOCK_N, full_end))
    tail = tl.maximum(full_end, lo)
    # one masked loop body for all query tiles: without SPLIT (fewer registers, more mask arithmetic), and for the
    # ragged last key block, whose missing keys must stay out of P, dS and their scales
    if not SPLIT:
        diag_end = lo
        tail = lo
    if start_n + BLOCK_N > N:
        diag_end = lo
        tail = lo
        full_end = lo  # the unmasked range [diag_end, full_end) is empty
    if TMA:  # Q̂, dÔ and their token-major copies through Hopper's tensor memory accelerator
        rows = tl.num_programs(1) * GROUP  # B·H query heads
        q_src = tl.make_tensor_descriptor(q8_ptr, shape=[rows, N_PAD, HEAD_DIM], strides=[N_PAD * HEAD_DIM, HEAD_DIM, 1],
                                          block_shape=[1, BLOCK_M, HEAD_DIM])
        do_src = tl.make_tensor_descriptor(do8_ptr, shape=[rows, N_PAD, HEAD_DIM],
                                           strides=[N_PAD * HEAD_DIM, HEAD_DIM, 1], block_shape=[1, BLOCK_M, HEAD_DIM])
        qt_src = tl.make_tensor_descriptor(q8t_ptr, shape=[rows, HEAD_DIM, N_PAD],
                                           strides=[HEAD_DIM * N_PAD, N_PAD, 1], block_shape=[1, HEAD_DIM, BLOCK_M])
        dot_src = tl.make_tensor_descriptor(do8t_ptr, shape=[rows, HEAD_DIM, N_PAD],
                                            strides=[HEAD_DIM * N_PAD, N_PAD, 1], block_shape=[1, HEAD_DIM, BLOCK_M])
    else:
        q_src, do_src, qt_src, dot_src = q8_ptr, do8_ptr, q8t_ptr, do8t_ptr
    if DQ_ATOMIC:  # this key block's K̂ᵀ, once: the B operand of its dQ shares
        k_tok = tl.load(k8t_ptr + bh_kv.to(tl.int64) * HEAD_DIM * N_PAD + offs_d[:, None] * N_PAD + offs_n[None, :])
    else:
        k_tok = k
    # FACTORED: dv and dk are held in units of the current head's dÔ and Q' channel scales
    s_doc = tl.full([HEAD_DIM], 1.0, tl.float32)
    s_qc = tl.full([HEAD_DIM], 1.0, tl.float32)
    for g in range(0, GROUP):
        bh = b * H + h_kv * GROUP + g
        if FACTORED:  # GQA: the heads' channel scales differ, so rescale once per head (a D-vector, not per tile)
            if DO_DV:
                s_next = tl.load(sdoc_ptr + bh.to(tl.int64) * HEAD_DIM + offs_d)
                dv = dv * (s_doc / s_next)[None, :]
                s_doc = s_next
            if DO_DK:
                s_next = tl.load(sqc_ptr + bh.to(tl.int64) * HEAD_DIM + offs_d)
                dk = dk * (s_qc / s_next)[None, :]
                s_qc = s_next
        if SPLIT:
            dk, dv = _dkdv_tiles(dk, dv, k, v, s_k, s_v, q_src, qt_src, do_src, dot_src, sq_ptr, sdo_ptr,
                                 lse_ptr, delta_ptr, stats_ptr, bh, offs_n, qk_scale, N, N_PAD, diag_end, full_end,
                                 0, 0, k_tok, dq_acc_ptr, rs_ptr, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, ROUND_FP32,
                                 DS_STATS, DO_DK, DO_DV, TMA, DQ_ATOMIC, FACTORED, ACC_PROMOTE)
        # masked: the diagonal [lo, diag_end), then the ragged end [tail, N)
        dk, dv = _dkdv_tiles(dk, dv, k, v, s_k, s_v, q_src, qt_src, do_src, dot_src, sq_ptr, sdo_ptr, lse_ptr,
                             delta_ptr, stats_ptr, bh, offs_n, qk_scale, N, N_PAD, lo, N, diag_end, tail, k_tok,
                             dq_acc_ptr, rs_ptr, HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, ROUND_FP32, DS_STATS, DO_DK,
                             DO_DV, TMA, DQ_ATOMIC, FACTORED, ACC_PROMOTE)
    out = b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh  # dK and dV share one layout
    out = out + offs_n.to(tl.int64)[:, None] * stride_kn + offs_d[None, :]
    valid = (offs_n < N)[:, None]
    if FACTORED:
        dk = dk * s_qc[None, :]
        dv = dv * (s_doc * (1.0 / 448.0))[None, :]
    if DO_DK:
        tl.store(dk_ptr + out, (dk * softmax_scale).to(dk_ptr.dtype.element_ty), mask=valid)
    if DO_DV:
        tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _dq_tiles(dq, q, do, s_q, s_do, lse, delta, rowsum, rowabs, k8_ptr, k8t_ptr, v8_ptr, sk_ptr, sv_ptr, kv_base,
              skv_base, offs_m, qk_scale, N, N_PAD, lo, hi, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, ROUND_FP32: tl.constexpr,
              DS_STATS: tl.constexpr, TMA: tl.constexpr = False, bh_kv=0, FACTORED: tl.constexpr = False, s_row=None,
              ACC_PROMOTE: tl.constexpr = None):
    """dQ of one query block over the key tiles [lo, hi). FACTORED: dŜ with one scale per query row (``s_row``)
    against K̂ᶜ with one scale per channel (``k8t_ptr`` holds those codes), accumulated in place; the caller applies
    both scales."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        p, dp, s_k = _recompute_p_dp(q, do, s_q, s_do, lse, k8_ptr, v8_ptr, sk_ptr, sv_ptr, kv_base, skv_base,
                                     offs_m, start_n, N, qk_scale, HEAD_DIM, BLOCK_N, MASKED, CAUSAL, TMA, bh_kv)
        ds = p * (dp - delta[:, None])  # [BLOCK_M, BLOCK_N]
        if DS_STATS:
            rowsum += tl.sum(ds, 1)
            rowabs += tl.sum(tl.abs(ds), 1)
        cols = start_n + tl.arange(0, BLOCK_N)
        if TMA:
            k_tok = k8t_ptr.load([bh_kv, 0, start_n]).reshape(HEAD_DIM, BLOCK_N)
        else:
            k_tok = tl.load(k8t_ptr + kv_base + offs_d[:, None] * N_PAD + cols[None, :])  # [D, BLOCK_N]
        if FACTORED:  # matmul 6: dQ += dŜ K̂ᶜ, accumulated in place
            dq = tl.dot(to_e4m3(ds * (1.0 / s_row)[:, None], ROUND_FP32), tl.trans(k_tok), dq,
                        max_num_imprecise_acc=ACC_PROMOTE)
        else:
            s_ds = _tile_scale_rows(tl.max(tl.abs(ds), 1), BLOCK_M)
            ds8 = to_e4m3(ds * (1.0 / s_ds)[:, None], ROUND_FP32)
            dq += tl.dot(ds8, tl.trans(k_tok)) * (s_ds * s_k)[:, None]  # matmul 6
    return dq, rowsum, rowabs


@triton.jit
def _attn_bwd_dq_kernel(
    q8_ptr, k8_ptr, k8t_ptr, v8_ptr, do8_ptr,
    sq_ptr, sk_ptr, sv_ptr, sdo_ptr, lse_ptr, delta_ptr,
    dq_ptr,  # (B, N, H, D)
    stats_ptr,  # DS_STATS only: (B, H, 2, N_pad) fp32, Σ_j dS_ij and Σ_j |dS_ij|
    skc_ptr, rs_ptr,  # FACTORED only: K̂ᶜ's channel scales (B, H_kv, D), dŜ's row scales (B, H, N_pad)
    stride_qb, stride_qn, stride_qh,
    qk_scale, softmax_scale, N, N_PAD, H, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, ROUND_FP32: tl.constexpr, DS_STATS: tl.constexpr = False, TMA: tl.constexpr = False,
    FACTORED: tl.constexpr = False, ACC_PROMOTE: tl.constexpr = None,
):
    """dQ of one query block; FACTORED: the factored scale layout, ``k8t_ptr`` holding K̂ᶜ's codes (``_dq_tiles``)."""
    tl.static_assert(BLOCK_N == 64, "dŜ and K̂ scales are per 64 keys along dQ's contraction")
    tl.static_assert(128 % BLOCK_M == 0 and BLOCK_M % BLOCK_N == 0, "blocks nest in the scale blocks")
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    bh_kv = b * (H // GROUP) + h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q, do, s_q, s_do, lse = _load_rows(q8_ptr, do8_ptr, sq_ptr, sdo_ptr, lse_ptr, bh, pid_m * BLOCK_M, offs_m, N,
                                       N_PAD, HEAD_DIM)
    delta = tl.load(delta_ptr + bh.to(tl.int64) * N_PAD + offs_m, mask=offs_m < N, other=0.0)
    kv_base = bh_kv.to(tl.int64) * N_PAD * HEAD_DIM
    skv_base = bh_kv.to(tl.int64) * (N_PAD // BLOCK_N)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    rowsum = tl.zeros([BLOCK_M], tl.float32)
    rowabs = tl.zeros([BLOCK_M], tl.float32)
    s_row = tl.full([BLOCK_M], 1.0, tl.float32)
    if FACTORED:
        s_row = tl.load(rs_ptr + bh.to(tl.int64) * N_PAD + offs_m, mask=offs_m < N, other=1.0)
    full_end, hi = _key_ranges(pid_m, N, BLOCK_M, BLOCK_N, CAUSAL)
    k_src, v_src = _kv_sources(k8_ptr, v8_ptr, tl.num_programs(1) // GROUP, N_PAD, HEAD_DIM, BLOCK_N, TMA)
    if TMA:
        kt_src = tl.make_tensor_descriptor(k8t_ptr, shape=[tl.num_programs(1) // GROUP, HEAD_DIM, N_PAD],
                                           strides=[HEAD_DIM * N_PAD, N_PAD, 1], block_shape=[1, HEAD_DIM, BLOCK_N])
    else:
        kt_src = k8t_ptr
    dq, rowsum, rowabs = _dq_tiles(dq, q, do, s_q, s_do, lse, delta, rowsum, rowabs, k_src, kt_src, v_src, sk_ptr,
                                   sv_ptr, kv_base, skv_base, offs_m, qk_scale, N, N_PAD, 0, full_end, HEAD_DIM,
                                   BLOCK_M, BLOCK_N, False, CAUSAL, ROUND_FP32, DS_STATS, TMA, bh_kv, FACTORED, s_row,
                                   ACC_PROMOTE)
    dq, rowsum, rowabs = _dq_tiles(dq, q, do, s_q, s_do, lse, delta, rowsum, rowabs, k_src, kt_src, v_src, sk_ptr,
                                   sv_ptr, kv_base, skv_base, offs_m, qk_scale, N, N_PAD, full_end, hi, HEAD_DIM,
                                   BLOCK_M, BLOCK_N, True, CAUSAL, ROUND_FP32, DS_STATS, TMA, bh_kv, FACTORED, s_row,
                                   ACC_PROMOTE)
    if DS_STATS:
        stats = stats_ptr + bh.to(tl.int64) * 2 * N_PAD + offs_m
        tl.store(stats, rowsum, mask=offs_m < N)
        tl.store(stats + N_PAD, rowabs, mask=offs_m < N)
    if FACTORED:
        dq = dq * s_row[:, None] * tl.load(skc_ptr + bh_kv.to(tl.int64) * HEAD_DIM + offs_d)[None, :]
    out_ptrs = dq_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    out_ptrs = out_ptrs + offs_m.to(tl.int64)[:, None] * stride_qn + offs_d[None, :]
    tl.store(out_ptrs, (dq * softmax_scale).to(dq_ptr.dtype.element_ty), mask=(offs_m < N)[:, None])


def backward_config(head_dim: int) -> dict:
    """Block sizes per head dim: dK/dV hold two BLOCK_N × D FP32 accumulators (or one each when ``SEPARATE``), dQ one
    BLOCK_M × D.

    Chosen by tools/device/kernel_sweep.py on the H200 (causal, N = 8192, B·H = 64; kernels/NOTES.md has the table):
    at D = 128 and 256 two launches (dK: S, dP, dK; dV: S, dV) spill less and beat the fused dK/dV kernel despite
    recomputing S once more; at D = 64 the fused one wins. The δ pass loads through pointers unless
    ``DELTAMATCH_KERNEL_TMA=1``: at D = 128 its TMA descriptor loads cost matched_factored's δ pass 1.49 ms of kernel
    time a step against 1.37 (CUPTI, session 16, kernels/NOTES.md; the same bits), where the forward gains from them.
    The δ pass applies dP̂'s scales after each tile's row sum (``SCALE_AFTER_SUM``: two multiplies fewer an element,
    124 → 95 registers at D = 128; δ and the row scales move by FP32 rounding): on the H200 1.47 → 1.41 ms at D = 128
    (session 17), 1.117 → 1.077 at D = 64 and 2.904 → 2.832 at D = 256 (session 18, ``tools/device/delta_bench.py``).
    """
    tma = {"TMA": True} if tma_enabled(head_dim) else {}
    delta_opts = dict(SCALE_AFTER_SUM=True, **({"TMA": True} if env_switch(TMA_SWITCH) else {}))
    if head_dim <= 64:
        dkdv = dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=1, SPLIT=True, **tma)
    elif head_dim <= 128:
        dkdv = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, SPLIT=True, SEPARATE=True, **tma)
    else:
        dkdv = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1, SPLIT=True, SEPARATE=True, **tma)
    if dq_atomic_requested() and dkdv["BLOCK_N"] == 64:  # dQ by atomics in the dK launch (64 x 64 dŜ tiles)
        dkdv["DQ_ATOMIC"] = True
    if head_dim <= 128:
        return dict(dkdv=dkdv, dq=dict(BLOCK_M=64, BLOCK_N=BLOCK_KV, num_warps=4, num_stages=3, **tma),
                    delta=dict(BLOCK_M=128, BLOCK_N=BLOCK_KV, num_warps=8, num_stages=3, **delta_opts))
    dq_tma = tma if env_switch(TMA_SWITCH) else {}  # pointers 9.20 ms against TMA's 9.72 (session 41, H100)
    return dict(dkdv=dkdv, dq=dict(BLOCK_M=64, BLOCK_N=BLOCK_KV, num_warps=4, num_stages=1, **dq_tma),
                delta=dict(BLOCK_M=64, BLOCK_N=BLOCK_KV, num_warps=4, num_stages=2, **delta_opts))


DQ_ATOMIC_SWITCH = "DELTAMATCH_KERNEL_DQ_ATOMIC"
"""``1``: dQ by atomic adds inside the dK/dV kernels (matmul 6 moves there, the dQ kernel's recompute of S and dP goes):
Triton's dK launch where it has 64 × 64 dŜ tiles (D = 128 and 256), and ``matched_factored``'s CUDA dK/dV
(``cuda_lib.dqdkdv_factored``, promoted: FA3's shared-memory dQ tile and one bulk reduce-add per tile). Not
bit-reproducible (the adds land in any order), so the deterministic dQ kernel stays the default."""


def dq_atomic_requested() -> bool:
    return bool(env_switch(DQ_ATOMIC_SWITCH))


DQ_ORDERED_SWITCH = "DELTAMATCH_KERNEL_DQ_ORDERED"
"""``matched_factored``'s CUDA backward forms dQ inside its dK/dV launch with the adds into each query tile in one order
(``cuda_lib.dqdkdv_factored(ordered=True)``, FA3's deterministic mode, ``cuda_lib.DQ_SYNC_DEFAULT``): dQ
bit-reproducible, one launch fewer, 2.9% a step faster than the two launches on the H200 (sessions 15 and 16,
kernels/NOTES.md). Its dK and dV sum their query tiles in increasing order, so they are within one bf16 rounding of
Triton's, not its bits. Unset or ``1``: on; ``0``: dK/dV and then the dQ kernel (Triton's bits).
:data:`DQ_ATOMIC_SWITCH` (any order) takes precedence."""


def dq_ordered_requested() -> bool:
    return env_switch(DQ_ORDERED_SWITCH) is not False


CUDA_DKDV_SWITCH = "DELTAMATCH_KERNEL_CUDA_DKDV"
"""The form of the CUDA dK/dV launch that also forms dQ (:data:`DQ_ORDERED_SWITCH`, :data:`DQ_ATOMIC_SWITCH`): one of
``cuda_lib.DKDV_WITH_DQ``; unset: :data:`CUDA_DKDV_DEFAULT`, ``ws3xfdt``: ``ws3xfd`` with dK and dV stored through
shared memory by tensor stores (the same bits; dK/dV + dQ 3.795 → 3.701 ms a step, lower in each of four interleaved
rounds, H100, session 35). ``ws3xfd`` is ``ws3xf`` with dQ's product in a fourth warpgroup of its own, so the
consumers' chain a tile ends with dK's product (``ws3xf``'s bits; dK/dV + dQ 4.204 → 4.036 ms a step, H100, session
32). ``ws3xf`` is ``ws3x`` (dQ's dŜ tile by lane exchange: ``ws3``'s bits in 61
instructions fewer a thread and tile, 4.78 → 4.52 ms, H200, session 23) with 448 folded into the row terms
(``cuda_lib.DKDV_FOLDED``: one multiply an element fewer, ``ws3x``'s bits to a few ulps before the casts; 4.140 ms a
step against 4.194, H200, session 30); ``ws3xf``, ``ws3x`` and ``ws3`` (the byte stores) when asked."""
CUDA_DKDV_DEFAULT = "ws3xfdt"


def cuda_dkdv_variant(ordered: bool = True) -> str:
    """The form of the CUDA dK/dV launch with dQ that :data:`CUDA_DKDV_SWITCH` asks for; a bad value is an error that
    names the switch, and so is a form built with ordered adds only (``ws3xp``) where the adds are to land in any order
    (``ordered`` False: :data:`DQ_ATOMIC_SWITCH` set)."""
    from deltamatch.kernels import cuda_lib

    value = os.environ.get(CUDA_DKDV_SWITCH, "")
    if value and value not in cuda_lib.DKDV_WITH_DQ:
        raise ValueError(f"{CUDA_DKDV_SWITCH}={value!r}: expected one of {cuda_lib.DKDV_WITH_DQ} (or unset)")
    if not ordered and value in cuda_lib.DKDV_ORDERED_ONLY:
        raise ValueError(f"{CUDA_DKDV_SWITCH}={value!r} is built with its dQ adds ordered only, and {DQ_ATOMIC_SWITCH} "
                         f"asks for them in any order: unset one of the two")
    return value or CUDA_DKDV_DEFAULT


CUDA_DKDV64_SWITCH = "DELTAMATCH_KERNEL_CUDA_DKDV64"
"""At D = 64, ``matched_factored``'s dK and dV through the fused CUDA kernel's D = 64 build (``dkdv_factored.cu``,
``dm_dkdv_factored_d64``): a form of ``cuda_lib.DKDV_D64_VARIANTS`` runs it (Triton's bits; dQ stays Triton's launch),
one of ``cuda_lib.DKDV_D64_WITH_DQ`` forms dQ in the same launch (:func:`dq_in_dkdv64`: promoted, its adds ordered as
:data:`DQ_ORDERED_SWITCH` and :data:`DQ_ATOMIC_SWITCH` say; the forward then writes K̂ᶜ in fragment order), an error
where it cannot run (``ds_stats`` included); ``0`` Triton's launch. Unset: :data:`CUDA_DKDV64_DEFAULT` where the
library loads, bf16 or fp16, with the default config and no ``ds_stats``, and :data:`CUDA_SWITCH` unset. Where the
CUDA dQ's D = 64 build is asked for (:data:`CUDA_DQ64_SWITCH`) a form with dQ runs without it, beside that kernel."""
CUDA_DKDV64_DEFAULT = "ws3xfd"
"""The D = 64 dK/dV form where :data:`CUDA_DKDV64_SWITCH` is unset: ``ws3xfd``, dQ in the same launch with its adds
ordered (dQ bit-reproducible; dK and dV within rounding of Triton's, as D = 128's default): CUPTI of a step at
B 4, H 16, N = 8K, causal 6.227 / 6.268 → 5.427 / 5.401 ms (the launch 2.790 / 2.777 and its epilogue 0.070, where
``ws3`` took 2.186 / 2.201 and Triton's dQ 1.482 / 1.495), fwd+bwd 315 / 315 → 361 / 358 TFLOP/s at 8K and 342 / 344
→ 400 / 400 at 16K (an H100, session 43, call 2, two rounds). ``ws3`` (3 stages, Triton's bits, dQ by Triton's launch)
2.188 ms promoted against Triton's fused launch's 4.037 at B·H = 64, N = 8K, causal (an H200, session 42,
``tools/device/cuda_dv_bench.py --head-dim 64 --dkdv-only``, one run; ``ws4`` 2.172, within the spread; unpromoted
1.807 and 1.942 against 3.873)."""


def cuda_dkdv64_variant(head_dim: int, dtype: torch.dtype, stats: bool = False,
                        default_config: bool = True) -> str | None:
    """The form of the CUDA dK/dV kernel's D = 64 build that runs (:data:`CUDA_DKDV64_SWITCH`), or None; a bad value,
    or a form asked for where it cannot run, is an error that names the switch."""
    from deltamatch.kernels import cuda_lib

    return cuda_variant(CUDA_DKDV64_SWITCH, {64: cuda_lib.DKDV_D64_VARIANTS + cuda_lib.DKDV_D64_WITH_DQ},
                        CUDA_DKDV64_DEFAULT, "dK/dV kernel", head_dim,
                        env_switch(CUDA_SWITCH) is not None or stats or not default_config,
                        (_no_diagnostics(stats),), dtype)


def dq_in_dkdv64(variant: str | None, promote: bool) -> bool:
    """Whether the D = 64 dK/dV form ``variant`` (:func:`cuda_dkdv64_variant`) forms dQ in its launch: a form of
    ``cuda_lib.DKDV_D64_WITH_DQ``, promoted (its only build), with dQ in the dK/dV launch asked for
    (:data:`DQ_ORDERED_SWITCH` unset or 1, or :data:`DQ_ATOMIC_SWITCH`). Otherwise such a form runs as the D = 64 build
    without dQ (``cuda_lib.DKDV_D64_VARIANTS[0]``) beside the dQ launch."""
    from deltamatch.kernels import cuda_lib

    return (variant in cuda_lib.DKDV_D64_WITH_DQ and promote
            and (dq_atomic_requested() or dq_ordered_requested()))


CUDA_DQ64_SWITCH = "DELTAMATCH_KERNEL_CUDA_DQ64"
"""At D = 64, ``matched_factored``'s dQ through the CUDA dQ kernel's D = 64 build (``dq_factored.cu``,
``dm_dq_factored_d64``: Triton's bits, K̂ᶜ written in fragment order by the forward): a form of ``cuda_lib.DQ_VARIANTS``
runs it (an error where it cannot run, ``ds_stats`` included). Unset or ``0``: Triton's launch, which is faster:
1.481 ms against the build's 1.707 promoted (1.367 against 1.695 unpromoted) at B·H = 64, N = 8K, causal on an H100
(session 43, ``tools/device/cuda_dv_bench.py --head-dim 64 --dq-only``); CUPTI of a step 1.470 against 1.693."""


def cuda_dq64_variant(head_dim: int, dtype: torch.dtype, stats: bool = False) -> str | None:
    """The form of the CUDA dQ kernel's D = 64 build that runs (:data:`CUDA_DQ64_SWITCH`, asked for only), or None; a
    bad value, or a form asked for where it cannot run, is an error that names the switch."""
    from deltamatch.kernels import cuda_lib

    return cuda_variant(CUDA_DQ64_SWITCH, {64: cuda_lib.DQ_VARIANTS}, cuda_lib.DQ_VARIANTS[0], "dQ kernel", head_dim,
                        True, (_no_diagnostics(stats),), dtype)


def _no_diagnostics(stats: bool):
    """A ``cuda_variant`` check: the ``ds_stats`` diagnostics of dK/dV and dQ are Triton's launches' alone."""
    return lambda: "ds_stats diagnostics are formed by Triton's kernels only" if stats else ""


CUDA_SWITCH = "DELTAMATCH_KERNEL_CUDA"
"""``matched_factored``'s forward (``kernels/cuda/fwd_factored.cu``), its δ pass (``delta_factored.cu``) and its dK, dV
and dQ (``dkdv_factored.cu``, one warp-specialised launch for dK and dV, and ``dq_factored.cu``): ``1`` through the
CUDA kernels (an error where they cannot run), ``0`` through Triton's launches, unset: CUDA where the library loads
(built by ``dm-cuda-build``, an sm90 GPU) at D = 128 with the default launch config, for the kernels the H200 timed
faster than Triton's (``CUDA_DEFAULT``), Triton elsewhere. The two give the same bits (tests/kernels/test_cuda_gpu.py).
The forward's default is another CUDA kernel, over 128-key tiles and not Triton's bits (``triton_fwd.CUDA_FWD_SWITCH``);
this switch set either way puts the forward back on the kernels above."""
CUDA_DEFAULT = {"backward": True, "forward": False, "δ pass": False}
"""Whether the CUDA kernels run where :data:`CUDA_SWITCH` is unset: the backward's dK, dV, dQ (1.7× and 1.13× Triton's,
session 11), not the forward's nor the δ pass's with Triton's bits (2.20 ms against 1.96 and 1.62 against 1.49 in
session 11: kernels/NOTES.md); the forward and δ pass over 128-key tiles have switches of their own
(``triton_fwd.CUDA_FWD_SWITCH``, :data:`CUDA_DELTA_SWITCH`)."""


def cuda_kernels_selected(head_dim: int, dtype: torch.dtype, stats: bool = False, default_config: bool = True,
                          what: str = "backward") -> bool:
    """Whether ``matched_factored``'s ``what`` (a :data:`CUDA_DEFAULT` key) runs through the CUDA kernels
    (:data:`CUDA_SWITCH`). They have no ``ds_stats`` diagnostics and serve D = 128 only; unset, a config the caller
    chose (the sweep) keeps Triton's launches."""
    from deltamatch.kernels import cuda_lib

    switch = env_switch(CUDA_SWITCH)
    if switch is False or (switch is None and (stats or not default_config or not CUDA_DEFAULT[what])):
        return False
    _, reason = cuda_lib.load()
    if not reason and head_dim != cuda_lib.DV_HEAD_DIM:
        reason = f"head dim {head_dim}: the CUDA {what} kernels are built for D = {cuda_lib.DV_HEAD_DIM} only"
    if not reason and dtype not in (torch.bfloat16, torch.float16):
        reason = f"dtype {dtype}: the CUDA {what} kernels write bf16 or fp16"
    if not reason and stats:
        reason = "ds_stats diagnostics are formed by Triton's kernels only"
    if reason and switch:
        raise RuntimeError(f"{CUDA_SWITCH}=1 but the CUDA {what} kernels cannot run: {reason}")
    return not reason


CUDA_DELTA_SWITCH = "DELTAMATCH_KERNEL_CUDA_DELTA"
"""``matched_factored``'s δ pass through the CUDA kernel over 128-key tiles (``kernels/cuda/delta_wide.cu``; δ not
Triton's bits: FP32 summation order): a variant of ``cuda_lib.DELTA_WIDE_VARIANTS`` runs it (an error where it cannot
run); ``0``: the δ pass :data:`CUDA_SWITCH` picks. Unset: :data:`CUDA_DELTA_DEFAULT` where the library loads, at
D = 128 or 64 (``cuda_lib.DEFAULT_HEAD_DIMS``) with the default config and no ``ds_stats``, and
``DELTAMATCH_KERNEL_CUDA`` is unset; Triton's pass elsewhere. At D = 64 the D = 64 build runs
(``cuda_lib.DELTA_WIDE_D64_VARIANTS``)."""
CUDA_DELTA_DEFAULT = "w4pm"
"""The δ pass where :data:`CUDA_DELTA_SWITCH` is unset: ``w4pm``, max P bounded from the forward's row maxima
(``cuda_lib.DELTA_ROW_MAX``), 1.088 ms a step against ``w4p``'s 1.173 at the reference shape (H200, session 30, CUPTI,
two rounds; ``w4pme8`` 1.120, ``w4pme4`` 1.162); after a forward that wrote no row maxima, ``w4p`` (the same δ). Before:
``w4p`` 1.217, ``w4t`` 1.383, Triton's pass 1.306 (session 21). At D = 64 (an H100, session 42, CUPTI at B 4, H 16,
N = 8K, two rounds) ``w4pm`` 0.951 ms against ``w4p``'s 1.036 and Triton's 1.064 (``w4pme8`` 0.944, within the
spread and not ``w4pm``'s bits; ``w4pme4`` 1.004, ``w4pe2`` 1.236)."""


def cuda_delta_variant(head_dim: int, stats: bool = False, default_config: bool = True) -> str | None:
    """The variant of the CUDA δ pass over 128-key tiles that runs (:data:`CUDA_DELTA_SWITCH`), or None; a bad value,
    or a variant asked for where it cannot run, is an error that names the switch. At D = 64 only
    ``cuda_lib.DELTA_WIDE_D64_VARIANTS`` are built."""
    from deltamatch.kernels import cuda_lib

    return cuda_variant(CUDA_DELTA_SWITCH, cuda_lib.DELTA_WIDE_BUILT, CUDA_DELTA_DEFAULT, "δ pass", head_dim,
                        env_switch(CUDA_SWITCH) is not None or stats or not default_config)


CUDA_QUANT_SWITCH = "DELTAMATCH_KERNEL_CUDA_QUANT"
"""``matched_factored``'s Q, K, V (forward) and dO (backward) quantised by the CUDA passes
(``kernels/cuda/quant_passes.cu``): K, V and dO by per-channel statistics, then both casts from a second read
(``cuda_lib.quantize_block_and_channel``), where Triton takes three or four launches each, and Q's block-scaled codes
by one pass (``cuda_lib.quantize_block``). ``1`` (an error where they cannot run), ``0`` Triton's launches. Unset:
:data:`CUDA_QUANT_DEFAULT` where the library loads and takes the tensor (``cuda_lib.quant_reason``; K and V only where
a backward will follow, since a forward alone writes one copy of each), and ``DELTAMATCH_KERNEL_CUDA`` and
``DELTAMATCH_KERNEL_ONE_READ`` are unset. The codes and scales are Triton's bits given the same K mean; the mean is the
CUDA fold's, not ``token_mean``'s."""
CUDA_QUANT_DEFAULT = True
"""Whether the CUDA quantisation runs where :data:`CUDA_QUANT_SWITCH` is unset: at every head dim they are built for
(``cuda_lib.QUANT_HEAD_DIMS``, D = 128 and 64). At D = 64 (session 44, H100, 8K): the step's quantisation 0.49 →
0.37 ms, the step 5.40 → 5.26 ms, the same bits (kernels/NOTES.md, Versions row "the quantisation passes at D = 64")."""


def _cuda_quant_pass_selected(x: torch.Tensor, name: str, default, what: str) -> bool:
    """Whether a CUDA quantisation pass takes ``x`` under the switch ``name``: ``1`` yes (a RuntimeError naming the
    switch and the reason where it cannot run), ``0`` no, unset ``default()`` where the library loads and takes ``x``
    (``cuda_lib.quant_reason``)."""
    from deltamatch.kernels import cuda_lib

    switch = env_switch(name)
    if switch is False or (switch is None and not default()):
        return False
    _, reason = cuda_lib.load()
    reason = reason or cuda_lib.quant_reason(x)
    if reason and switch:
        raise RuntimeError(f"{name}=1 but {what} cannot run: {reason}")
    return not reason


def cuda_quant_selected(x: torch.Tensor) -> bool:
    """Whether ``matched_factored`` quantises ``x`` (Q, K, V or dO) by the CUDA passes (:data:`CUDA_QUANT_SWITCH`)."""
    from deltamatch.kernels.triton_quant import ONE_READ_SWITCH

    def default():
        return CUDA_QUANT_DEFAULT and env_switch(CUDA_SWITCH) is None and not env_switch(ONE_READ_SWITCH)

    return _cuda_quant_pass_selected(x, CUDA_QUANT_SWITCH, default, "the CUDA quantisation")


CUDA_QPRIME_SWITCH = "DELTAMATCH_KERNEL_CUDA_QPRIME"
"""``matched_factored``'s Q'ᶜ (Q' = s ⊙ Q per channel, the dK product's operand, formed in the backward once the δ pass
has written s) by the CUDA passes (``cuda_lib.quantize_channel_scaled``: the max |x| pass, then the channel-major cast
alone) where Triton's ``quantize_per_channel`` takes two launches (0.037 + 0.077 ms on the H200 at the reference shape,
session 30). The same bits. ``1`` (an error where they cannot run), ``0`` Triton's. Unset: :data:`CUDA_QPRIME_DEFAULT`
where the library loads and takes Q (``cuda_lib.quant_reason``)."""
CUDA_QPRIME_DEFAULT = True
"""Whether Q'ᶜ is quantised by the CUDA passes where :data:`CUDA_QPRIME_SWITCH` is unset: yes (the same bits; the
step's quantisation 0.664 → 0.656 ms, H100, session 32: kernels/NOTES.md, Versions row "Q'ᶜ by the CUDA passes")."""


def cuda_qprime_selected(q: torch.Tensor) -> bool:
    """Whether ``matched_factored``'s backward quantises Q'ᶜ of ``q`` by the CUDA passes
    (:data:`CUDA_QPRIME_SWITCH`)."""
    return _cuda_quant_pass_selected(q, CUDA_QPRIME_SWITCH,
                                     lambda: CUDA_QPRIME_DEFAULT,
                                     "the CUDA quantisation of Q'ᶜ")


def k_fragment_order(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether ``matched_factored``'s forward writes K̂ᶜ in ``triton_quant.fragment_token_order`` (what the CUDA dQ and
    dQ-in-dK/dV kernels read): where its backward runs through the CUDA kernels with no diagnostics and the default
    config, where the CUDA dQ's D = 64 build is asked for (:data:`CUDA_DQ64_SWITCH`), or where the D = 64 dK/dV forms
    dQ (:func:`dq_in_dkdv64`). A backward that runs Triton's dQ after all (``ds_stats``, a caller's config) reorders
    K̂ᶜ back."""
    return (cuda_kernels_selected(head_dim, dtype) or cuda_dq64_variant(head_dim, dtype) is not None
            or dq_in_dkdv64(cuda_dkdv64_variant(head_dim, dtype), factored_acc_promote() is not None))


def _natural_order(x8t: torch.Tensor) -> torch.Tensor:
    """Channel-major codes in ``fragment_token_order`` put back in token order (for Triton's kernels)."""
    return x8t[..., torch.argsort(fragment_token_order(x8t.shape[-1], x8t.device))].contiguous()


def _launch_cuda_backward(saved, do8, sdo, delta, causal, qk_scale, softmax_scale, n, cfg, ops, dtypes):
    """dQ, dK and dV of ``matched_factored`` by the CUDA kernels, promoted as the configs' ``ACC_PROMOTE`` asks."""
    from deltamatch.kernels import cuda_lib

    s = saved
    promote = cfg["dkdv"].get("ACC_PROMOTE") is not None
    atomic = dq_atomic_requested()
    if (atomic or dq_ordered_requested()) and promote:  # dQ inside the dK/dV launch: the bulk-copy engine's reduction
        return cuda_lib.dqdkdv_factored(
            s["q8"], s["k8"], s["v8"], do8, ops["q8t"], ops["do8t"], ops["k8t"], s["sq"], s["sk"], s["sv"], sdo,
            ops["sqc"], ops["sdoc"], ops["skc"], ops["rs"], s["lse2"], delta, n, causal, qk_scale, softmax_scale,
            dtype=dtypes[1], variant=cuda_dkdv_variant(not atomic), irs=ops["irs"], ordered=not atomic)
    dk, dv = cuda_lib.dkdv_factored(
        s["q8"], s["k8"], s["v8"], do8, ops["q8t"], ops["do8t"], s["sq"], s["sk"], s["sv"], sdo, ops["sqc"],
        ops["sdoc"], ops["rs"], s["lse2"], delta, n, causal, qk_scale, softmax_scale, dtype=dtypes[1],
        promote=promote, irs=ops["irs"])
    dq = cuda_lib.dq_factored(
        s["q8"], s["k8"], s["v8"], do8, ops["k8t"], s["sq"], s["sk"], s["sv"], sdo, ops["skc"], ops["rs"], s["lse2"],
        delta, n, causal, qk_scale, softmax_scale, dtype=dtypes[0], promote=cfg["dq"].get("ACC_PROMOTE") is not None)
    return dq, dk, dv


def _launch_delta_matched(saved, do8, sdo, delta, causal, qk_scale, n, c, row_scales=None, inverses=None):
    """Matched's δ pass; with ``row_scales`` ((B, H, N_pad) FP32) it also writes the factored layout's dŜ row scales,
    and their ``1.0 / s`` into ``inverses`` (a new tensor when None). Returns the inverses, or None."""
    q8, k8, v8, sq, sk, sv, lse2 = (saved[k] for k in ("q8", "k8", "v8", "sq", "sk", "sv", "lse2"))
    b, h, n_pad, d = q8.shape
    if c.get("TMA") and q8.is_cuda:
        ensure_allocator()
    if row_scales is not None and inverses is None:
        inverses = torch.empty_like(row_scales)
    _attn_bwd_delta_matched_kernel[(triton.cdiv(n, c["BLOCK_M"]), b * h)](
        q8, k8, v8, do8, sq, sk, sv, sdo, lse2, delta, *((row_scales, inverses) if row_scales is not None else
                                                         (delta, delta)),  # stand-ins, never written
        qk_scale, n, n_pad, h, h // k8.shape[1],
        HEAD_DIM=d, CAUSAL=causal, ROW_SCALES=row_scales is not None, **c,
    )
    return inverses


@triton.jit
def _reciprocal_kernel(x_ptr, y_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < numel, other=1.0)
    tl.store(y_ptr + offs, 1.0 / x, mask=offs < numel)


def row_scale_inverses(rs: torch.Tensor) -> torch.Tensor:
    """``1.0 / s`` of dŜ's row scales (contiguous FP32) with the bits of the δ pass's (on the GPU Triton's division,
    div.full.f32, the CUDA kernels' ``div_full``): what ``cuda_lib.dkdv_factored`` reads when no δ pass wrote it."""
    if rs.dtype != torch.float32 or not rs.is_contiguous():
        raise ValueError(f"rs: {rs.dtype}, contiguous={rs.is_contiguous()}; expected contiguous torch.float32")
    out = torch.empty_like(rs)
    if rs.numel():
        _reciprocal_kernel[(triton.cdiv(rs.numel(), 1024),)](rs, out, rs.numel(), BLOCK=1024)
    return out


def _launch_dkdv(saved, do8, do8t, sdo, delta, dk, dv, stats, causal, qk_scale, softmax_scale, n, c, dq_acc=None,
                 factored=None):
    """One launch for dK and dV, or (``SEPARATE``) one for each: recomputing S once more, holding one accumulator.
    With ``dq_acc`` (FP32, zeroed) the dK launch also adds dQ into it (``DQ_ATOMIC``). ``FACTORED`` in ``c``: the
    factored scale layout, as two launches unless ``SEPARATE=False`` is given (``DV_ONLY``: dV alone), with
    ``factored`` holding its operands — ``do8t`` / ``sdoc`` (dÔ per channel), ``q8t`` / ``sqc`` (Q' = s ⊙ Q per
    channel), ``rs`` (dŜ's row scales)."""
    q8, q8t, k8, v8, sq, sk, sv, lse2 = (saved[k] for k in ("q8", "q8t", "k8", "v8", "sq", "sk", "sv", "lse2"))
    b, h, n_pad, d = q8.shape
    h_kv = k8.shape[1]
    c = dict(c)
    c.pop("DQ_ATOMIC", None)  # decided by dq_acc, for the dK launch only
    separate = c.pop("SEPARATE", None)
    if c.get("FACTORED"):
        if factored is None:
            raise ValueError("FACTORED launches need the factored layout's operands")
        q8t, do8t = factored["q8t"], factored["do8t"]
        separate = separate is None or separate  # the factored layout's default: two launches
    parts = [dict(DO_DK=True, DO_DV=False), dict(DO_DK=False, DO_DV=True)] if separate else [{}]
    if c.pop("DV_ONLY", False):  # dV alone (the sweep times it so)
        parts = [dict(DO_DK=False, DO_DV=True)]
    if c.pop("DK_ONLY", False):  # dK alone (the CUDA dK's tests and timing compare with it)
        parts = [dict(DO_DK=True, DO_DV=False)]
    if c.get("TMA") and q8.is_cuda:
        ensure_allocator()
    extra = (factored["sdoc"], factored["sqc"], factored["rs"]) if c.get("FACTORED") else (delta, delta, delta)
    for part in parts:
        atomic = dq_acc is not None and part.get("DO_DK", True)
        _attn_bwd_dkdv_kernel[(triton.cdiv(n, c["BLOCK_N"]), b * h_kv)](
            q8, q8t, k8, v8, do8, do8t, sq, sk, sv, sdo, lse2, delta, dk, dv, stats if stats is not None else delta,
            saved["k8t"] if saved["k8t"] is not None else k8, dq_acc if atomic else delta, *extra,  # k8t: DQ_ATOMIC
            dk.stride(0), dk.stride(1), dk.stride(2), qk_scale, softmax_scale, n, n_pad, h, h // h_kv,
            HEAD_DIM=d, CAUSAL=causal, ROUND_FP32=round_fp32_in_kernels(), DS_STATS=stats is not None,
            DQ_ATOMIC=atomic, **part, **c,
        )


def _launch_dq(saved, do8, sdo, delta, dq, stats, causal, qk_scale, softmax_scale, n, c, factored=None):
    """The dQ kernel; ``FACTORED`` in ``c`` reads K̂ᶜ (``factored["k8t"]``, scales ``skc``) and dŜ's row scales."""
    q8, k8, k8t, v8, sq, sk, sv, lse2 = (saved[k] for k in ("q8", "k8", "k8t", "v8", "sq", "sk", "sv", "lse2"))
    b, h, n_pad, d = q8.shape
    extra = (delta, delta)
    if c.get("FACTORED"):
        if factored is None:
            raise ValueError("FACTORED launches need the factored layout's operands")
        k8t, extra = factored["k8t"], (factored["skc"], factored["rs"])
    if c.get("TMA") and q8.is_cuda:
        ensure_allocator()
    _attn_bwd_dq_kernel[(triton.cdiv(n, c["BLOCK_M"]), b * h)](
        q8, k8, k8t, v8, do8, sq, sk, sv, sdo, lse2, delta, dq, stats if stats is not None else delta, *extra,
        dq.stride(0), dq.stride(1), dq.stride(2), qk_scale, softmax_scale, n, n_pad, h, h // k8.shape[1],
        HEAD_DIM=d, CAUSAL=causal, ROUND_FP32=round_fp32_in_kernels(), DS_STATS=stats is not None, **c,
    )


FACTORED_DKDV_SMALL_D = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
"""The factored layout's dK and dV launches at D ≤ 64, where ``backward_config`` holds the paper layout's fused kernel
(two accumulators, 128-key blocks, 8 warps, 1 stage): each factored launch holds one accumulator, and at 64 keys on 4
warps with 3 stages the pair took 4.155 ms against 5.248 at N = 8192, causal, B·H = 64 (session 40's sweep on an H100,
``tools/device/kernel_sweep.py --head-dims 64 --factored-only``; kernels/NOTES.md)."""


FACTORED_SEPARATE_SWITCH = "DELTAMATCH_KERNEL_FACTORED_SEPARATE"
"""``0``: the factored layout's dK and dV in one launch (S, P and dŜ formed once, two accumulators); ``1``: two
launches, each recomputing S and holding one accumulator; unset: one launch at the head dims in
:data:`FACTORED_FUSED_HEAD_DIMS`, two elsewhere. The same bits either way."""
FACTORED_FUSED_HEAD_DIMS = (64,)
"""Where the factored dK and dV run as one launch by default. At D = 64 (session 41, an H100, N = 8192 causal, B·H =
64): 3.96 ms against the two launches' 4.20 in the same shape, and matched_factored's fwd+bwd 222.1 / 220.5 → 228.5 /
228.0 TFLOP/s (16K: 232.3 / 244.1 → 251.2 / 251.2). At D = 128 and 256 the two accumulators do not fit (the single
dK launch already holds 255 registers at D = 64)."""


def factored_config(config: dict, head_dim: int) -> dict:
    """``backward_config(head_dim)`` for the factored scale layout: dK and dV as two launches (each holds one
    accumulator in units of its operand's channel scales; at D ≤ 64 in :data:`FACTORED_DKDV_SMALL_D`'s shape) or as
    one (:data:`FACTORED_SEPARATE_SWITCH`), the
    deterministic dQ kernel, every kernel ``FACTORED``, its dK, dV and dQ through TMA where ``tma_enabled(head_dim)``
    (the factored dQ gains from it at D = 256, where the paper layout's loses)."""
    dkdv = {k: v for k, v in config["dkdv"].items() if k not in ("SEPARATE", "DQ_ATOMIC")}
    if head_dim <= 64:
        dkdv.update(FACTORED_DKDV_SMALL_D)
    separate = env_switch(FACTORED_SEPARATE_SWITCH)
    dkdv["SEPARATE"] = head_dim not in FACTORED_FUSED_HEAD_DIMS if separate is None else separate
    factored = dict(FACTORED=True, ACC_PROMOTE=factored_acc_promote(), TMA=tma_enabled(head_dim))
    return dict(dkdv={**dkdv, **factored}, dq={**config["dq"], **factored}, delta=dict(config["delta"]))


def attention_backward(saved: dict, do8, do8t, sdo, delta, mode: str, causal: bool, softmax_scale: float,
                       n: int, shapes: tuple, dtypes: tuple, ds_stats: dict | None = None,
                       config: dict | None = None, factored: dict | None = None):
    """Run (matched δ,) dK/dV and dQ; returns dq (B, N, H, D), dk, dv (B, N, H_kv, D). ``delta``: the FP32
    (B, H, N_pad) δ the quantisation formed (stale, consistent) or that matched's δ pass writes; for
    ``matched_factored`` None (its δ pass returns one; a buffer passed is written only by Triton's pass).

    ``ds_stats`` (diagnostics, tests): ``{"dq": t, "dkdv": t}`` with zeroed (B, H, 2, N_pad) FP32 tensors that receive
    Σ_j dS_ij and Σ_j |dS_ij| per query row, as each dS kernel formed dS before its cast. ``config`` overrides
    ``backward_config`` (the tuning sweep).

    ``mode="matched_factored"``: Delta-Matching in the factored scale layout (kernels/README.md). ``factored`` then
    holds ``q`` (the public-layout queries, for Q' = s ⊙ Q), the forward's K̂ᶜ (``k8t`` channel-major codes, ``skc``
    channel scales), and dÔ per channel: either ``do`` (dO, quantised here) or ``do8t``, ``sdoc`` and
    ``do_fragment`` (its codes, scales and whether they come in ``fragment_token_order``); the δ pass forms δ and
    dŜ's row scales s.
    """
    device = saved["q8"].device
    cfg = config or backward_config(saved["q8"].shape[-1])
    qk_scale = softmax_scale * math.log2(math.e)
    stats = ds_stats or {}

    if mode == "matched_factored":
        if factored is None:
            raise ValueError("mode 'matched_factored' needs the factored layout's operands (q, do, k8t, skc)")
        cfg = factored_config(cfg, saved["q8"].shape[-1]) if not cfg["dq"].get("FACTORED") else cfg
        wide = cuda_delta_variant(saved["q8"].shape[-1], bool(stats), config is None)
        if wide:
            from deltamatch.kernels import cuda_lib

            row_max = saved.get("m2") if wide in cuda_lib.DELTA_ROW_MAX else None
            if wide in cuda_lib.DELTA_ROW_MAX and row_max is None:
                if os.environ.get(CUDA_DELTA_SWITCH):
                    raise ValueError(f"{CUDA_DELTA_SWITCH}={wide} reads the forward's row maxima, which only the CUDA "
                                     f"forward over 128-key tiles writes ({CUDA_FWD_SWITCH}); this forward wrote none")
                wide = cuda_lib.DELTA_ROW_MAX[wide]  # the default after a forward without them: the same δ, max P taken
            delta, rs, irs = cuda_lib.delta_wide(saved["q8"], saved["k8"], saved["v8"], do8, saved["sq"], saved["sk"],
                                                 saved["sv"], sdo, saved["lse2"], n, causal, qk_scale, variant=wide,
                                                 row_max=row_max)
        elif cuda_kernels_selected(saved["q8"].shape[-1], dtypes[1], bool(stats), config is None, what="δ pass"):
            from deltamatch.kernels import cuda_lib

            delta, rs, irs = cuda_lib.delta_factored(saved["q8"], saved["k8"], saved["v8"], do8, saved["sq"],
                                                     saved["sk"], saved["sv"], sdo, saved["lse2"], n, causal,
                                                     qk_scale)
        else:
            if delta is None:
                delta = torch.empty(saved["q8"].shape[:3], device=device, dtype=torch.float32)
            rs = torch.empty_like(delta)
            irs = _launch_delta_matched(saved, do8, sdo, delta, causal, qk_scale, n, cfg["delta"], row_scales=rs)
        cuda = cuda_kernels_selected(saved["q8"].shape[-1], dtypes[1], bool(stats), config is None)
        dkdv64 = cuda_dkdv64_variant(saved["q8"].shape[-1], dtypes[1], bool(stats), config is None)
        from deltamatch.kernels import cuda_lib  # (importing it loads no library)

        # the CUDA dK/dV kernel reads Q̂'ᶜ and dÔᶜ in its A fragments' token order (triton_quant.fragment_token_order)
        fragments = cuda or bool(dkdv64)
        if cuda_qprime_selected(factored["q"]):
            q8t_c, sqc = cuda_lib.quantize_channel_scaled(factored["q"], rs, fragment_order=fragments)
        else:
            _, q8t_c, sqc = quantize_per_channel(factored["q"], "q", row_scales=rs, layouts="channel",
                                                 fragment_order=fragments)
        if "do8t" in factored:  # dÔᶜ made beside dÔ (triton_attention.fp8_backward), in the order it says
            do8t_c, sdoc = factored["do8t"], factored["sdoc"]
            if factored["do_fragment"] and not fragments:
                do8t_c = _natural_order(do8t_c)
            elif fragments and not factored["do_fragment"]:
                do8t_c = do8t_c[..., fragment_token_order(do8t_c.shape[-1], do8t_c.device)].contiguous()
        else:
            _, do8t_c, sdoc = quantize_per_channel(factored["do"], "do", layouts="channel",
                                                   fragment_order=fragments)
        dq64 = cuda_dq64_variant(saved["q8"].shape[-1], dtypes[1], bool(stats))
        promote = cfg["dkdv"].get("ACC_PROMOTE") is not None
        dq_inside = dq_in_dkdv64(dkdv64, promote) and not dq64  # the dQ kernel asked for runs beside dK/dV
        if dkdv64 and not dq_inside and dkdv64 not in cuda_lib.DKDV_D64_VARIANTS:
            dkdv64 = cuda_lib.DKDV_D64_VARIANTS[0]  # a form with dQ where dQ is not to be formed in the launch
        k8t = factored["k8t"]
        if not (cuda or dq64 or dq_inside) and k_fragment_order(saved["q8"].shape[-1], dtypes[1]):  # CUDA's order
            k8t = _natural_order(k8t)
        ops = dict(q8t=q8t_c, sqc=sqc, do8t=do8t_c, sdoc=sdoc, rs=rs, irs=irs, k8t=k8t, skc=factored["skc"])
        if cuda:
            return _launch_cuda_backward(saved, do8, sdo, delta, causal, qk_scale, softmax_scale, n, cfg, ops, dtypes)
        if dq_inside:  # dQ, dK and dV of one launch at D = 64
            return cuda_lib.dqdkdv_factored(
                saved["q8"], saved["k8"], saved["v8"], do8, q8t_c, do8t_c, k8t, saved["sq"], saved["sk"], saved["sv"],
                sdo, sqc, sdoc, factored["skc"], rs, saved["lse2"], delta, n, causal, qk_scale, softmax_scale,
                dtype=dtypes[1], variant=dkdv64, irs=irs, ordered=not dq_atomic_requested())
        if dkdv64:  # Triton's bits, from the CUDA kernel's D = 64 build
            dk, dv = cuda_lib.dkdv_factored(saved["q8"], saved["k8"], saved["v8"], do8, q8t_c, do8t_c, saved["sq"],
                                            saved["sk"], saved["sv"], sdo, sqc, sdoc, rs, saved["lse2"], delta, n,
                                            causal, qk_scale, softmax_scale, dtype=dtypes[1],
                                            promote=cfg["dkdv"].get("ACC_PROMOTE") is not None, variant=dkdv64,
                                            irs=irs)
        else:
            dk, dv = (torch.empty(shapes[1], device=device, dtype=dtypes[1]) for _ in range(2))
            _launch_dkdv(saved, do8, do8t, sdo, delta, dk, dv, stats.get("dkdv"), causal, qk_scale, softmax_scale, n,
                         cfg["dkdv"], factored=ops)
        if dq64:  # Triton's bits, from the CUDA dQ kernel's D = 64 build (K̂ᶜ in fragment order)
            dq = cuda_lib.dq_factored(saved["q8"], saved["k8"], saved["v8"], do8, k8t, saved["sq"], saved["sk"],
                                      saved["sv"], sdo, factored["skc"], rs, saved["lse2"], delta, n, causal, qk_scale,
                                      softmax_scale, dtype=dtypes[0], promote=cfg["dq"].get("ACC_PROMOTE") is not None,
                                      variant=dq64)
        else:
            dq = torch.empty(shapes[0], device=device, dtype=dtypes[0])
            _launch_dq(saved, do8, sdo, delta, dq, stats.get("dq"), causal, qk_scale, softmax_scale, n, cfg["dq"],
                       factored=ops)
        return dq, dk, dv
    dq = torch.empty(shapes[0], device=device, dtype=dtypes[0])
    dk, dv = (torch.empty(shapes[1], device=device, dtype=dtypes[1]) for _ in range(2))
    if mode == "matched":
        _launch_delta_matched(saved, do8, sdo, delta, causal, qk_scale, n, cfg["delta"])
    # atomic dQ (backward_config: 64 x 64 dŜ tiles in the dK launch); the diagnostics' dS row sums need the dQ kernel
    atomic = cfg["dkdv"].get("DQ_ATOMIC", False) and not stats
    dq_acc = torch.zeros(saved["q8"].shape, device=device, dtype=torch.float32) if atomic else None
    _launch_dkdv(saved, do8, do8t, sdo, delta, dk, dv, stats.get("dkdv"), causal, qk_scale, softmax_scale, n,
                 cfg["dkdv"], dq_acc)
    if atomic:
        dq.copy_((dq_acc[:, :, :n] * softmax_scale).transpose(1, 2))
    else:
        _launch_dq(saved, do8, sdo, delta, dq, stats.get("dq"), causal, qk_scale, softmax_scale, n, cfg["dq"])
    return dq, dk, dv
