"""The quantisation pass of the Triton FP8 attention: E4M3 codes with FP32 block scales, in the layouts wgmma wants.

FP8 ``wgmma`` reads both operands K-major (the contraction dimension contiguous in shared memory). Three of the seven
matmuls contract over tokens (PV: keys; dV = Pᵀ dO and dK = dSᵀ Q: queries; dQ = dS K: keys), so their B operands
(V, dO, Q, K) are wanted token-major. This pass therefore writes each code tensor twice: ``x8`` as
``(B, H, N_pad, D)`` (D contiguous) and ``x8t`` as ``(B, H, D, N_pad)`` (tokens contiguous). ``N_pad`` rounds N up to
a multiple of 128, the largest quantisation block; padded rows are zero codes and never change a scale.

Scales follow kernels/README.md: one FP32 scale per ``BLOCK_ROWS`` tokens × D (128 for Q and dO, 64 for K and V),
``s = amax / 448`` (1 for an all-zero block), ``code = rne_e4m3(clamp(x / s, ±448))``. K is centred per (batch, kv
head) first. The dO pass also forms the row-wise δ of the ``stale`` (Σ dO·O) and ``consistent`` (Σ dÔ·O) methods,
since it holds both dO and its dequantised codes. The factored layout's per-channel pass (``quantize_per_channel``)
takes one scale per channel over every token instead, so it needs the whole (batch, head) before any cast: one launch
gathers the amax, a second reads x again and casts. matched_factored's K, V and dO need both a block-scaled and a
per-channel copy; ``quantize_block_and_channel`` writes both from one read, and ``centring_stats`` forms K's mean and
its centred per-channel amax from one read before it (``ONE_READ_SWITCH``: slower on the H200 as Triton lays them out).

Triton's interpreter casts FP32 to FP8 by truncation, so with ``ROUND_FP32`` the kernels first round to the E4M3 grid
in FP32 arithmetic (``round_e4m3_fp32``), after which any cast is exact. On the GPU the hardware cast (``cvt.rn``) is
used directly.

The two code stores (``_store_codes``, ``STORE_MODE``). A pass loads its block with each thread holding a run of D
(the BF16 load's layout), which the token-major store wants; the channel-major store wants each thread to hold a run
of tokens. Stored as ``tl.store(..., tl.trans(codes))`` (``STORE_POINTERS``), Triton 3.6 converts layouts through
shared memory, but its layout pass (``hoistConvertOnTopOfExtOrBroadcast``) hoists that conversion above the BF16 → FP32
extension of the load: the BF16 block is converted, and the whole quantisation (the ``div.rn`` per element above
all) is computed a second time in the transposed layout. At D = 128 the q pass then holds 156 registers (90 and 80
with one store) and the H200 timed it at 0.218 ms, against 0.083 with the token-major store alone and 0.070 with the
channel-major store alone (kernels/NOTES.md). The other modes compute the codes once:

- ``STORE_NARROW_CONVERT``: widen and narrow the codes' bits before the transpose (a no-op once LLVM has run), so the
  hoist stops there and the conversion moves the 8-bit codes, once; both stores stay pointer stores of 16 bytes.
- ``STORE_TMA_CHANNEL``: the channel-major copy through a TMA descriptor store (the codes written to shared memory
  by each thread as they lie, then one bulk copy); the token-major store as before.
- ``STORE_TMA_BOTH``: both copies through TMA descriptor stores.

The TMA modes make their descriptors on the device, one per program, in a scratch buffer from Triton's allocator
(``store_flags`` sets it, as ``triton_fwd.ensure_allocator`` does for the attention kernels).

All modes store the same bits (tests/kernels: in the interpreter and on the GPU); ``STORE_MODE`` picks the one every
launch uses, and awaits the H200's timing of each (``tools/device/kernel_sweep.py --quant-only``).
"""

import os

import torch
import triton
import triton.language as tl

from deltamatch.kernels import quant
from deltamatch.methods import get_method

E4M3_MAX = 448.0
BLOCK_Q = 128
"""Query rows per Q̂ / dÔ scale."""
BLOCK_KV = 64
"""Keys per K̂ / V̂ scale."""

STORE_POINTERS = tl.constexpr(0)
STORE_NARROW_CONVERT = tl.constexpr(1)
STORE_TMA_CHANNEL = tl.constexpr(2)
STORE_TMA_BOTH = tl.constexpr(3)
STORE_MODES = {"pointers": STORE_POINTERS.value, "narrow_convert": STORE_NARROW_CONVERT.value,
               "tma_channel": STORE_TMA_CHANNEL.value, "tma_both": STORE_TMA_BOTH.value}
"""How ``_store_codes`` writes the two code layouts, by name (the module docstring says what each does)."""
VERIFIED_STORE_MODES = ("pointers", "tma_both")
"""The modes whose codes are bit-equal to the pointer stores on the H200 (tests/kernels/test_triton_gpu.py, session 8:
kernels/NOTES.md). ``narrow_convert`` and ``tma_channel`` pass in the interpreter but write wrong channel-major codes on
the GPU; the sweep still times them (its ``bit_equal`` column says so) until they are fixed."""
STORE_MODE = STORE_MODES["pointers"]
"""The store mode of every quantisation launch, one of ``VERIFIED_STORE_MODES``: the pointer stores (0.220 ms for the
Q pass at N = 8K, D = 128 on the H200; ``tma_both`` is bit-equal but 0.238); changing it here changes every pass."""
LAYOUTS = {"token": 1, "channel": 2, "both": 3}
"""Which code layouts a pass writes (its kernels' ``STORES`` bits): token-major ``x8``, channel-major ``x8t``, or both.
The paper layout's kernels read both; ``matched_factored`` reads one of each operand's (Q̂, K̂, V̂, dÔ token-major; the
per-channel V̂ᶜ, K̂ᶜ, Q̂'ᶜ, dÔᶜ channel-major), and a pass that writes one layout also computes its codes once (the
module docstring): on the H200 the Q pass takes 0.083 ms with the token-major store alone against 0.218 with both."""
STORE_UNUSED_SWITCH = "DELTAMATCH_KERNEL_STORE_UNUSED"
"""``1``: every pass writes both layouts, as before ``LAYOUTS`` (the A/B of kernels/NOTES.md)."""
ONE_READ_SWITCH = "DELTAMATCH_KERNEL_ONE_READ"
"""``1``: matched_factored quantises K, V and dO with ``quantize_block_and_channel`` (both copies from one read) and
forms K's mean and centred amax with ``centring_stats``. Off by default: on the H200 (session 17, kernels/NOTES.md)
these launches took 9.27 ms of kernel time a step against 9.04 for the passes they replace (the one-read pass
0.14–0.24 ms against 0.07–0.08 for each of the two it replaces; the column sums, maxima and minima 0.13)."""


