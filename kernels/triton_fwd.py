"""The forward pass of the Triton FP8 attention: S = Q̂K̂ᵀ and O = P̂V̂ as FP8 wgmma, online softmax, O in BF16 + lse.

One program per (query block, batch·head). For each 64-key tile: S (log2 domain) = dot(Q̂, K̂ᵀ) · s_Q · s_K ·
scale·log2(e); the online softmax keeps the running max m and sum l; P = exp2(S − m) is quantised per row for this
64-key group (its row max is exp2(m_tile − m), no extra reduction) and ``acc = acc·α + dot(P̂, V̂) · s_P · s_V``. The
per-row P scale is a scale of A's rows, so every scale is constant along each dot's contraction (kernels/README.md).

The P̂ of this pass is quantised before normalisation (by 1/l at the end); since a block scale follows its block's
amax, this equals quantising the normalised P up to FP32 rounding of the scale.

Outputs: O (B, N, H, D) in the input dtype (BF16), and ``lse2`` (B, H, N_pad), the row log-sum-exp in the log2
domain of S·log2(e) (the backward recomputes P = exp2(S·log2(e) − lse2)).
"""

import math

import torch
import triton
import triton.language as tl

from deltamatch.kernels.triton_quant import BLOCK_KV, BLOCK_Q, round_fp32_in_kernels, to_e4m3


