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
import os

import torch
import triton
import triton.language as tl

from deltamatch.kernels.triton_quant import BLOCK_KV, BLOCK_Q, env_switch, round_fp32_in_kernels, to_e4m3  # noqa: F401
from deltamatch.kernels.triton_quant import ONE_READ_SWITCH


@triton.jit
def _load_k(k_base, start_n, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """K̂ tile [BLOCK_N, D] at key ``start_n``: through a TMA descriptor (``k_base`` is one, rows = keys of this
    (batch, kv head) in a 3-D view) or through pointers."""
    if TMA:
        return k_base.load([0, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    else:
        cols = start_n + tl.arange(0, BLOCK_N)
        return tl.load(k_base + cols.to(tl.int64)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :])


@triton.jit
def _load_vt(vt_base, start_n, N_PAD, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """V̂ᵀ tile [D, BLOCK_N] (keys contiguous) at key ``start_n``, through a TMA descriptor or pointers."""
    if TMA:
        return vt_base.load([0, 0, start_n]).reshape(HEAD_DIM, BLOCK_N)
    else:
        cols = start_n + tl.arange(0, BLOCK_N)
        return tl.load(vt_base + tl.arange(0, HEAD_DIM)[:, None] * N_PAD + cols[None, :])


@triton.jit
def _attn_fwd_tiles(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, offs_m, qk_scale, N, N_PAD,
                    lo, hi, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                    CAUSAL: tl.constexpr, ROUND_FP32: tl.constexpr, TMA: tl.constexpr = False,
                    FACTORED: tl.constexpr = False, ACC_PROMOTE: tl.constexpr = None,
                    SCALE_KEYS: tl.constexpr = BLOCK_KV):
    """Online softmax over the key tiles [lo, hi); only MASKED tiles (the diagonal, the ragged end) pay for a mask.
    ``SCALE_KEYS`` keys share a K̂ scale (64); a tile is one such group, or two in the factored layout's wide tiles.

    FACTORED (the factored scale layout, kernels/README.md): P relative to the running max (<= 1) is cast at the
    fixed scale 1/448 and V̂ has one scale per channel, so no scale varies along PV's contraction and the wgmma
    accumulates into ``acc`` itself; the kernel applies V̂'s channel scales once, after the loop. ``ACC_PROMOTE``: the
    dot's ``max_num_imprecise_acc`` — Hopper's FP8 wgmma adds products into its accumulator at reduced precision, and
    Triton's default there (2^30) never promotes, so ``acc`` would sum every key in it; 64 adds each tile's products
    into ``acc`` in FP32, as the paper layout's per-tile promotion does (``FACTORED_ACC_PROMOTE``)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_k(k_base, start_n, HEAD_DIM, BLOCK_N, TMA)  # [BLOCK_N, D]
        # matmul 1: S = Q̂ K̂ᵀ, promoted to FP32 with both block scales
        raw = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
        if BLOCK_N == SCALE_KEYS:
            c = s_q * tl.load(sk_ptr + skv_base + start_n // SCALE_KEYS) * qk_scale
        else:  # a wide tile (factored only): one K̂ scale per 64-key group, a scale per column
            c = (s_q * tl.load(sk_ptr + skv_base + cols // SCALE_KEYS) * qk_scale)[None, :]
        s = raw * c
        if MASKED:
            visible = cols[None, :] < N
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_tile = tl.max(s, 1)
        elif BLOCK_N == SCALE_KEYS:
            # the max of the scaled S is the scaled max of S, bit for bit: x -> fl(c·x) is non-decreasing for c > 0
            # (the scales and softmax_scale are positive), so one multiply per row where BLOCK_N were
            m_tile = tl.max(raw, 1) * c
        else:
            m_tile = tl.max(s, 1)
        m_new = tl.maximum(m_i, m_tile)  # finite: key 0 is visible to every row in the first tile
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = _load_vt(vt_base, start_n, N_PAD, HEAD_DIM, BLOCK_N, TMA)  # [D, BLOCK_N], keys contiguous
        if FACTORED:  # matmul 2: O += P̂ V̂, accumulated in place (every scale factors out of the dot)
            p8 = to_e4m3(p * 448.0, ROUND_FP32)
            acc = tl.dot(p8, tl.trans(vt), acc * alpha[:, None], max_num_imprecise_acc=ACC_PROMOTE)
        else:
            # P̂: one scale per row for this 64-key group; its amax is exp2(m_tile − m_new) (0 for a fully masked row)
            p_max = tl.math.exp2(m_tile - m_new)
            s_p = tl.where(p_max > 0, p_max * (1.0 / 448.0), 1.0)
            p8 = to_e4m3(p * (1.0 / s_p)[:, None], ROUND_FP32)
            s_v = tl.load(sv_ptr + skv_base + start_n // BLOCK_N)
            # matmul 2: O += P̂ V̂, each tile's product promoted with its scales
            acc = acc * alpha[:, None] + tl.dot(p8, tl.trans(vt)) * (s_p * s_v)[:, None]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_pairs(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, qk_scale, N_PAD, lo, hi,
                    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_FP32: tl.constexpr,
                    TMA: tl.constexpr = False, FACTORED: tl.constexpr = False, ACC_PROMOTE: tl.constexpr = None):
    """Unmasked key tiles two at a time: one running-max update and one rescale of acc per 128 keys, while each
    64-key group keeps its own P̂ and V̂ scales (two dots, each promoted with its own scales).

    FACTORED: P̂ of both tiles at the fixed scale 1/448 against V̂ per channel, so the two dots chain in the tensor
    core's accumulator; with ``ACC_PROMOTE`` set the pair's 128-deep product is added into ``acc`` in FP32 once (the
    promotion interval DeepSeek-V3 uses, §3.3.2, where the single-tile loop promotes every 64 keys), without it the
    dots accumulate into ``acc`` itself."""
    for start_n in range(lo, hi, 2 * BLOCK_N):
        k_a = _load_k(k_base, start_n, HEAD_DIM, BLOCK_N, TMA)  # [BLOCK_N, D]
        k_b = _load_k(k_base, start_n + BLOCK_N, HEAD_DIM, BLOCK_N, TMA)
        s_a = tl.dot(q, tl.trans(k_a)) * (s_q * tl.load(sk_ptr + skv_base + start_n // BLOCK_N) * qk_scale)
        s_b = tl.dot(q, tl.trans(k_b)) * (s_q * tl.load(sk_ptr + skv_base + start_n // BLOCK_N + 1) * qk_scale)
        m_a = tl.max(s_a, 1)
        m_b = tl.max(s_b, 1)
        m_new = tl.maximum(m_i, tl.maximum(m_a, m_b))
        alpha = tl.math.exp2(m_i - m_new)
        p_a = tl.math.exp2(s_a - m_new[:, None])
        p_b = tl.math.exp2(s_b - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p_a, 1) + tl.sum(p_b, 1)
        vt_a = _load_vt(vt_base, start_n, N_PAD, HEAD_DIM, BLOCK_N, TMA)  # [D, BLOCK_N]
        vt_b = _load_vt(vt_base, start_n + BLOCK_N, N_PAD, HEAD_DIM, BLOCK_N, TMA)
        if FACTORED:
            p8_a = to_e4m3(p_a * 448.0, ROUND_FP32)
            p8_b = to_e4m3(p_b * 448.0, ROUND_FP32)
            if ACC_PROMOTE is None:
                acc = tl.dot(p8_b, tl.trans(vt_b), tl.dot(p8_a, tl.trans(vt_a), acc * alpha[:, None]))
            else:
                acc = acc * alpha[:, None] + tl.dot(p8_b, tl.trans(vt_b), tl.dot(p8_a, tl.trans(vt_a)))
        else:
            sp_a = tl.math.exp2(m_a - m_new) * (1.0 / 448.0)  # > 0: unmasked rows see every key of the tile
            sp_b = tl.math.exp2(m_b - m_new) * (1.0 / 448.0)
            p8_a = to_e4m3(p_a * (1.0 / sp_a)[:, None], ROUND_FP32)
            p8_b = to_e4m3(p_b * (1.0 / sp_b)[:, None], ROUND_FP32)
            sv_a = tl.load(sv_ptr + skv_base + start_n // BLOCK_N)
            sv_b = tl.load(sv_ptr + skv_base + start_n // BLOCK_N + 1)
            acc = (acc * alpha[:, None] + tl.dot(p8_a, tl.trans(vt_a)) * (sp_a * sv_a)[:, None]
                   + tl.dot(p8_b, tl.trans(vt_b)) * (sp_b * sv_b)[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    q8_ptr, k8_ptr, v8t_ptr,  # codes: Q̂ (B, H, N_pad, D), K̂ (B, H_kv, N_pad, D), V̂ᵀ (B, H_kv, D, N_pad)
    sq_ptr, sk_ptr, sv_ptr,  # scales: (B, H, N_pad/128), (B, H_kv, N_pad/64), (B, H_kv, N_pad/64) or FACTORED (B, H_kv, D)
    o_ptr, lse_ptr,  # O (B, N, H, D); lse2 (B, H, N_pad) fp32
    stride_ob, stride_on, stride_oh,
    qk_scale,  # softmax scale · log2(e)
    N, N_PAD, H, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, ROUND_FP32: tl.constexpr, PAIRED: tl.constexpr = False, TMA: tl.constexpr = False,
    FACTORED: tl.constexpr = False, ACC_PROMOTE: tl.constexpr = None, SCALE_KEYS: tl.constexpr = BLOCK_KV,
):
    tl.static_assert(BLOCK_N == SCALE_KEYS or (FACTORED and not PAIRED and BLOCK_N == 2 * SCALE_KEYS),
                     "P̂ and V̂ scales are per 64-key group (the factored layout's single tiles may take 128 keys)")
    tl.static_assert(128 % BLOCK_M == 0, "a query block must lie inside one Q̂ scale block")
    tl.static_assert(BLOCK_M % SCALE_KEYS == 0, "the causal diagonal starts on a 64-key boundary")
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    bh_kv = b * (H // GROUP) + h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)

    if TMA:  # Hopper's tensor memory accelerator: one descriptor per operand, 3-D views (batch·head, rows, cols)
        q_desc = tl.make_tensor_descriptor(q8_ptr, shape=[tl.num_programs(1), N_PAD, HEAD_DIM],
                                           strides=[N_PAD * HEAD_DIM, HEAD_DIM, 1], block_shape=[1, BLOCK_M, HEAD_DIM])
        q = q_desc.load([bh, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
        k_base = tl.make_tensor_descriptor(k8_ptr + bh_kv.to(tl.int64) * N_PAD * HEAD_DIM, shape=[1, N_PAD, HEAD_DIM],
                                           strides=[N_PAD * HEAD_DIM, HEAD_DIM, 1], block_shape=[1, BLOCK_N, HEAD_DIM])
        vt_base = tl.make_tensor_descriptor(v8t_ptr + bh_kv.to(tl.int64) * HEAD_DIM * N_PAD,
                                            shape=[1, HEAD_DIM, N_PAD], strides=[HEAD_DIM * N_PAD, N_PAD, 1],
                                            block_shape=[1, HEAD_DIM, BLOCK_N])
    else:
        q_base = q8_ptr + bh.to(tl.int64) * N_PAD * HEAD_DIM
        q = tl.load(q_base + offs_m.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :])  # [BLOCK_M, D] e4m3
        k_base = k8_ptr + bh_kv.to(tl.int64) * N_PAD * HEAD_DIM
        vt_base = v8t_ptr + bh_kv.to(tl.int64) * HEAD_DIM * N_PAD
    s_q = tl.load(sq_ptr + bh.to(tl.int64) * (N_PAD // 128) + (pid_m * BLOCK_M) // 128)
    skv_base = bh_kv.to(tl.int64) * (N_PAD // SCALE_KEYS)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # whole key tiles left of the diagonal (causal) and of the ragged end need no mask
    full_end = (N // BLOCK_N) * BLOCK_N
    hi = N
    if CAUSAL:
        # a wide tile (128 keys over 64 rows) straddling the diagonal goes to the masked loop; the masked loop's last
        # tile may then lie partly beyond hi, its keys all masked, and never beyond N_pad (a multiple of 128)
        full_end = (tl.minimum(full_end, pid_m * BLOCK_M) // BLOCK_N) * BLOCK_N
        hi = (pid_m + 1) * BLOCK_M  # <= N_pad; keys >= N are masked
    if PAIRED:
        pair_end = (full_end // (2 * BLOCK_N)) * (2 * BLOCK_N)
        acc, l_i, m_i = _attn_fwd_pairs(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, qk_scale,
                                        N_PAD, 0, pair_end, HEAD_DIM, BLOCK_N, ROUND_FP32, TMA, FACTORED,
                                        ACC_PROMOTE)
        acc, l_i, m_i = _attn_fwd_tiles(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, offs_m,
                                        qk_scale, N, N_PAD, pair_end, full_end, HEAD_DIM, BLOCK_N, False, CAUSAL,
                                        ROUND_FP32, TMA, FACTORED, ACC_PROMOTE, SCALE_KEYS)
    else:
        acc, l_i, m_i = _attn_fwd_tiles(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, offs_m,
                                        qk_scale, N, N_PAD, 0, full_end, HEAD_DIM, BLOCK_N, False, CAUSAL,
                                        ROUND_FP32, TMA, FACTORED, ACC_PROMOTE, SCALE_KEYS)
    acc, l_i, m_i = _attn_fwd_tiles(acc, l_i, m_i, q, s_q, k_base, vt_base, sk_ptr, sv_ptr, skv_base, offs_m,
                                    qk_scale, N, N_PAD, full_end, hi, HEAD_DIM, BLOCK_N, True, CAUSAL, ROUND_FP32,
                                    TMA, FACTORED, ACC_PROMOTE, SCALE_KEYS)

    if FACTORED:  # P̂'s fixed scale and V̂'s channel scales, once per output element
        s_vc = tl.load(sv_ptr + bh_kv.to(tl.int64) * HEAD_DIM + offs_d)
        o = acc * (s_vc * (1.0 / 448.0))[None, :] / l_i[:, None]
    else:
        o = acc / l_i[:, None]
    o_ptrs = o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    o_ptrs = o_ptrs + offs_m.to(tl.int64)[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=(offs_m < N)[:, None])
    tl.store(lse_ptr + bh.to(tl.int64) * N_PAD + offs_m, m_i + tl.math.log2(l_i))


def ensure_allocator() -> None:
    """Device-side TMA descriptors live in a global scratch buffer that Triton asks an allocator for; give it
    PyTorch's (caching) allocator unless the caller set one. Set per launch: the allocator is a context variable, and
    autograd may run this from another thread."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


FACTORED_ACC_PROMOTE = 64
"""The factored layout's in-place dots add each 64-deep tile's FP8 products into their FP32 accumulator in FP32
(``max_num_imprecise_acc``), as precise as the paper layout's per-tile promotion without its scale multiply; ``None``
would leave every product of the loop to the tensor core's reduced-precision accumulation (the sweep times both)."""

ACC_PROMOTE_SWITCH = "DELTAMATCH_KERNEL_ACC_PROMOTE"
"""``0``: the factored dots never promote (Triton's default, every product of the loop in the tensor core's
accumulator); ``1`` or unset: every 64-deep tile promoted (``FACTORED_ACC_PROMOTE``). An A/B switch for the H200."""


def factored_acc_promote() -> int | None:
    """``max_num_imprecise_acc`` of the factored layout's dots under :data:`ACC_PROMOTE_SWITCH`."""
    return None if env_switch(ACC_PROMOTE_SWITCH) is False else FACTORED_ACC_PROMOTE


FACTORED_PAIRED_SWITCH = "DELTAMATCH_KERNEL_FWD_PAIRED"
"""``1``: the factored forward takes its unmasked key tiles two at a time (one running-max update and one rescale of
``acc`` per 128 keys; the pair's two FP8 products summed in the tensor core and promoted into FP32 once, every 128
keys instead of 64). Unset or ``0``: single tiles (an A/B switch until the H200 has timed it)."""

FACTORED_WIDE_SWITCH = "DELTAMATCH_KERNEL_FWD_WIDE"
"""``1``: the factored forward's key tiles are 128 keys wide (``BLOCK_N=128``; one S dot of 64 × 128, one PV dot
128 deep, one running-max update and one rescale of ``acc`` per 128 keys, K̂'s two 64-key scales as a column vector);
the dots still promote every 64 keys (``ACC_PROMOTE``), so only the online softmax's grouping moves P̂'s bits. Unlike
:data:`FACTORED_PAIRED_SWITCH` nothing is chained: one dot of each kind a tile. Unset or ``0``: 64-key tiles (an A/B
switch until the H200 has timed it). The pairs take precedence."""

CUDA_FWD_SWITCH = "DELTAMATCH_KERNEL_CUDA_FWD"
"""``matched_factored``'s forward through the CUDA kernel over 128-key tiles (``kernels/cuda/fwd_wide.cu``, V̂ᶜ written
in its fragment order): a variant of ``cuda_lib.FWD_WIDE_VARIANTS`` runs it (an error where it cannot run); ``0``:
the forward :data:`triton_bwd.CUDA_SWITCH` picks (Triton's, or with that switch at ``1`` the CUDA kernel with Triton's
bits). Unset: :data:`CUDA_FWD_DEFAULT` where the library loads, at D = 128 or 64 (``cuda_lib.DEFAULT_HEAD_DIMS``),
bf16 or fp16, and ``DELTAMATCH_KERNEL_CUDA`` is unset; Triton's forward elsewhere."""
CUDA_FWD_DEFAULT = "w4p"
"""The forward where :data:`CUDA_FWD_SWITCH` is unset: on the H200 (session 20 call 4, CUPTI at the reference shape,
one call) ``w4p`` (the next tile's S beside this tile's product) 1.450 ms a step, ``w4pp`` (``w4p`` with the two
consumers taking turns to issue) 1.507 / 1.510, ``w4`` (each tile in turn) 1.599; Triton's 64-key forward 1.96
(session 19). The three variants give the same bits. At D = 64 (an H100, session 42, CUPTI at B 4, H 16, N = 8K, two
rounds) ``w4p`` 1.106 ms against Triton's 1.328; the emulating forms lost there (``w4pe8`` 1.206, ``w4pe4`` 1.185,
``w4pe2`` 1.278)."""


def cuda_variant(switch: str, built: dict[int, tuple[str, ...]], default: str, what: str, head_dim: int, off: bool,
                 checks=(), dtype: torch.dtype | None = None) -> str | None:
    """The variant of a CUDA kernel that runs under ``switch`` (a variant built at ``head_dim``, ``0``, or unset:
    ``default`` unless ``off`` or ``head_dim`` is not one of ``cuda_lib.DEFAULT_HEAD_DIMS``), or None. ``built``: the
    variants built at each head dim. It runs where the library loads at a head dim of ``built``, writes ``dtype`` (the
    kernels write bf16 or fp16; None: no output of the input's dtype) and no ``checks`` (callables giving a reason, or
    an empty string) object; a bad value, or a variant asked for where it cannot run, is an error that names the switch
    and ``what``."""
    from deltamatch.kernels import cuda_lib

    value = os.environ.get(switch, "")
    if value == "0" or (not value and (off or head_dim not in cuda_lib.DEFAULT_HEAD_DIMS)):
        return None
    variants = built.get(head_dim, built.get(cuda_lib.DV_HEAD_DIM, next(iter(built.values()))))
    if value and value not in variants:
        raise ValueError(f"{switch}={value!r}: expected one of {variants} or 0 (or unset)")
    _, reason = cuda_lib.load()
    if not reason and head_dim not in built:
        reason = f"head dim {head_dim}: built for " + " and ".join(f"D = {d}" for d in built) + " only"
    if not reason and dtype not in (None, torch.bfloat16, torch.float16):
        reason = f"dtype {dtype}: the CUDA {what} writes bf16 or fp16"
    for check in checks:
        reason = reason or check()
    if reason and value:
        raise RuntimeError(f"{switch}={value} but the CUDA {what} cannot run: {reason}")
    return None if reason else value or default


def cuda_forward_variant(head_dim: int, dtype: torch.dtype) -> str | None:
    """The variant of the CUDA forward over 128-key tiles that runs (:data:`CUDA_FWD_SWITCH`), or None; a bad value,
    or a variant asked for where it cannot run, is an error that names the switch."""
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_bwd import CUDA_SWITCH

    checks = (lambda: f"{ONE_READ_SWITCH}=1 writes V̂ᶜ in token order, and this forward reads it in fragment order"
              if env_switch(ONE_READ_SWITCH) else "",)
    return cuda_variant(CUDA_FWD_SWITCH, cuda_lib.FWD_WIDE_BUILT, CUDA_FWD_DEFAULT, "forward", head_dim,
                        env_switch(CUDA_SWITCH) is not None, checks, dtype)


TMA_SWITCH = "DELTAMATCH_KERNEL_TMA"
"""``1``: every kernel loads its FP8 tiles through TMA descriptors at every head dim; ``0``: through pointers
everywhere. Unset: TMA at D = 128, where the H200 timed it faster in every kernel (kernels/NOTES.md, v5), and at
D = 256, where an H100 timed it faster in every kernel but the paper layout's dQ (session 41's sweeps: forward 6.42 →
5.47 ms, factored 5.78 → 4.54; dK + dV 15.02 → 13.88, factored 13.07 → 12.18; dQ factored 7.89 → 7.46, but the paper
layout's 9.20 → 9.72, so it stays on pointers: ``triton_bwd.backward_config``). The same bits either way."""
TMA_HEAD_DIMS = (128, 256)


def tma_enabled(head_dim: int) -> bool:
    """Whether the attention kernels at ``head_dim`` load their FP8 tiles through TMA (:data:`TMA_SWITCH`)."""
    switch = env_switch(TMA_SWITCH)
    return head_dim in TMA_HEAD_DIMS if switch is None else switch


def forward_config(head_dim: int, factored: bool = False) -> dict:
    """Block sizes and warps per head dim (the accumulator is BLOCK_M × D FP32 in registers).

    Chosen by tools/device/kernel_sweep.py on the H200 (causal, N = 8192, B·H = 64; kernels/NOTES.md has the table):
    BLOCK_M = 64 on one warpgroup beat 128 on two by 1.1–1.3×; paired key tiles paid off at D = 64 only.
    ``TMA=True`` (Q̂, K̂, V̂ᵀ through Hopper's tensor memory accelerator) at D = 128 and 256 (:func:`tma_enabled`).
    ``factored``: the factored scale layout's forward (``FACTORED``; single key tiles, pairs under
    :data:`FACTORED_PAIRED_SWITCH`, 128-key tiles under :data:`FACTORED_WIDE_SWITCH`).
    """
    if factored:
        base = {**forward_config(head_dim), "PAIRED": False, "FACTORED": True, "ACC_PROMOTE": factored_acc_promote()}
        if head_dim > 128:  # session 41's sweep (H100): 3 stages 4.21 ms against 2 stages' 4.56, both through TMA
            base["num_stages"] = 3
        if env_switch(FACTORED_PAIRED_SWITCH):  # a stage holds two key tiles: half the stages, the same shared memory
            base.update(PAIRED=True, num_stages=max(1, base["num_stages"] // 2))
        elif env_switch(FACTORED_WIDE_SWITCH):  # 128-key tiles: a stage holds twice the bytes, so half the stages
            base.update(BLOCK_N=2 * BLOCK_KV, num_stages=max(1, base["num_stages"] // 2))
        return base
    tma = {"TMA": True} if tma_enabled(head_dim) else {}
    if head_dim <= 64:
        return dict(BLOCK_M=64, BLOCK_N=BLOCK_KV, num_warps=4, num_stages=4, PAIRED=True, **tma)
    if head_dim <= 128:
        return dict(BLOCK_M=64, BLOCK_N=BLOCK_KV, num_warps=4, num_stages=4, **tma)
    return dict(BLOCK_M=64, BLOCK_N=BLOCK_KV, num_warps=4, num_stages=2, **tma)


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
    if cfg.get("TMA") and q8.is_cuda:
        ensure_allocator()
    grid = (triton.cdiv(n, cfg["BLOCK_M"]), b * h)
    _attn_fwd_kernel[grid](
        q8, k8, v8t, sq, sk, sv, o, lse2, o.stride(0), o.stride(1), o.stride(2),
        softmax_scale * math.log2(math.e), n, n_pad, h, group,
        HEAD_DIM=d, CAUSAL=causal, ROUND_FP32=round_fp32_in_kernels(), **cfg,
    )
    return o, lse2