def env_switch(name: str) -> bool | None:
    """A kernel switch from the environment: True for ``1``, False for ``0``, None when unset or empty."""
    value = os.environ.get(name, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r}: expected 0 or 1 (or unset for the default)")
    return None if value == "" else value == "1"


def round_fp32_in_kernels() -> bool:
    """Whether kernels must round to E4M3 in FP32 before casting (Triton's interpreter casts wrongly)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def padded_len(n: int) -> int:
    return triton.cdiv(n, BLOCK_Q) * BLOCK_Q


@triton.jit
def round_e4m3_fp32(x):
    """Round FP32 ``x`` (already within ±448) to the nearest E4M3 value, ties to even, in FP32 arithmetic."""
    a = tl.abs(x)
    exponent = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, -6)  # subnormals share the lowest normal binade's step
    step = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inv_step = ((127 - exponent + 3) << 23).to(tl.float32, bitcast=True)
    y = a * inv_step  # exact: power-of-two scaling; y < 16
    y = (y + 8388608.0) - 8388608.0  # round half to even at integer resolution (FP32 RNE, 0 <= y < 2^23)
    r = y * step
    # the sign copied bit for bit: ``-r`` is ``0 - r`` in Triton, so a negative x that rounds to zero would give +0
    # where the hardware cast (and PyTorch's) gives -0
    sign = (x.to(tl.int32, bitcast=True) >> 31) << 31
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def to_e4m3(x, ROUND_FP32: tl.constexpr):
    """Saturating round-to-nearest-even cast of FP32 ``x`` to E4M3 codes."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    if ROUND_FP32:
        x = round_e4m3_fp32(x)
    return x.to(tl.float8e4nv)


@triton.jit
def scale_from_amax(amax):
    return tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)


@triton.jit
def _load_rows(x_ptr, b, h, N, stride_xb, stride_xn, stride_xh, rows, HEAD_DIM: tl.constexpr):
    """One ``[BLOCK_ROWS, D]`` block of ``x`` (public layout) in FP32, zero in rows ``>= N``."""
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = x_ptr + b.to(tl.int64) * stride_xb + h.to(tl.int64) * stride_xh
    ptrs = ptrs + rows.to(tl.int64)[:, None] * stride_xn + offs_d[None, :]
    return tl.load(ptrs, mask=(rows < N)[:, None], other=0.0).to(tl.float32)


@triton.jit
def _quant_block(x_ptr, mean_ptr, b, h, H, N, stride_xb, stride_xn, stride_xh, rows,
                 HEAD_DIM: tl.constexpr, CENTRE: tl.constexpr, ROUND_FP32: tl.constexpr):
    """Load one ``[BLOCK_ROWS, D]`` block of ``x`` (public layout), centre it, return (x, codes, scale)."""
    offs_d = tl.arange(0, HEAD_DIM)
    valid = rows < N
    x = _load_rows(x_ptr, b, h, N, stride_xb, stride_xn, stride_xh, rows, HEAD_DIM)  # [BLOCK_ROWS, D]
    if CENTRE:
        mean = tl.load(mean_ptr + (b * H + h).to(tl.int64) * HEAD_DIM + offs_d)  # [D]
        x = tl.where(valid[:, None], x - mean[None, :], 0.0)
    scale = scale_from_amax(tl.max(tl.max(tl.abs(x), 1), 0))
    codes = to_e4m3(tl.math.div_rn(x, scale), ROUND_FP32)
    return x, codes, scale


@triton.jit
def _store_codes(x8_ptr, x8t_ptr, codes, bh, pid_r, N_PAD, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                 STORE_MODE: tl.constexpr, STORES: tl.constexpr = 3):
    """Store row block ``pid_r`` of (batch·head) ``bh``'s codes token-major (bit 1 of ``STORES``) and channel-major
    (bit 2), the way ``STORE_MODE`` says (``LAYOUTS`` names the bits)."""
    tl.static_assert(STORE_MODE <= STORE_TMA_BOTH, "unknown STORE_MODE")
    offs_d = tl.arange(0, HEAD_DIM)
    row0 = pid_r * BLOCK_ROWS
    rows = row0 + tl.arange(0, BLOCK_ROWS)
    base = bh.to(tl.int64) * N_PAD * HEAD_DIM
    codes_t = codes  # what the channel-major pointer store transposes
    if STORE_MODE == STORE_NARROW_CONVERT:
        # the same bits through a widening op: going back from the transpose, Triton's layout pass stops at the
        # first widening op it meets, so the conversion stays on these 8-bit codes (module docstring); the shifts
        # keep the widening from folding away before that pass, and cost nothing after LLVM
        wide = codes.to(tl.uint8, bitcast=True).to(tl.uint16)
        codes_t = ((wide << 8) >> 8).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    if STORES & 1:
        if STORE_MODE == STORE_TMA_BOTH:
            x8_desc = tl.make_tensor_descriptor(x8_ptr, shape=[tl.num_programs(1), N_PAD, HEAD_DIM],
                                                strides=[N_PAD * HEAD_DIM, HEAD_DIM, 1],
                                                block_shape=[1, BLOCK_ROWS, HEAD_DIM])
            x8_desc.store([bh, row0, 0], codes.reshape(1, BLOCK_ROWS, HEAD_DIM))
        else:
            tl.store(x8_ptr + base + rows.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :], codes)
    if STORES & 2:
        if STORE_MODE == STORE_TMA_CHANNEL or STORE_MODE == STORE_TMA_BOTH:
            x8t_desc = tl.make_tensor_descriptor(x8t_ptr, shape=[tl.num_programs(1), HEAD_DIM, N_PAD],
                                                 strides=[HEAD_DIM * N_PAD, N_PAD, 1],
                                                 block_shape=[1, HEAD_DIM, BLOCK_ROWS])
            x8t_desc.store([bh, 0, row0], tl.trans(codes).reshape(1, HEAD_DIM, BLOCK_ROWS))
        else:
            tl.store(x8t_ptr + base + offs_d[:, None] * N_PAD + rows[None, :], tl.trans(codes_t))