@triton.jit
def _attn_fwd_tiles(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, offs_m, qk_scale, N, N_PAD,
                    lo, hi, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                    CAUSAL: tl.constexpr, ROUND_FP32: tl.constexpr):
    """Online softmax over the key tiles [lo, hi); only MASKED tiles (the diagonal, the ragged end) pay for a mask."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + cols.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :])  # [BLOCK_N, D]
        s_k = tl.load(sk_ptr + skv_base + start_n // BLOCK_N)
        # matmul 1: S = Q̂ K̂ᵀ, promoted to FP32 with both block scales
        s = tl.dot(q, tl.trans(k)) * (s_q * s_k * qk_scale)  # [BLOCK_M, BLOCK_N]
        if MASKED:
            visible = cols[None, :] < N
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
        m_tile = tl.max(s, 1)
        m_new = tl.maximum(m_i, m_tile)  # finite: key 0 is visible to every row in the first tile
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        # P̂: one scale per row for this 64-key group; its amax is exp2(m_tile − m_new) (0 for a fully masked row)
        p_max = tl.math.exp2(m_tile - m_new)
        s_p = tl.where(p_max > 0, p_max * (1.0 / 448.0), 1.0)
        p8 = to_e4m3(p * (1.0 / s_p)[:, None], ROUND_FP32)
        vt = tl.load(vt_base + offs_d[:, None] * N_PAD + cols[None, :])  # [D, BLOCK_N], keys contiguous
        s_v = tl.load(sv_ptr + skv_base + start_n // BLOCK_N)
        # matmul 2: O += P̂ V̂
        acc = acc * alpha[:, None] + tl.dot(p8, tl.trans(vt)) * (s_p * s_v)[:, None]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_pairs(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, qk_scale, N_PAD, lo, hi,
                    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_FP32: tl.constexpr):
    """Unmasked key tiles two at a time: one running-max update and one rescale of acc per 128 keys, while each
    64-key group keeps its own P̂ and V̂ scales (two dots, each promoted with its own scales)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, 2 * BLOCK_N):
        cols_a = start_n + offs_n
        cols_b = cols_a + BLOCK_N
        k_a = tl.load(k_base + cols_a.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :])  # [BLOCK_N, D]
        k_b = tl.load(k_base + cols_b.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :])
        s_a = tl.dot(q, tl.trans(k_a)) * (s_q * tl.load(sk_ptr + skv_base + start_n // BLOCK_N) * qk_scale)
        s_b = tl.dot(q, tl.trans(k_b)) * (s_q * tl.load(sk_ptr + skv_base + start_n // BLOCK_N + 1) * qk_scale)
        m_a = tl.max(s_a, 1)
        m_b = tl.max(s_b, 1)
        m_new = tl.maximum(m_i, tl.maximum(m_a, m_b))
        alpha = tl.math.exp2(m_i - m_new)
        p_a = tl.math.exp2(s_a - m_new[:, None])
        p_b = tl.math.exp2(s_b - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p_a, 1) + tl.sum(p_b, 1)
        sp_a = tl.math.exp2(m_a - m_new) * (1.0 / 448.0)  # > 0: unmasked rows see every key of the tile
        sp_b = tl.math.exp2(m_b - m_new) * (1.0 / 448.0)
        p8_a = to_e4m3(p_a * (1.0 / sp_a)[:, None], ROUND_FP32)
        p8_b = to_e4m3(p_b * (1.0 / sp_b)[:, None], ROUND_FP32)
        vt_a = tl.load(vt_base + offs_d[:, None] * N_PAD + cols_a[None, :])  # [D, BLOCK_N]
        vt_b = tl.load(vt_base + offs_d[:, None] * N_PAD + cols_b[None, :])
        sv_a = tl.load(sv_ptr + skv_base + start_n // BLOCK_N)
        sv_b = tl.load(sv_ptr + skv_base + start_n // BLOCK_N + 1)
        acc = (acc * alpha[:, None] + tl.dot(p8_a, tl.trans(vt_a)) * (sp_a * sv_a)[:, None]
               + tl.dot(p8_b, tl.trans(vt_b)) * (sp_b * sv_b)[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    q8_ptr, k8_ptr, v8t_ptr,  # codes: Q̂ (B, H, N_pad, D), K̂ (B, H_kv, N_pad, D), V̂ᵀ (B, H_kv, D, N_pad)
    sq_ptr, sk_ptr, sv_ptr,  # scales: (B, H, N_pad/128), (B, H_kv, N_pad/64), (B, H_kv, N_pad/64)
    o_ptr, lse_ptr,  # O (B, N, H, D); lse2 (B, H, N_pad) fp32
    stride_ob, stride_on, stride_oh,
    qk_scale,  # softmax scale · log2(e)
    N, N_PAD, H, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, ROUND_FP32: tl.constexpr, PAIRED: tl.constexpr = False,
):
    tl.static_assert(BLOCK_N == 64, "P̂ and K̂/V̂ scales are per 64-key group")
    tl.static_assert(128 % BLOCK_M == 0, "a query block must lie inside one Q̂ scale block")
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "the causal diagonal starts on a key-tile boundary")
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    bh_kv = b * (H // GROUP) + h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)

    q_base = q8_ptr + bh.to(tl.int64) * N_PAD * HEAD_DIM
    q = tl.load(q_base + offs_m.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :])  # [BLOCK_M, D] e4m3
    s_q = tl.load(sq_ptr + bh.to(tl.int64) * (N_PAD // 128) + (pid_m * BLOCK_M) // 128)
    k_base = k8_ptr + bh_kv.to(tl.int64) * N_PAD * HEAD_DIM
    vt_base = v8t_ptr + bh_kv.to(tl.int64) * HEAD_DIM * N_PAD
    skv_base = bh_kv.to(tl.int64) * (N_PAD // BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # whole key tiles left of the diagonal (causal) and of the ragged end need no mask
    full_end = (N // BLOCK_N) * BLOCK_N
    hi = N
    if CAUSAL:
        full_end = tl.minimum(full_end, pid_m * BLOCK_M)
        hi = (pid_m + 1) * BLOCK_M  # <= N_pad; keys >= N are masked
    if PAIRED:
        pair_end = (full_end // (2 * BLOCK_N)) * (2 * BLOCK_N)
        acc, l_i, m_i = _attn_fwd_pairs(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, qk_scale,
                                        N_PAD, 0, pair_end, HEAD_DIM, BLOCK_N, ROUND_FP32)
        acc, l_i, m_i = _attn_fwd_tiles(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, offs_m,
                                        qk_scale, N, N_PAD, pair_end, full_end, HEAD_DIM, BLOCK_N, False, CAUSAL,
                                        ROUND_FP32)
    else:
        acc, l_i, m_i = _attn_fwd_tiles(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, offs_m,
                                        qk_scale, N, N_PAD, 0, full_end, HEAD_DIM, BLOCK_N, False, CAUSAL,
                                        ROUND_FP32)
    acc, l_i, m_i = _attn_fwd_tiles(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, offs_m,
                                    qk_scale, N, N_PAD, full_end, hi, HEAD_DIM, BLOCK_N, True, CAUSAL, ROUND_FP32)

    o = acc / l_i[:, None]
    o_ptrs = o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    o_ptrs = o_ptrs + offs_m.to(tl.int64)[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=(offs_m < N)[:, None])
    tl.store(lse_ptr + bh.to(tl.int64) * N_PAD + offs_m, m_i + tl.math.log2(l_i))


def forward_config(head_dim: int) -> dict:
    """Block sizes and warps per head dim (the accumulator is BLOCK_M × D FP32 in registers).

    Chosen by tools/device/kernel_sweep.py on the H200 (causal, N = 8192, B·H = 64; kernels/NOTES.md has the table):
    BLOCK_M = 64 on one warpgroup beat 128 on two by 1.1–1.3×; paired key tiles paid off at D = 64 only.
    """
    if head_dim <= 64:
        return dict(BLOCK_M=64, BLOCK_N=BLOCK_KV, num_warps=4, num_stages=4, PAIRED=True)
    if head_dim <= 128:
        return dict(BLOCK_M=64, BLOCK_N=BLOCK_KV, num_warps=4, num_stages=4)
    return dict(BLOCK_M=64, BLOCK_N=BLOCK_KV, num_warps=4, num_stages=2)


def attention_forward(q8, k8, v8t, sq, sk, sv, out_shape, out_dtype, causal: bool, softmax_scale: float,
                      config: dict | None = None):
    """Launch the forward; returns O (B, N, H, D) and lse2 (B, H, N_pad). ``config`` overrides ``forward_config``."""
    b, h, n_pad, d = q8.shape
    n = out_shape[1]
    group = h // k8.shape[1]
    o = torch.empty(out_shape, device=q8.device, dtype=out_dtype)
    lse2 = torch.empty((b, h, n_pad), device=q8.device, dtype=torch.float32)
    cfg = config or forward_config(d)
    assert BLOCK_Q % cfg["BLOCK_M"] == 0
    grid = (triton.cdiv(n, cfg["BLOCK_M"]), b * h)
    _attn_fwd_kernel[grid](
        q8, k8, v8t, sq, sk, sv, o, lse2, o.stride(0), o.stride(1), o.stride(2),
        softmax_scale * math.log2(math.e), n, n_pad, h, group,
        HEAD_DIM=d, CAUSAL=causal, ROUND_FP32=round_fp32_in_kernels(), **cfg,
    )
    return o, lse2