@triton.jit
def _fold_channel_amax(amax_ptr, bh, x, HEAD_DIM: tl.constexpr):
    """Fold a ``[rows, D]`` block's per-channel max |x| into the (batch, head)'s FP32 amax (B, H, D). Every value is
    >= 0, so the float atomic max is exact and the result does not depend on the order the blocks arrive in."""
    offs_d = tl.arange(0, HEAD_DIM)
    tl.atomic_max(amax_ptr + bh.to(tl.int64) * HEAD_DIM + offs_d, tl.max(tl.abs(x), 0), sem="relaxed")


@triton.jit
def _quant_pass_kernel(
    x_ptr, mean_ptr,  # x (B, N, H, D) any float dtype; mean (B, H, D) fp32 when CENTRE
    x8_ptr, x8t_ptr, scale_ptr,  # codes (B, H, N_pad, D), (B, H, D, N_pad); scales (B, H, N_pad / BLOCK_ROWS)
    stride_xb, stride_xn, stride_xh,
    N, N_PAD, H,
    HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, CENTRE: tl.constexpr, ROUND_FP32: tl.constexpr,
    STORE_MODE: tl.constexpr, STORES: tl.constexpr = 3,
):
    pid_r, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    _, codes, scale = _quant_block(x_ptr, mean_ptr, b, h, H, N, stride_xb, stride_xn, stride_xh, rows,
                                   HEAD_DIM, CENTRE, ROUND_FP32)
    _store_codes(x8_ptr, x8t_ptr, codes, bh, pid_r, N_PAD, HEAD_DIM, BLOCK_ROWS, STORE_MODE, STORES)
    tl.store(scale_ptr + bh.to(tl.int64) * (N_PAD // BLOCK_ROWS) + pid_r, scale)


@triton.jit
def _quant_do_delta_pass_kernel(
    do_ptr, o_ptr,  # dO (B, N, H, D) and O (B, N, H, D) bf16
    do8_ptr, do8t_ptr, scale_ptr, delta_ptr,  # codes, scales (B, H, N_pad / 128), δ (B, H, N_pad) fp32
    stride_db, stride_dn, stride_dh, stride_ob, stride_on, stride_oh,
    N, N_PAD, H,
    HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, DELTA: tl.constexpr, ROUND_FP32: tl.constexpr,
    STORE_MODE: tl.constexpr, STORES: tl.constexpr = 3,
):
    """Quantise dO and, for DELTA == 1 (stale) or 2 (consistent), write δ_i = Σ_k dO_ik O_ik (resp. dÔ_ik)."""
    pid_r, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    do, codes, scale = _quant_block(do_ptr, do_ptr, b, h, H, N, stride_db, stride_dn, stride_dh, rows,
                                    HEAD_DIM, False, ROUND_FP32)
    _store_codes(do8_ptr, do8t_ptr, codes, bh, pid_r, N_PAD, HEAD_DIM, BLOCK_ROWS, STORE_MODE, STORES)
    tl.store(scale_ptr + bh.to(tl.int64) * (N_PAD // BLOCK_ROWS) + pid_r, scale)
    if DELTA != 0:
        offs_d = tl.arange(0, HEAD_DIM)
        o_ptrs = o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
        o_ptrs = o_ptrs + rows.to(tl.int64)[:, None] * stride_on + offs_d[None, :]
        o = tl.load(o_ptrs, mask=(rows < N)[:, None], other=0.0).to(tl.float32)  # [BLOCK_ROWS, D]
        if DELTA == 2:
            do = codes.to(tl.float32) * scale
        tl.store(delta_ptr + bh.to(tl.int64) * N_PAD + rows, tl.sum(do * o, 1))


@triton.jit
def _per_channel_block(x_ptr, mean_ptr, row_scale_ptr, b, h, H, N, N_PAD, stride_xb, stride_xn, stride_xh, rows,
                       HEAD_DIM: tl.constexpr, CENTRE: tl.constexpr, ROW_SCALED: tl.constexpr):
    """One ``[BLOCK_ROWS, D]`` block of the per-channel operand in FP32, ``(x - mean) * row_scale`` in that order
    (the PyTorch twin's), zero in padded rows so that they never raise an amax."""
    offs_d = tl.arange(0, HEAD_DIM)
    valid = rows < N
    bh = (b * H + h).to(tl.int64)
    x = _load_rows(x_ptr, b, h, N, stride_xb, stride_xn, stride_xh, rows, HEAD_DIM)  # [BLOCK_ROWS, D]
    if CENTRE:
        x = x - tl.load(mean_ptr + bh * HEAD_DIM + offs_d)[None, :]
    if ROW_SCALED:
        x = x * tl.load(row_scale_ptr + bh * N_PAD + rows)[:, None]  # N_pad long; padded rows zeroed below
    return tl.where(valid[:, None], x, 0.0)


@triton.jit
def _block_rows(pid_r, BLOCK_ROWS: tl.constexpr, FRAGMENT_ORDER: tl.constexpr):
    """The tokens of row block ``pid_r`` in the order a program loads them: natural, or ``fragment_token_order``
    (position 16G + 4q + j holds token 16G + 2q + (j & 1) + 8 (j >> 1))."""
    local = tl.arange(0, BLOCK_ROWS)
    if FRAGMENT_ORDER:
        local = (local & ~15) | (((local >> 2) & 3) << 1) | (local & 1) | (((local >> 1) & 1) << 3)
    return pid_r * BLOCK_ROWS + local


@triton.jit
def _per_channel_amax_pass_kernel(
    x_ptr, mean_ptr, row_scale_ptr,  # x (B, N, H, D); mean (B, H, D) when CENTRE; row scales (B, H, N_pad)
    amax_ptr,  # (B, H, D) fp32, zero on entry
    stride_xb, stride_xn, stride_xh,
    N, N_PAD, H,
    HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, CENTRE: tl.constexpr, ROW_SCALED: tl.constexpr,
):
    """Per-channel max |x| of one block of rows, folded into the (batch, head)'s amax (``_fold_channel_amax``)."""
    pid_r, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    x = _per_channel_block(x_ptr, mean_ptr, row_scale_ptr, b, h, H, N, N_PAD, stride_xb, stride_xn, stride_xh, rows,
                           HEAD_DIM, CENTRE, ROW_SCALED)
    _fold_channel_amax(amax_ptr, bh, x, HEAD_DIM)


@triton.jit
def _per_channel_quant_pass_kernel(
    x_ptr, mean_ptr, row_scale_ptr, amax_ptr,  # as the amax pass; amax (B, H, D) complete
    x8_ptr, x8t_ptr, scale_ptr,  # codes (B, H, N_pad, D), (B, H, D, N_pad); scales (B, H, D)
    stride_xb, stride_xn, stride_xh,
    N, N_PAD, H,
    HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, CENTRE: tl.constexpr, ROW_SCALED: tl.constexpr,
    ROUND_FP32: tl.constexpr, STORE_MODE: tl.constexpr, STORES: tl.constexpr = 3, FRAGMENT_ORDER: tl.constexpr = False,
):
    """Recompute the block, cast it with its channels' scales, store the code layouts ``STORES`` names; the first block
    of each (batch, head) stores the scales. FRAGMENT_ORDER (channel-major codes only): the block's rows are loaded in
    ``fragment_token_order``, so that position p of each 16-token group holds token π(p)."""
    tl.static_assert(not FRAGMENT_ORDER or STORES == 2, "the fragment order is a channel-major layout")
    pid_r, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = _block_rows(pid_r, BLOCK_ROWS, FRAGMENT_ORDER)
    x = _per_channel_block(x_ptr, mean_ptr, row_scale_ptr, b, h, H, N, N_PAD, stride_xb, stride_xn, stride_xh, rows,
                           HEAD_DIM, CENTRE, ROW_SCALED)
    offs_d = tl.arange(0, HEAD_DIM)
    scale = scale_from_amax(tl.load(amax_ptr + bh.to(tl.int64) * HEAD_DIM + offs_d))  # [D]
    codes = to_e4m3(tl.math.div_rn(x, scale[None, :]), ROUND_FP32)
    _store_codes(x8_ptr, x8t_ptr, codes, bh, pid_r, N_PAD, HEAD_DIM, BLOCK_ROWS, STORE_MODE, STORES)
    if pid_r == 0:
        tl.store(scale_ptr + bh.to(tl.int64) * HEAD_DIM + offs_d, scale)


@triton.jit
def _column_stats_kernel(
    x_ptr, part_ptr,  # x (B, N, H, D); partials (B·H, NBLK, 3, D) fp32: Σx, max x, min x of each block's valid rows
    stride_xb, stride_xn, stride_xh,
    N, H, NBLK,
    HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):
    """One block of rows' per-channel sum, max and min, written plainly (the reduction over blocks is the next
    launch's, in a fixed order: no atomics, so the mean's bits do not depend on the order programs run in)."""
    pid_r, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_r * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    valid = (rows < N)[:, None]
    x = _load_rows(x_ptr, b, h, N, stride_xb, stride_xn, stride_xh, rows, HEAD_DIM)  # zero in rows >= N
    offs_d = tl.arange(0, HEAD_DIM)
    part = part_ptr + (bh.to(tl.int64) * NBLK + pid_r) * 3 * HEAD_DIM + offs_d
    tl.store(part, tl.sum(x, 0))
    tl.store(part + HEAD_DIM, tl.max(tl.where(valid, x, -float("inf")), 0))
    tl.store(part + 2 * HEAD_DIM, tl.min(tl.where(valid, x, float("inf")), 0))


@triton.jit
def _column_stats_reduce_kernel(
    part_ptr, mean_ptr, amax_ptr,  # partials as _column_stats_kernel's; mean and amax (B, H, D) fp32
    N, NBLK,
    HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr,
):
    """Fold a (batch, head)'s block partials in block order: mean = Σx / N, and the amax of the centred values
    max(fl(max x − mean), fl(mean − min x)), which is max |fl(x − mean)| bit for bit: x ↦ fl(x − mean) does not
    decrease, so its extremes are those of x, and negation is exact."""
    bh = tl.program_id(0)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_c = tl.arange(0, CHUNK)
    total = tl.zeros([HEAD_DIM], dtype=tl.float32)
    hi = tl.full([HEAD_DIM], -float("inf"), tl.float32)
    lo = tl.full([HEAD_DIM], float("inf"), tl.float32)
    for c0 in range(0, NBLK, CHUNK):
        blk = c0 + offs_c
        ptrs = part_ptr + (bh.to(tl.int64) * NBLK + blk)[:, None] * 3 * HEAD_DIM + offs_d[None, :]
        inside = (blk < NBLK)[:, None]
        total += tl.sum(tl.load(ptrs, mask=inside, other=0.0), 0)
        hi = tl.maximum(hi, tl.max(tl.load(ptrs + HEAD_DIM, mask=inside, other=-float("inf")), 0))
        lo = tl.minimum(lo, tl.min(tl.load(ptrs + 2 * HEAD_DIM, mask=inside, other=float("inf")), 0))
    mean = tl.math.div_rn(total, tl.zeros([HEAD_DIM], dtype=tl.float32) + N)
    tl.store(mean_ptr + bh.to(tl.int64) * HEAD_DIM + offs_d, mean)
    tl.store(amax_ptr + bh.to(tl.int64) * HEAD_DIM + offs_d, tl.maximum(hi - mean, mean - lo))


@triton.jit
def _block_and_channel_pass_kernel(
    x_ptr, mean_ptr, amax_ptr,  # x (B, N, H, D); mean (B, H, D) when CENTRE; the per-channel amax (B, H, D)
    x8_ptr, sx_ptr,  # block-scaled codes (B, H, N_pad, D), their scales (B, H, N_pad / BLOCK_ROWS)
    x8t_ptr, sxc_ptr,  # per-channel codes (B, H, D, N_pad), their scales (B, H, D)
    stride_xb, stride_xn, stride_xh,
    N, N_PAD, H,
    HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, CENTRE: tl.constexpr, ROUND_FP32: tl.constexpr,
    STORE_MODE: tl.constexpr, FRAGMENT_ORDER: tl.constexpr = False,
):
    """One read of a block of rows, two casts: with the block's own scale to token-major codes (``_quant_pass_kernel``'s
    bits) and with its channels' scales to channel-major codes (``_per_channel_quant_pass_kernel``'s). FRAGMENT_ORDER:
    the rows are loaded in ``fragment_token_order``; the token-major store puts each row back at its token."""
    pid_r, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = _block_rows(pid_r, BLOCK_ROWS, FRAGMENT_ORDER)
    x = _per_channel_block(x_ptr, mean_ptr, mean_ptr, b, h, H, N, N_PAD, stride_xb, stride_xn, stride_xh, rows,
                           HEAD_DIM, CENTRE, False)  # zero in padded rows, as the block pass's
    offs_d = tl.arange(0, HEAD_DIM)
    scale = scale_from_amax(tl.max(tl.max(tl.abs(x), 1), 0))
    codes = to_e4m3(tl.math.div_rn(x, scale), ROUND_FP32)
    base = bh.to(tl.int64) * N_PAD * HEAD_DIM
    tl.store(x8_ptr + base + rows.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :], codes)
    tl.store(sx_ptr + bh.to(tl.int64) * (N_PAD // BLOCK_ROWS) + pid_r, scale)
    channel_scale = scale_from_amax(tl.load(amax_ptr + bh.to(tl.int64) * HEAD_DIM + offs_d))  # [D]
    channel_codes = to_e4m3(tl.math.div_rn(x, channel_scale[None, :]), ROUND_FP32)
    _store_codes(x8t_ptr, x8t_ptr, channel_codes, bh, pid_r, N_PAD, HEAD_DIM, BLOCK_ROWS, STORE_MODE, 2)
    if pid_r == 0:
        tl.store(sxc_ptr + bh.to(tl.int64) * HEAD_DIM + offs_d, channel_scale)


def _check_public(x: torch.Tensor, name: str) -> None:
    if x.dim() != 4 or x.stride(-1) != 1:
        raise ValueError(f"{name} must be (B, N, H, D) with a contiguous last dim, got {tuple(x.shape)} {x.stride()}")


def _warps(rows: int, head_dim: int) -> int:
    """Four warps spill on blocks of 128 × 128 and larger (one FP32 block, and O for δ, live in registers). At D = 256
    sixteen: the H200 sweep (session 18, ``kernel_sweep.py --per-channel-only --head-dims 256``) timed the block passes
    at 16 warps against 8 at Q̂ 0.227 → 0.176 ms, dÔ 0.226 → 0.176, K̂ 0.163 → 0.155, V̂ 0.155 → 0.149 (same bits)."""
    if head_dim >= 256 and rows * head_dim >= 64 * 256:
        return 16
    return 8 if rows * head_dim >= 128 * 128 else 4


PER_CHANNEL_LAUNCHES = {64: dict(amax=(128, 4), cast=(64, 4)), 128: dict(amax=(128, 4), cast=(64, 8)),
                        256: dict(amax=(128, 4), cast=(64, 8))}
"""(BLOCK_ROWS, num_warps) of the per-channel passes' two launches by head dim, timed on the H200
(``tools/device/kernel_sweep.py --per-channel-only``; the same bits, a block's rows only say which program casts them).
D = 128 (session 16): the amax fastest at 128 rows and 4 warps, the cast at 64 rows and 8 warps (V̂ᶜ, K̂ᶜ, dÔᶜ, Q̂'ᶜ:
amax 0.047–0.057 ms against 0.062–0.069 at 128 rows and 8 warps, cast 0.072–0.085 against 0.093–0.111). D = 64 and
256 (session 18, against the one shape they had, 128 rows at 4 and 8 warps): D = 64 cast 0.044–0.054 → 0.040–0.047 at
64 rows and 4 warps (the amax's launch was already the fastest, 0.030–0.035); D = 256 amax 0.121–0.134 → 0.092–0.106 at
128 rows and 4 warps (256 rows at 4 warps timed 0.091 for V and dO but 1.09 for centred K), cast 0.247–0.281 →
0.168–0.203 at 64 rows and 8 warps."""


def _per_channel_launch(d: int, launch: str) -> tuple[int, int]:
    return PER_CHANNEL_LAUNCHES.get(d, {}).get(launch, (BLOCK_Q, _warps(BLOCK_Q, d)))


def stored_layouts(layouts: str) -> str:
    """The layouts a pass asked for ``layouts`` writes: itself, or ``both`` under :data:`STORE_UNUSED_SWITCH`."""
    if layouts not in LAYOUTS:
        raise ValueError(f"layouts {layouts!r}: expected one of {tuple(LAYOUTS)}")
    return "both" if env_switch(STORE_UNUSED_SWITCH) else layouts


def store_flags(store_mode: int | None, layouts: str = "both") -> dict:
    """The ``STORE_MODE`` and ``STORES`` constexprs of a launch: ``store_mode`` (a ``STORE_MODES`` value), or
    ``STORE_MODE`` when it is None; ``layouts`` a ``LAYOUTS`` key, as :func:`stored_layouts` returned it. Sets Triton's
    allocator for the modes that make TMA descriptors on the device."""
    mode = STORE_MODE if store_mode is None else store_mode
    if mode not in STORE_MODES.values():
        raise ValueError(f"store_mode {mode!r}: expected one of {STORE_MODES}")
    if mode in (STORE_TMA_CHANNEL.value, STORE_TMA_BOTH.value):
        from deltamatch.kernels.triton_fwd import ensure_allocator  # triton_fwd imports this module

        ensure_allocator()
    return dict(STORE_MODE=mode, STORES=LAYOUTS[layouts])


def code_buffers(x: torch.Tensor, layouts: str = "both") -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Uninitialised E4M3 codes for a public-layout ``(B, N, H, D)`` ``x`` in the layouts the kernels read:
    token-major ``(B, H, N_pad, D)`` and channel-major ``(B, H, D, N_pad)``; None for a layout ``layouts`` leaves out."""
    b, n, h, d = x.shape
    n_pad = padded_len(n)
    stores = LAYOUTS[layouts]
    return (torch.empty((b, h, n_pad, d), device=x.device, dtype=torch.float8_e4m3fn) if stores & 1 else None,
            torch.empty((b, h, d, n_pad), device=x.device, dtype=torch.float8_e4m3fn) if stores & 2 else None)


def _code_args(x8: torch.Tensor | None, x8t: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The two code pointers of a launch: a layout left out is never written, so the other stands in for it."""
    return (x8 if x8 is not None else x8t), (x8t if x8t is not None else x8)


def token_mean(x: torch.Tensor) -> torch.Tensor:
    """The FP32 mean over tokens of a public-layout ``(B, N, H, D)`` tensor, ``(B, H, D)``: K's centring."""
    return x.mean(dim=1, dtype=torch.float32).contiguous()


def _check_amax(amax: torch.Tensor | None, x: torch.Tensor, what: str) -> None:
    b, _, h, d = x.shape
    if amax is not None and (amax.shape != (b, h, d) or amax.dtype != torch.float32 or not amax.is_contiguous()
                             or amax.device != x.device):
        raise ValueError(f"{what} must be a contiguous FP32 (B, H, D) = {(b, h, d)} tensor on {x.device}, got "
                         f"{amax.dtype} {tuple(amax.shape)} on {amax.device}")


def quantize_operand(x: torch.Tensor, block_rows: int, centre: bool = False, name: str = "x",
                     mean: torch.Tensor | None = None, *, store_mode: int | None = None, layouts: str = "both"):
    """Codes ``(x8, x8t)`` and scales of a public-layout ``(B, N, H, D)`` tensor; ``centre`` subtracts the token mean
    (``mean``, when the caller has it already: ``token_mean(x)``).

    ``name`` is the operand's name in errors (``q``, ``k``, ``v``); ``store_mode`` overrides ``STORE_MODE`` (every
    mode stores the same bits); ``layouts`` (a ``LAYOUTS`` key) the code layouts written, None for one left out."""
    _check_public(x, name)
    b, n, h, d = x.shape
    n_pad = padded_len(n)
    layouts = stored_layouts(layouts)
    x8, x8t = code_buffers(x, layouts)
    scales = torch.empty((b, h, n_pad // block_rows), device=x.device, dtype=torch.float32)
    if centre:
        mean = token_mean(x) if mean is None else mean
        _check_per_channel(x, name, mean, None)
    else:
        mean = scales  # unused
    grid = (n_pad // block_rows, b * h)
    _quant_pass_kernel[grid](
        x, mean, *_code_args(x8, x8t), scales, x.stride(0), x.stride(1), x.stride(2), n, n_pad, h,
        HEAD_DIM=d, BLOCK_ROWS=block_rows, CENTRE=centre, ROUND_FP32=round_fp32_in_kernels(),
        **store_flags(store_mode, layouts), num_warps=_warps(block_rows, d),
    )
    return x8, x8t, scales


def _check_per_channel(x: torch.Tensor, name: str, mean: torch.Tensor | None, row_scales: torch.Tensor | None):
    _check_public(x, name)
    b, n, h, d = x.shape
    if mean is not None and (mean.shape != (b, h, d) or mean.dtype != torch.float32):
        raise ValueError(f"mean must be FP32 (B, H, D) = {(b, h, d)}, got {mean.dtype} {tuple(mean.shape)}")
    if row_scales is not None and (row_scales.shape != (b, h, padded_len(n)) or row_scales.dtype != torch.float32):
        raise ValueError(f"row_scales must be FP32 (B, H, N_pad) = {(b, h, padded_len(n))}, got "
                         f"{row_scales.dtype} {tuple(row_scales.shape)}")


def fragment_token_order(n_pad: int, device=None) -> torch.Tensor:
    """π over N_pad positions (a multiple of 16): the token that position p of a fragment-ordered channel-major code
    tensor holds, ``x8t_fragment[..., p] = x8t[..., π[p]]``. Within each 16-token group position 4q + j holds token
    2q + (j & 1) + 8 (j >> 1): the tokens an FP8 wgmma accumulator row puts in lane q's four bytes of a 16-column half
    ({2q, 2q+1, 8+2q, 9+2q}), at the k positions an A fragment's lane q holds ({4q .. 4q+3}). The CUDA dK/dV kernel's
    B operands (dÔᶜ, Q̂'ᶜ) come in this order, so its P̂ᵀ and dŜᵀ accumulators are A fragments without the two shuffles
    and one byte permute per register that reorder them otherwise (FA3's trick for FP8 V)."""
    if n_pad % 16:
        raise ValueError(f"n_pad = {n_pad}: expected a multiple of 16")
    p = torch.arange(n_pad, device=device)
    return (p & ~15) | (((p >> 2) & 3) << 1) | (p & 1) | (((p >> 1) & 1) << 3)


def quantize_per_channel(x: torch.Tensor, name: str = "x", *, mean: torch.Tensor | None = None,
                         row_scales: torch.Tensor | None = None, store_mode: int | None = None,
                         layouts: str = "both", amax: torch.Tensor | None = None, fragment_order: bool = False):
    """Codes ``(x8, x8t)`` and one scale per channel over every token of each (batch, head), scales ``(B, H, D)``:
    the factored layout's operand of a token-contracting matmul (V̂ for PV, dÔ for dV, K̂ᶜ for dQ, Q̂' for dK;
    kernels/README.md). ``mean`` (B, H, D) FP32 is subtracted first (K's centring, the mean ``quantize_operand`` uses);
    ``row_scales`` (B, H, N_pad) FP32 multiplies each token next (Q' = s ⊙ Q, s the dŜ row scales).

    A scale spans every token, so this is two launches over blocks of rows (``PER_CHANNEL_LAUNCHES``): the first folds
    each block's per-channel max |x| into an FP32 amax by atomic max, the second reads x again and writes codes and
    scales.
    Bit-identical to ``quantize_per_channel_torch``, the PyTorch twin the tests compare against. ``store_mode`` and
    ``layouts`` as ``quantize_operand``'s. ``amax``: the complete per-channel amax of these values (K's from
    ``centring_stats``); the first launch is then skipped (not with ``row_scales``: nothing else forms that amax).
    ``fragment_order`` (``layouts="channel"`` only): the channel-major codes in
    ``fragment_token_order``, the layout the CUDA dK/dV and dQ kernels read (``STORE_UNUSED_SWITCH`` does not add the
    token-major copy to such a pass: its rows would come in that order too)."""
    _check_per_channel(x, name, mean, row_scales)
    _check_amax(amax, x, "amax")
    if fragment_order and layouts != "channel":
        raise ValueError(f"fragment_order: a channel-major layout, so layouts='channel' (got {layouts!r})")
    if amax is not None and row_scales is not None:
        raise ValueError("amax: nothing forms the row-scaled values' amax; pass row_scales without amax")
    b, n, h, d = x.shape
    n_pad = padded_len(n)
    layouts = layouts if fragment_order else stored_layouts(layouts)  # a permuted token-major copy would be garbage
    x8, x8t = code_buffers(x, layouts)
    scales = torch.empty((b, h, d), device=x.device, dtype=torch.float32)
    folded = amax is not None
    if not folded:
        amax = torch.zeros((b, h, d), device=x.device, dtype=torch.float32)
    flags = dict(HEAD_DIM=d, CENTRE=mean is not None, ROW_SCALED=row_scales is not None)
    operands = (x, amax if mean is None else mean.contiguous(),  # amax stands in for an absent operand, never read
                amax if row_scales is None else row_scales.contiguous())
    shape = (x.stride(0), x.stride(1), x.stride(2), n, n_pad, h)
    if not folded:
        rows, warps = _per_channel_launch(d, "amax")
        _per_channel_amax_pass_kernel[(n_pad // rows, b * h)](*operands, amax, *shape, **flags, BLOCK_ROWS=rows,
                                                              num_warps=warps)
    rows, warps = _per_channel_launch(d, "cast")
    _per_channel_quant_pass_kernel[(n_pad // rows, b * h)](
        *operands, amax, *_code_args(x8, x8t), scales, *shape, **flags, BLOCK_ROWS=rows, num_warps=warps,
        ROUND_FP32=round_fp32_in_kernels(), **store_flags(store_mode, layouts), FRAGMENT_ORDER=fragment_order)
    return x8, x8t, scales


STATS_ROWS = 128
"""Rows per program of ``centring_stats``'s partial sums (``BLOCK_Q``: every block of ``N_pad`` holds a valid row)."""
BLOCK_AND_CHANNEL_WARPS = {64: 4, 128: 8, 256: 8}
"""num_warps of ``quantize_block_and_channel`` by head dim (at D = 128, 8 as the per-channel cast's; until timed)."""


def centring_stats(x: torch.Tensor, name: str = "k") -> tuple[torch.Tensor, torch.Tensor]:
    """K's centring from one read: the FP32 token mean ``(B, H, D)`` of a public-layout ``(B, N, H, D)`` ``x`` and the
    per-channel amax of the centred values, max over tokens of |fl(x − mean)|, ``(B, H, D)``: the amax
    ``quantize_per_channel(x, mean=mean)`` forms in a launch of its own, bit for bit (``_column_stats_reduce_kernel``
    says why). Two launches: per-block partial sums, maxima and minima, then their fold in block order, so the mean is
    deterministic; its bits are the fold's, not ``token_mean``'s (torch's reduction order)."""
    _check_public(x, name)
    b, n, h, d = x.shape
    nblk = triton.cdiv(n, STATS_ROWS)
    part = torch.empty((b * h, nblk, 3, d), device=x.device, dtype=torch.float32)
    mean, amax = (torch.empty((b, h, d), device=x.device, dtype=torch.float32) for _ in range(2))
    _column_stats_kernel[(nblk, b * h)](x, part, x.stride(0), x.stride(1), x.stride(2), n, h, nblk,
                                        HEAD_DIM=d, BLOCK_ROWS=STATS_ROWS, num_warps=_warps(STATS_ROWS, d))
    _column_stats_reduce_kernel[(b * h,)](part, mean, amax, n, nblk, HEAD_DIM=d, CHUNK=16, num_warps=4)
    return mean, amax


def quantize_block_and_channel(x: torch.Tensor, block_rows: int, name: str = "x", *, mean: torch.Tensor | None = None,
                               amax: torch.Tensor | None = None, fragment_order: bool = False,
                               store_mode: int | None = None):
    """Both of an operand's factored-layout copies from one read of x: ``(x8, sx, x8t_c, sxc)``, the block-scaled
    token-major codes and scales of ``quantize_operand(x, block_rows, layouts="token", mean=mean)`` and the per-channel
    channel-major codes and scales of ``quantize_per_channel(x, mean=mean, layouts="channel", amax=amax,
    fragment_order=fragment_order)``, bit for bit. ``mean`` (B, H, D) FP32 centres x first (K's); ``amax`` is the
    per-channel amax of the (centred) values (``centring_stats`` forms K's with its mean), else an amax launch of
    ``quantize_per_channel``'s forms it. One program a scale block: ``block_rows`` (64 or 128) rows."""
    _check_per_channel(x, name, mean, None)
    _check_amax(amax, x, "amax")
    if block_rows not in (BLOCK_KV, BLOCK_Q):
        raise ValueError(f"block_rows {block_rows}: expected {BLOCK_KV} (K, V) or {BLOCK_Q} (Q, dO)")
    b, n, h, d = x.shape
    n_pad = padded_len(n)
    x8, x8t = code_buffers(x, "both")
    sx = torch.empty((b, h, n_pad // block_rows), device=x.device, dtype=torch.float32)
    sxc = torch.empty((b, h, d), device=x.device, dtype=torch.float32)
    shape = (x.stride(0), x.stride(1), x.stride(2), n, n_pad, h)
    mean_arg = sxc if mean is None else mean.contiguous()  # sxc stands in for an absent mean, never read
    if amax is None:
        amax = torch.zeros((b, h, d), device=x.device, dtype=torch.float32)
        rows, warps = _per_channel_launch(d, "amax")
        _per_channel_amax_pass_kernel[(n_pad // rows, b * h)](x, mean_arg, mean_arg, amax, *shape, HEAD_DIM=d,
                                                              CENTRE=mean is not None, ROW_SCALED=False,
                                                              BLOCK_ROWS=rows, num_warps=warps)
    _block_and_channel_pass_kernel[(n_pad // block_rows, b * h)](
        x, mean_arg, amax, x8, sx, x8t, sxc, *shape, HEAD_DIM=d, BLOCK_ROWS=block_rows, CENTRE=mean is not None,
        ROUND_FP32=round_fp32_in_kernels(), STORE_MODE=store_flags(store_mode, "channel")["STORE_MODE"],
        FRAGMENT_ORDER=fragment_order, num_warps=BLOCK_AND_CHANNEL_WARPS.get(d, _warps(block_rows, d)))
    return x8, sx, x8t, sxc


def quantize_per_channel_torch(x: torch.Tensor, name: str = "x", *, mean: torch.Tensor | None = None,
                               row_scales: torch.Tensor | None = None, fragment_order: bool = False):
    """``quantize_per_channel`` in PyTorch ops, its reference: an amax over the tokens, then the cast, the rounding
    of ``quant.quantize_tiles(inner, None, 1)`` on the same FP32 ``inner = (x - mean) * row_scales``; with
    ``fragment_order`` the channel-major copy's tokens permuted by ``fragment_token_order``."""
    _check_per_channel(x, name, mean, row_scales)
    b, n, h, d = x.shape
    inner = x.float().transpose(1, 2)  # (B, H, N, D)
    if mean is not None:
        inner = inner - mean[:, :, None, :]
    if row_scales is not None:
        inner = inner * row_scales[:, :, :n, None]
    scales = quant._scales_from_amax(inner.abs().amax(dim=2))  # (B, H, D)
    x8 = torch.zeros((b, h, padded_len(n), d), device=x.device, dtype=torch.float8_e4m3fn)
    x8[:, :, :n] = quant.round_e4m3(inner / scales[:, :, None, :]).to(torch.float8_e4m3fn)
    x8t = x8.transpose(-1, -2)
    if fragment_order:
        x8t = x8t[..., fragment_token_order(x8t.shape[-1], x8t.device)]
    return x8, x8t.contiguous(), scales.contiguous()


DELTA_CODES = {"matched": 0, "stale": 1, "consistent": 2}


def quantize_do_and_delta(do: torch.Tensor, o: torch.Tensor, mode: str, *, store_mode: int | None = None,
                          layouts: str = "both"):
    """dÔ codes, scales and (for ``stale``/``consistent``) δ (B, H, N_pad); δ is left unwritten for the methods whose
    δ is matched's (``matched``, ``matched_factored``: the δ pass forms it). ``store_mode`` and ``layouts`` as
    ``quantize_operand``'s."""
    _check_public(do, "do")
    _check_public(o, "o")
    b, n, h, d = do.shape
    n_pad = padded_len(n)
    layouts = stored_layouts(layouts)
    do8, do8t = code_buffers(do, layouts)
    scales = torch.empty((b, h, n_pad // BLOCK_Q), device=do.device, dtype=torch.float32)
    delta = torch.empty((b, h, n_pad), device=do.device, dtype=torch.float32)
    _quant_do_delta_pass_kernel[(n_pad // BLOCK_Q, b * h)](
        do, o, *_code_args(do8, do8t), scales, delta,
        do.stride(0), do.stride(1), do.stride(2), o.stride(0), o.stride(1), o.stride(2), n, n_pad, h,
        HEAD_DIM=d, BLOCK_ROWS=BLOCK_Q, DELTA=DELTA_CODES[get_method(mode).delta], ROUND_FP32=round_fp32_in_kernels(),
        **store_flags(store_mode, layouts), num_warps=_warps(BLOCK_Q, d),
    )
    return do8, do8t, scales, delta
