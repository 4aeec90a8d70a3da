"""ctypes binding of ``libdm_attn_sm90.so`` (the CUDA C++ kernels, ``kernels/cuda/``) and torch wrappers of its entry
points.

The library is plain ``extern "C"`` with the CUDA runtime linked statically (``cuda_build``), so it loads under any
torch: no torch C++ ABI is involved. Its runtime shares the driver's primary context with torch, so torch's pointers
and streams are valid in it; every call passes the tensor's device and ``torch.cuda.current_stream(device)``, so the
kernels run in order with the caller's torch work.

``load()`` never raises: it returns the library and an empty reason, or ``None`` and why it cannot be used (the file
is missing, it does not load, its ABI version differs, no CUDA GPU, not sm90). Importing this module does nothing.
The wrappers check shapes, dtypes, devices and layout first (``ValueError``), then need the library (``RuntimeError``
with the reason).

Primitives (M1 of kernels/CUDA_BACKWARD.md), on E4M3 codes given as ``torch.float8_e4m3fn`` or ``uint8`` tensors:

- ``wgmma_ss_tile(a [64, 128], b [N, 128])`` → ``a @ b.T`` in FP32 [64, N] by one warpgroup's wgmma, both operands
  from shared memory (N = 64 or 128; ``swizzle=False`` lays them out without the 128-byte swizzle, N = 64 only);
- ``wgmma_rs_tile`` → the same with ``a`` from registers (``from_accumulator=True``: loaded in FP32-accumulator order
  and permuted into the A fragment, as P and dS will be);
- ``quantize_e4m3(x, mul)`` → ``e4m3(x * mul)`` with ``cvt.rn.satfinite`` (saturating at ±448; ``kernels/cuda/quant.cuh``);
- ``dpt_tile(v [64, 128], do [64, 128], s_v, s_do)`` → the swapped dP̂ᵀ tile ``v @ do.T · (s_v · s_do)`` [64, 64].

M2: ``dv_factored(...)``, the factored layout's dV (``kernels/cuda/dv_factored.cu``) on the operands Triton's factored
dV launch reads; D = 128, any GQA group, bf16 or fp16 out; ``variant`` picks one of ``DV_VARIANTS`` (the simple loop, or
the pipelined one with its stage count and where K̂ lives), all meant to give the same bits.

M3a: ``dk_factored(...)``, the factored layout's dK (``kernels/cuda/dk_factored.cu``, the TMA pipeline, unpromoted) on
the operands Triton's factored dK launch reads.

M3 on M6's structure: ``dkdv_factored(...)``, dK and dV in one warp-specialised kernel (``kernels/cuda/dkdv_factored.cu``:
a TMA producer warpgroup and two consumer warpgroups over 128 keys), promoted or not, on the operands of Triton's two
factored launches; each meant to give Triton's bits. ``dq_factored(...)``: dQ on the same structure over 128 queries,
on the operands of Triton's factored dQ launch, also meant to give its bits.
"""

import ctypes
import functools
import math
import os
from pathlib import Path

import torch

from deltamatch.kernels.cuda_build import BUILD_DIR, LIBRARY

ABI_VERSION = 18
"""Must equal ``dm_attn_sm90_abi_version()`` in ``kernels/cuda/primitives.cu``."""
DQ_SYNC_ENV = "DELTAMATCH_KERNEL_DQ_SYNC"
"""Environment variable giving ``dqdkdv_factored``'s ``sync`` where the caller gives none (a control of
tools/device/cuda_dv_bench.py, so that the tests and the autograd path can run one; default ``DQ_SYNC_DEFAULT``)."""
DQ_SYNC_DEFAULT = 11
"""``DqSync::kBareRead``: an add counted once the bulk copy has read its buffer, no fences — FA3's deterministic mode,
whose order rests on the L2 applying two bulk adds into a tile in the order they were issued (tools/device/dq_stress.py
compares the FP32 sums of many launches with sync 0's: kernels/NOTES.md, session 16). 0 (``kWritten``) counts an add
once its writes have completed, the order the PTX memory model guarantees, 2.3% slower a step on the H200 (session
15)."""
DQ_SYNC_MAX = 12
"""The last of ``DqSync`` in kernels/cuda/dkdv_factored.cu (a test reads it there)."""
DQ_SECTION_ENV = "DELTAMATCH_KERNEL_DQ_SECTION_HEADS"
"""A positive integer: the kv heads the ordered dQ-in-dK/dV launch interleaves where the caller passes no
``section_heads`` (a benchmark's control; unset: :func:`ordered_section_heads`)."""
LIBRARY_ENV = "DELTAMATCH_CUDA_LIB"
"""Environment variable naming the library to load (default ``build/cuda/libdm_attn_sm90.so``)."""
TILE_M, TILE_K = 64, 128
TILE_N = (64, 128)
_P, _I, _I64, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
SIGNATURES = {
    "dm_attn_sm90_abi_version": ((), _I),
    "dm_attn_sm90_error_string": ((_I,), ctypes.c_char_p),
    "dm_wgmma_ss_tile": ((_P, _P, _P, _I, _I, _I, _P), _I),
    "dm_wgmma_rs_tile": ((_P, _P, _P, _I, _I, _I, _P), _I),
    "dm_quant_e4m3_launch": ((_P, _P, _I64, _F, _I, _P), _I),
    "dm_dpt_tile": ((_P, _P, _F, _F, _P, _I, _P), _I),
    "dm_dv_factored": ((_P, _I, _I, _I, _P), _I),
    "dm_dv_factored_params_size": ((), _I),
    "dm_dk_factored": ((_P, _I, _P), _I),
    "dm_dk_factored_params_size": ((), _I),
    "dm_dkdv_factored": ((_P, _I, _I, _I, _P), _I),
    "dm_dkdv_factored_d64": ((_P, _I, _I, _I, _P), _I),
    "dm_dkdv_factored_params_size": ((), _I),
    "dm_dq_factored": ((_P, _I, _I, _I, _P), _I),
    "dm_dq_factored_d64": ((_P, _I, _I, _I, _P), _I),
    "dm_dq_factored_params_size": ((), _I),
    "dm_fwd_factored": ((_P, _I, _I, _I, _P), _I),
    "dm_fwd_factored_params_size": ((), _I),
    "dm_fwd_wide": ((_P, _P, _I, _I, _I, _P), _I),
    "dm_fwd_wide_d64": ((_P, _P, _I, _I, _I, _P), _I),
    "dm_delta_factored": ((_P, _I, _I, _P), _I),
    "dm_delta_wide": ((_P, _P, _I, _I, _P), _I),
    "dm_delta_wide_d64": ((_P, _P, _I, _I, _P), _I),
    "dm_delta_factored_params_size": ((), _I),
    "dm_quant_stats": ((_P, _I, _I, _P), _I),
    "dm_quant_stats_d64": ((_P, _I, _I, _P), _I),
    "dm_quant_dual": ((_P, _I, _I, _P), _I),
    "dm_quant_dual_d64": ((_P, _I, _I, _P), _I),
    "dm_quant_channel_scaled": ((_P, _I, _P, _I, _P), _I),
    "dm_quant_channel_scaled_d64": ((_P, _I, _P, _I, _P), _I),
    "dm_quant_params_size": ((), _I),
}
DV_HEAD_DIM = 128
"""The head dim the factored dV kernel is built for."""
DV_VARIANTS = ("simple", "pipe3_ss", "pipe3_rs", "pipe5_rs", "tma3", "tma4", "tma3x3")
"""The factored dV's loop structures, in ``dm_dv_factored``'s numbering (``kernels/cuda/dv_factored.cu``): ``simple``
waits for each tile's Sᵀ, softmax and dV in turn; ``pipeN_ss`` / ``pipeN_rs`` issue Sᵀ of the next tile with dV of this
one and run the softmax beside dV, with N cp.async stages and K̂ in shared memory (``ss``) or in registers (``rs``);
``tmaN`` is ``pipeN_rs`` with its loads issued by one thread through the TMA and counted on shared-memory barriers;
``tma3x3`` is ``tma3`` compiled for three CTAs per SM (at most 168 registers), unpromoted only."""
DV_UNPROMOTED_ONLY = ("tma3x3",)
DKDV_VARIANTS = ("ws3", "ws4", "ws3s", "ws3x", "ws3xp", "ws3xf", "ws3xfs", "ws3xfd", "ws3xfdp", "ws3xfdt")
"""The fused dK/dV's forms, in ``dm_dkdv_factored``'s numbering (``kernels/cuda/dkdv_factored.cu``): a producer
warpgroup fills a ring of 3 or 4 stages of query-tile operands that two consumer warpgroups (64 keys each) share.
Promoted, a consumer runs each tile in turn; unpromoted, ``wsN`` issues the next tile's Sᵀ and dP̂ᵀ with this tile's dV
and dK, and ``ws3s`` (unpromoted only) runs each tile in turn. ``ws3x`` (with dQ only) is ``ws3`` with dQ's dŜ tile
written by lane exchange, a 32-bit word a store (``to_fragments_exchanged``: 61 instructions fewer a thread and tile in
the SASS, 8 STS.32 where ``ws3`` takes 32 STS.U8); the same bytes in the same places, so ``ws3``'s bits. ``ws3xp``
(with dQ, ordered, only) is ``ws3x`` persistent: one CTA an SM takes key blocks in the ordered launch's order from a
counter and loads the next block's K̂ and V̂ while the last one's dK and dV are stored; ``ws3x``'s ordered bits, 2%
slower on the H200 (kernels/NOTES.md, session 27; ``$DELTAMATCH_DKDV_PERSISTENT_CTAS`` runs it on fewer CTAs than
SMs, a benchmark's control). ``ws3xf`` (with dQ only) is ``ws3x`` with 448 folded into the row terms
(:data:`DKDV_FOLDED`): one multiply an element fewer, its bits within a few ulps of ``ws3x``'s, not equal. ``ws3xfs`` is
``ws3xf`` with its promotion through a 32-register temporary (each of dV's and dK's products in two 64-channel halves,
four waits a tile where ``ws3xf`` has two), and ``ws3xfd`` that with dQ's product taken out of the consumers into a
fourth warpgroup (the consumers at 208 registers, it at 72: ``dkdv_factored.cu`` ``dq_group``), so each consumer's
chain a tile ends with dK's product; ``ws3xfdp`` is ``ws3xfd`` with the promotion in 32-channel quarters through two
16-register temporaries, the next quarter's product in flight while the last is added. All three give ``ws3xf``'s
bits (each element the same k-steps' sums; kernels/NOTES.md, session 32). ``ws3xfdt`` is ``ws3xfd`` with its epilogue
through shared memory: each consumer stages dV, then dK in its freed K̂ and V̂ buffers (``stmatrix``, TMA's 128-byte
swizzle) and one thread writes them by tensor stores, the same bits."""
DKDV_UNPROMOTED_ONLY = ("ws3s",)
DKDV_WITH_DQ = ("ws3", "ws3x", "ws3xp", "ws3xf", "ws3xfs", "ws3xfd", "ws3xfdp", "ws3xfdt")
"""The forms ``dqdkdv_factored`` (dQ in the same launch, promoted) is built in."""
DKDV_D64_VARIANTS = ("ws3", "ws4")
"""The fused dK/dV's forms built at D = 64 (``dm_dkdv_factored_d64``, without dQ), promoted or not: rows of 64 codes,
dV and dK by m64n64k32 into 32 accumulators a thread, Triton's bits (session 42: ws3 promoted 2.188 ms against Triton's
fused launch's 4.037 at B·H = 64, N = 8K, causal, on an H200; ``triton_bwd.CUDA_DKDV64_SWITCH``)."""
DKDV_D64_WITH_DQ = ("ws3xfd", "ws3xfdt")
"""The fused dK/dV's forms built at D = 64 with dQ (``dqdkdv_factored``, promoted, its adds ordered or in any order):
``ws3xfd``'s dQ warpgroup, 448 folded into the row terms and dQ's dŜ tile by lane exchange, its promotion whole (at
D = 64 it takes the 32 registers ``ws3xfd`` splits D = 128's into) and dK, dV stored directly (session 43);
``ws3xfdt`` that with dK and dV through each consumer's freed K̂ and V̂ buffers (4 KB each at D = 64: two 32-row boxes
of the 64 channels in the 128-byte swizzle) and tensor stores, as at D = 128 (session 44), the same bits."""
DKDV_DQ_ONLY = ("ws3x", "ws3xp", "ws3xf", "ws3xfs", "ws3xfd", "ws3xfdp", "ws3xfdt")
"""The forms built with dQ only (``dkdv_factored`` refuses them)."""
DKDV_ORDERED_ONLY = ("ws3xp",)
"""The forms built with their dQ adds ordered only (``dqdkdv_factored(..., ordered=False)`` refuses them)."""
DKDV_FOLDED = ("ws3xf", "ws3xfs", "ws3xfd", "ws3xfdp", "ws3xfdt")
"""The forms that take 448 (E4M3's largest value, P̂ᵀ's fixed scale) folded into their row terms: the launch passes
lse2 − log2(448) for lse2 and div.full(1, s) / 448 for the inverses, so the kernel's exponential gives P · 448 itself
(``factored.cuh`` ``ds_tile``'s FOLDED: P̂ᵀ without its multiply; dŜ = (P · 448)(dP − δ) · (1/s) / 448). P then differs
from the δ pass's by the rounding of lse2 − log2(448) and ex2.approx's error (a few ulps), so Σ_j dS_ij stays zero up to
FP32 round-off."""
DELTA_VARIANTS = ("ws4", "ws4p", "ws4x2")
"""Matched's δ pass's forms, in ``dm_delta_factored``'s numbering (``kernels/cuda/delta_factored.cu``): ``ws4`` forms each
key tile's S and dP̂ in turn, ``ws4p`` issues the next tile's before this tile's arithmetic, ``ws4x2`` is ``ws4`` at two
CTAs per SM (consumers at 104 registers), the default: 1.62 ms at the reference shape against ``ws4p``'s 1.80 (H200,
session 11), still above Triton's 1.49, so the δ pass runs in CUDA only under ``DELTAMATCH_KERNEL_CUDA=1``."""
DELTA_WIDE_VARIANTS = ("w4", "w4p", "w4t", "w4po", "w4pd", "w4pe8", "w4pe4", "w4pe2", "w4pm", "w4pme8", "w4pme4")
"""The δ pass over 128-key tiles (``dm_delta_wide``, ``kernels/cuda/delta_wide.cu``; six instructions an element where
Triton's pass takes eleven): ``w4`` issues a tile's S and dÔ V̂ᵀ together and forms P while dÔ V̂ᵀ runs, ``w4p`` also
issues the next tile's S before this tile's arithmetic, ``w4t`` is ``w4`` with the two consumers taking turns to issue
(FlashAttention-3's ping-pong), ``w4po`` is ``w4p`` with the second consumer started once the first has formed its
first tile's P (half a tile behind, no per-tile turns), ``w4pd`` is ``w4p`` persistent: one CTA an SM taking query
tiles in the launch's order from a counter, the next tile's Q̂, dÔ and first key tiles loaded while the last one's
terms are finished. The five give the same bits. On the H200 (CUPTI) at the reference shape ``w4p`` 1.217 ms, ``w4t``
1.383 (session 21), ``w4po`` 1.363 against 1.223; ``w4pd`` 1.171 against 1.186 at 8K but the step's quick bench at 4K
413 → 373 TFLOP/s (session 26), so ``w4p`` stays the default; the tile's halves in turn (1.305) and a third consumer
warpgroup (``w6``, 1.30 in session 23) went: kernels/NOTES.md. ``w4pe8``, ``w4pe4``, ``w4pe2`` are ``w4p`` with every
8th, 4th or 2nd 8-key chunk's exponentials emulated on the FMA pipe (:data:`EXP_EMULATED`): P within a few FP32 ulps of
the others' (a degree-5 polynomial), so δ within FP32 round-off of theirs but not their bits. ``w4pm``, ``w4pme8``,
``w4pme4`` are ``w4p``, ``w4pe8``, ``w4pe4`` with max P bounded from the forward's row maxima
(:data:`DELTA_ROW_MAX`)."""

DELTA_WIDE_D64_VARIANTS = ("w4p", "w4pe8", "w4pe4", "w4pe2", "w4pm", "w4pme8", "w4pme4")
"""The δ pass over 128-key tiles built at D = 64 (``dm_delta_wide_d64``): ``w4p`` over rows of 64 codes, the same
arithmetic an element as at D = 128, and its forms that emulate a share of the exponentials (:data:`EXP_EMULATED`) or
read the forward's row maxima (:data:`DELTA_ROW_MAX`). On an H100 (session 42, CUPTI at B 4, H 16, N = 8K, two
rounds) ``w4p`` 1.036 ms a step against Triton's 1.064, ``w4pm`` 0.951 (the default, as at D = 128), ``w4pme8``
0.944, ``w4pme4`` 1.004, ``w4pe2`` 1.236: at D = 64 a tile's wgmmas take half their D = 128 time, and what is left
is the exponentials and the row arithmetic around them."""
DELTA_WIDE_BUILT = {DV_HEAD_DIM: DELTA_WIDE_VARIANTS, 64: DELTA_WIDE_D64_VARIANTS}
"""The δ pass's variants over 128-key tiles built at each head dim."""
DEFAULT_HEAD_DIMS = (DV_HEAD_DIM, 64)
"""Where a kernel that ``triton_fwd.cuda_variant`` picks runs unasked: the head dims whose builds are timed
(D = 64 since session 42: the step 8.343 → 8.018 ms on an H100, CUPTI at B 4, H 16, N = 8K); elsewhere only where its
switch names a variant."""
DELTA_ROW_MAX = {"w4pm": "w4p", "w4pme8": "w4pe8", "w4pme4": "w4pe4"}
"""The δ pass's variants that bound each row's max_j P_ij from the forward's row max (``fwd_wide``'s ``row_max``,
``factored.cuh`` ``p_max_bound``) instead of taking it over the elements: 64 FMNMX a thread and tile fewer, of ≈ 500 in
``w4p``'s loop (kernels/NOTES.md, session 29). δ is the bits of the form without it; s = (|δ| max P + max P|dP̂|) / 448
stays a bound, larger by ≈ 2^-20 (|m| + |y| + 16) relative (m the row max, y the log2 of max P: a few parts in 10⁵
where logits reach the hundreds), so dŜ's codes may differ from the other forms' where an element lies at an E4M3
rounding boundary. Each maps to its form without the row max, which the backward runs by default after a forward that
wrote none (Triton's, or one without a backward to follow)."""

EXP_EMULATED = ("w4pe8", "w4pe4", "w4pe2")
"""The variants of the forward and the δ pass over 128-key tiles that take a share of their exponentials (every 8th,
4th or 2nd 8-key chunk of a tile) by a polynomial on the FMA pipe (``factored.cuh`` ``ex2_poly``, FlashAttention-4's
emulation) while the rest take MUFU: at D = 128 a tile's 64 MUFU a thread take as long as its FP8 wgmmas (16 results a
cycle an SM), and the two take turns (kernels/NOTES.md). Each gives its own bits."""
DQ_VARIANTS = ("ws3",)
"""The dQ's forms, in ``dm_dq_factored``'s numbering (``kernels/cuda/dq_factored.cu``): ``ws3`` runs each key tile in
turn. (FA3's ping-pong, ``ws3pp`` and the forward's ``ws4pp``, gained nothing on the H200 and went: kernels/NOTES.md.)"""
FWD_VARIANTS = ("ws4", "ws4p")
"""The factored forward's forms, in ``dm_fwd_factored``'s numbering (``kernels/cuda/fwd_factored.cu``): a producer
warpgroup fills a ring of 4 stages of key tiles that two consumer warpgroups (64 queries each) share; ``ws4`` runs each
tile in turn, ``ws4p`` issues the next tile's S before this tile's P̂ V̂ᶜ and runs the next softmax beside it."""

FWD_WIDE_VARIANTS = ("w4", "w4p", "w4pp", "w4po", "w4pe8", "w4pe4", "w4pe2")
"""The factored forward over 128-key tiles (``dm_fwd_wide``, ``kernels/cuda/fwd_wide.cu``): ``fwd_factored``'s
warpgroups and ring, FlashAttention-3's FP8 tile width; ``w4`` runs each tile in turn, ``w4p`` issues the next tile's S
before this tile's P̂ V̂ᶜ and runs the next softmax beside it, ``w4pp`` is ``w4p`` with the two consumers taking turns
to issue their products (FlashAttention-3's ping-pong), ``w4po`` is ``w4p`` with the second consumer started once the
first has formed its first tile's P (2% slower than ``w4p`` on the H200, session 26). Not Triton's bits; the four give
the same bits. ``w4pe8``, ``w4pe4``, ``w4pe2`` are ``w4p`` with a share of the exponentials emulated
(:data:`EXP_EMULATED`; a degree-3 polynomial, relative error 7.5e-5, where P becomes E4M3): each its own bits.
(``w4pt``, O through shared memory and tensor stores as the dK/dV's ``ws3xfdt`` stores dK and dV, gave ``w4p``'s bits
and was 2.1% slower: removed, its code in 65bf4d2; kernels/NOTES.md, session 35.)"""
FWD_WIDE_D64_VARIANTS = ("w4p", "w4pe8", "w4pe4", "w4pe2")
"""The forward over 128-key tiles built at D = 64 (``dm_fwd_wide_d64``): ``w4p``, promoted or not, over rows of 64
codes, and its forms that emulate a share of the exponentials (:data:`EXP_EMULATED`). On an H100 (session 42, CUPTI
at B 4, H 16, N = 8K) ``w4p`` took 1.102–1.107 ms a step against Triton's 64-key forward's 1.324–1.328; the emulating
forms 1.185–1.278, slower (the default stays ``w4p``)."""
FWD_WIDE_BUILT = {DV_HEAD_DIM: FWD_WIDE_VARIANTS, 64: FWD_WIDE_D64_VARIANTS}
"""The forward's variants over 128-key tiles built at each head dim."""


class DvFactoredParams(ctypes.Structure):
    """``DvFactoredParams`` of ``kernels/cuda/dv_factored.cuh``, field for field."""

    _fields_ = [("q8", _P), ("k8", _P), ("do8t", _P), ("sq", _P), ("sk", _P), ("sdoc", _P), ("lse2", _P), ("dv", _P),
                ("stride_b", _I64), ("stride_n", _I64), ("stride_h", _I64),
                ("b", _I), ("h", _I), ("h_kv", _I), ("n", _I), ("n_pad", _I), ("qk_scale", _F),
                ("causal", _I), ("out_fp16", _I)]


class DkFactoredParams(ctypes.Structure):
    """``DkFactoredParams`` of ``kernels/cuda/dk_factored.cuh``, field for field."""

    _fields_ = [*((name, _P) for name in ("q8", "k8", "v8", "do8", "q8t", "sq", "sk", "sv", "sdo", "sqc", "rs", "lse2",
                                          "delta", "dk")),
                ("stride_b", _I64), ("stride_n", _I64), ("stride_h", _I64),
                ("b", _I), ("h", _I), ("h_kv", _I), ("n", _I), ("n_pad", _I), ("qk_scale", _F), ("softmax_scale", _F),
                ("causal", _I), ("out_fp16", _I)]


class DkdvFactoredParams(ctypes.Structure):
    """``DkdvFactoredParams`` of ``kernels/cuda/dkdv_factored.cuh``, field for field."""

    _fields_ = [*((name, _P) for name in ("q8", "k8", "v8", "do8", "q8t", "do8t", "sq", "sk", "sv", "sdo", "sqc", "sdoc",
                                          "rs", "irs", "lse2", "delta", "dk", "dv")),
                ("stride_b", _I64), ("stride_n", _I64), ("stride_h", _I64),
                ("b", _I), ("h", _I), ("h_kv", _I), ("n", _I), ("n_pad", _I), ("qk_scale", _F), ("softmax_scale", _F),
                ("causal", _I), ("out_fp16", _I),
                *((name, _P) for name in ("k8t", "skc", "dq_acc", "dq")),
                ("dq_stride_b", _I64), ("dq_stride_n", _I64), ("dq_stride_h", _I64),
                ("dq_sem", _P), ("dq_section_heads", _I), ("dq_sync", _I)]


class DqFactoredParams(ctypes.Structure):
    """``DqFactoredParams`` of ``kernels/cuda/dq_factored.cuh``, field for field."""

    _fields_ = [*((name, _P) for name in ("q8", "k8", "v8", "do8", "k8t", "sq", "sk", "sv", "sdo", "skc", "rs", "lse2",
                                          "delta", "dq")),
                ("stride_b", _I64), ("stride_n", _I64), ("stride_h", _I64),
                ("b", _I), ("h", _I), ("h_kv", _I), ("n", _I), ("n_pad", _I), ("qk_scale", _F), ("softmax_scale", _F),
                ("causal", _I), ("out_fp16", _I)]


class FwdFactoredParams(ctypes.Structure):
    """``FwdFactoredParams`` of ``kernels/cuda/fwd_factored.cuh``, field for field."""

    _fields_ = [*((name, _P) for name in ("q8", "k8", "v8t", "sq", "sk", "svc", "lse2", "o")),
                ("stride_b", _I64), ("stride_n", _I64), ("stride_h", _I64),
                ("b", _I), ("h", _I), ("h_kv", _I), ("n", _I), ("n_pad", _I), ("qk_scale", _F),
                ("causal", _I), ("out_fp16", _I)]


class DeltaFactoredParams(ctypes.Structure):
    """``DeltaFactoredParams`` of ``kernels/cuda/delta_factored.cuh``, field for field."""

    _fields_ = [*((name, _P) for name in ("q8", "k8", "v8", "do8", "sq", "sk", "sv", "sdo", "lse2", "delta", "rs",
                                          "irs")),
                ("b", _I), ("h", _I), ("h_kv", _I), ("n", _I), ("n_pad", _I), ("qk_scale", _F), ("causal", _I)]


class QuantParams(ctypes.Structure):
    """``dm::quant_passes::Params`` of ``kernels/cuda/quant_passes.cu``, field for field."""

    _fields_ = [("x", _P), ("stride_b", _I64), ("stride_n", _I64), ("stride_h", _I64),
                *((name, _I) for name in ("b", "h", "n", "n_pad", "n_blocks", "block_rows", "centre", "fragment_order",
                                          "in_fp16")),
                *((name, _P) for name in ("part", "tickets", "mean", "scale_c", "x8", "sx", "x8t"))]


def library_path() -> Path:
    return Path(os.environ.get(LIBRARY_ENV) or BUILD_DIR / LIBRARY)


@functools.cache
def _open(path: str) -> tuple[ctypes.CDLL | None, str]:
    if not os.path.exists(path):
        return None, f"{path} is missing: build it with dm-cuda-build (needs nvcc 13)"
    try:
        lib = ctypes.CDLL(path)
        for name, (args, result) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, result
    except (OSError, AttributeError) as err:
        return None, f"cannot load {path}: {err}"
    if (found := lib.dm_attn_sm90_abi_version()) != ABI_VERSION:
        return None, f"{path} has ABI version {found}, this code needs {ABI_VERSION}: rebuild it (dm-cuda-build)"
    for name, mirror in (("dm_dv_factored_params_size", DvFactoredParams),
                         ("dm_dk_factored_params_size", DkFactoredParams),
                         ("dm_dkdv_factored_params_size", DkdvFactoredParams),
                         ("dm_dq_factored_params_size", DqFactoredParams),
                         ("dm_fwd_factored_params_size", FwdFactoredParams),
                         ("dm_delta_factored_params_size", DeltaFactoredParams),
                         ("dm_quant_params_size", QuantParams)):
        if (size := getattr(lib, name)()) != ctypes.sizeof(mirror):
            return None, f"{path}: {mirror.__name__} is {size} bytes there, {ctypes.sizeof(mirror)} here"
    return lib, ""


_DEFAULT_PATH = str(BUILD_DIR / LIBRARY)


@functools.cache
def _capability_reason(device: int) -> str:
    if (cap := torch.cuda.get_device_capability(device)) != (9, 0):
        return f"the kernels are built for sm_90a only; this GPU is sm_{cap[0]}{cap[1]}"
    return ""


def load(path: str | os.PathLike | None = None) -> tuple[ctypes.CDLL | None, str]:
    """The library and ``""``, or ``None`` and the reason it cannot run here. Never raises. Called several times a
    step (the dispatch asks it), so the opened library and each device's verdict are cached: no ``Path`` is built
    and no device property read after the first call (session 18's host profile: 0.1 ms a call before)."""
    lib, reason = _open(str(path) if path else os.environ.get(LIBRARY_ENV) or _DEFAULT_PATH)
    if reason:
        return None, reason
    if not torch.cuda.is_available():
        return None, "no CUDA GPU (torch.cuda.is_available() is False)"
    if reason := _capability_reason(torch.cuda.current_device()):
        return None, reason
    return lib, ""


def _library() -> ctypes.CDLL:
    lib, reason = load()
    if lib is None:
        raise RuntimeError(f"the CUDA kernels cannot run: {reason}")
    return lib


def _call(lib: ctypes.CDLL, name: str, *args) -> None:
    if err := getattr(lib, name)(*args):
        raise RuntimeError(f"{name}: CUDA error {err} ({lib.dm_attn_sm90_error_string(err).decode()})")


def _codes(name: str, t: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """``t`` as uint8 codes after checking it is an E4M3 tensor on a CUDA device, contiguous and 16-byte aligned."""
    if t.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise ValueError(f"{name}: dtype {t.dtype}, expected torch.float8_e4m3fn or uint8 E4M3 codes")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {shape}")
    if t.device.type != "cuda":
        raise ValueError(f"{name}: on {t.device}, expected a CUDA tensor")
    if not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(f"{name}: must be contiguous and 16-byte aligned")
    return t.view(torch.uint8)


def _tile_operands(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if b.dim() != 2 or b.shape[0] not in TILE_N:
        raise ValueError(f"b: shape {tuple(b.shape)}, expected (N, {TILE_K}) with N in {TILE_N}")
    a8, b8 = _codes("a", a, (TILE_M, TILE_K)), _codes("b", b, (b.shape[0], TILE_K))
    if a.device != b.device:
        raise ValueError(f"a on {a.device} and b on {b.device}: expected one device")
    return a8, b8, torch.empty(TILE_M, b.shape[0], dtype=torch.float32, device=a.device)


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
"""The current stream's ``cudaStream_t`` of a device index, without a ``torch.cuda.Stream`` object (what Triton's
launcher reads; CUDA builds of torch only), where ``torch.cuda.current_stream`` builds a ``Stream`` object for each of
a step's eleven launches (0.2 ms a step under cProfile at 2K, session 39)."""


def _launch_args(t: torch.Tensor) -> tuple[int, int]:
    """The device index and the current stream's handle that a launch of ``t``'s kernels takes."""
    index = t.device.index
    if _RAW_STREAM is None:
        return index, torch.cuda.current_stream(t.device).cuda_stream
    return index, _RAW_STREAM(index)


def wgmma_ss_tile(a: torch.Tensor, b: torch.Tensor, swizzle: bool = True) -> torch.Tensor:
    """``a [64, 128] @ b [N, 128]ᵀ`` in FP32 by FP8 wgmma with both operands in shared memory."""
    a8, b8, c = _tile_operands(a, b)
    if not swizzle and b.shape[0] != 64:
        raise ValueError("swizzle=False is built for N = 64 only")
    _call(_library(), "dm_wgmma_ss_tile", a8.data_ptr(), b8.data_ptr(), c.data_ptr(), b.shape[0], int(swizzle),
          *_launch_args(c))
    return c


def wgmma_rs_tile(a: torch.Tensor, b: torch.Tensor, from_accumulator: bool = False) -> torch.Tensor:
    """``a [64, 128] @ b [N, 128]ᵀ`` in FP32 by FP8 wgmma with ``a`` in registers (``from_accumulator``: permuted from
    the accumulator's register order)."""
    a8, b8, c = _tile_operands(a, b)
    _call(_library(), "dm_wgmma_rs_tile", a8.data_ptr(), b8.data_ptr(), c.data_ptr(), b.shape[0],
          int(from_accumulator), *_launch_args(c))
    return c


def quantize_e4m3(x: torch.Tensor, mul: float = 1.0) -> torch.Tensor:
    """``e4m3(x · mul)`` (RNE, saturating to ±448, NaN stays NaN) as a ``torch.float8_e4m3fn`` tensor of x's shape."""
    if x.dtype != torch.float32:
        raise ValueError(f"x: dtype {x.dtype}, expected torch.float32")
    if x.device.type != "cuda" or not x.is_contiguous():
        raise ValueError(f"x: on {x.device}, contiguous {x.is_contiguous()}: expected a contiguous CUDA tensor")
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    _call(_library(), "dm_quant_e4m3_launch", x.data_ptr(), codes.data_ptr(), x.numel(), float(mul),
          *_launch_args(x))
    return codes.view(torch.float8_e4m3fn)


def dpt_tile(v: torch.Tensor, do: torch.Tensor, s_v: float, s_do: float) -> torch.Tensor:
    """The swapped dP̂ᵀ tile: ``v [64, 128] @ do [64, 128]ᵀ · (s_v · s_do)`` in FP32 [64 keys, 64 queries], V̂ rows as
    wgmma's A operand (SS), the scale product rounded to FP32 first as Triton's kernels do."""
    v8, do8, out = _tile_operands(v, do)
    if do.shape[0] != 64:
        raise ValueError(f"do: shape {tuple(do.shape)}, expected (64, {TILE_K})")
    _call(_library(), "dm_dpt_tile", v8.data_ptr(), do8.data_ptr(), float(s_v), float(s_do), out.data_ptr(),
          *_launch_args(out))
    return out


def _fp32(name: str, t: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    if t.dtype != torch.float32 or tuple(t.shape) != shape:
        raise ValueError(f"{name}: {t.dtype} {tuple(t.shape)}, expected torch.float32 {shape}")
    if t.device != device or not t.is_contiguous():
        raise ValueError(f"{name}: must be a contiguous tensor on {device}")
    return t


def _operand_pointers(codes: list[tuple], scales: list[tuple]) -> list[int]:
    """The data pointers of ``codes`` then ``scales``, each given as ``(name, tensor, shape)``, after checking them:
    the codes as ``_codes`` does, all on the first one's device, the scales FP32 there (``_fp32``)."""
    checked = [_codes(name, t, shape) for name, t, shape in codes]
    device = codes[0][1].device
    if elsewhere := [f"{name} on {t.device}" for name, t, _ in codes[1:] if t.device != device]:
        raise ValueError(f"{codes[0][0]} on {device}, {', '.join(elsewhere)}: expected one device")
    return [t.data_ptr() for t in checked + [_fp32(name, t, shape, device) for name, t, shape in scales]]


def _attention_shape(q8: torch.Tensor, k8: torch.Tensor, n: int, dtype: torch.dtype | None,
                     what: str, head_dims: tuple[int, ...] = (DV_HEAD_DIM,)) -> tuple[int, int, int, int, int]:
    """``(B, H, H_kv, N_pad, D)`` of Q̂ and K̂ codes, after checking them (D one of ``head_dims``), ``n`` and the
    output dtype (None: a kernel whose outputs are FP32)."""
    if q8.dim() != 4 or k8.dim() != 4:
        raise ValueError(f"q8 {tuple(q8.shape)}, k8 {tuple(k8.shape)}: expected (B, H, N_pad, D) codes")
    b, h, n_pad, d = q8.shape
    h_kv = k8.shape[1]
    if d not in head_dims:
        built = " and ".join(f"D = {x}" for x in head_dims)
        raise ValueError(f"head dim {d}: the CUDA {what} kernel is built for {built} only")
    if not 0 < n <= n_pad or n_pad % 128:
        raise ValueError(f"n = {n} with N_pad = {n_pad}: expected 0 < n <= N_pad, N_pad a multiple of 128")
    if h_kv < 1 or h % h_kv:
        raise ValueError(f"{h} query heads are not a multiple of {h_kv} kv heads")
    if dtype is not None and dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"dtype {dtype}: expected torch.bfloat16 or torch.float16")
    return b, h, h_kv, n_pad, d


def dv_factored(q8: torch.Tensor, k8: torch.Tensor, do8t: torch.Tensor, sq: torch.Tensor, sk: torch.Tensor,
                sdoc: torch.Tensor, lse2: torch.Tensor, n: int, causal: bool, qk_scale: float,
                dtype: torch.dtype = torch.bfloat16, promote: bool = True, variant: str = "simple") -> torch.Tensor:
    """dV (B, N, H_kv, D) of ``matched_factored`` (kernels/README.md, "A factored scale layout") from the operands of
    Triton's factored dV launch: ``q8`` (B, H, N_pad, D) and ``k8`` (B, H_kv, N_pad, D) codes with scales ``sq``
    (B, H, N_pad / 128) and ``sk`` (B, H_kv, N_pad / 64); ``do8t`` the per-channel dÔᶜ codes token-major
    (B, H, D, N_pad) with scales ``sdoc`` (B, H, D); ``lse2`` (B, H, N_pad); ``qk_scale`` = softmax_scale · log2(e).
    ``promote`` (Triton's default, ``ACC_PROMOTE=64``): each 64-query tile's product is added into dV in FP32;
    otherwise the wgmma accumulates all of them. ``variant``: one of ``DV_VARIANTS``."""
    if variant not in DV_VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {DV_VARIANTS}")
    if promote and variant in DV_UNPROMOTED_ONLY:
        raise ValueError(f"variant {variant!r} is built unpromoted only: pass promote=False")
    b, h, h_kv, n_pad, d = _attention_shape(q8, k8, n, dtype, "dV")
    pointers = _operand_pointers(
        [("q8", q8, (b, h, n_pad, d)), ("k8", k8, (b, h_kv, n_pad, d)), ("do8t", do8t, (b, h, d, n_pad))],
        [("sq", sq, (b, h, n_pad // 128)), ("sk", sk, (b, h_kv, n_pad // 64)), ("sdoc", sdoc, (b, h, d)),
         ("lse2", lse2, (b, h, n_pad))])
    device = q8.device
    dv = torch.empty((b, n, h_kv, d), dtype=dtype, device=device)
    params = DvFactoredParams(*pointers, dv.data_ptr(), dv.stride(0), dv.stride(1), dv.stride(2), b, h, h_kv, n, n_pad,
                              float(qk_scale), int(causal), int(dtype == torch.float16))
    _call(_library(), "dm_dv_factored", ctypes.byref(params), int(promote), DV_VARIANTS.index(variant),
          *_launch_args(dv))
    return dv


def dk_factored(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, do8: torch.Tensor, q8t: torch.Tensor,
                sq: torch.Tensor, sk: torch.Tensor, sv: torch.Tensor, sdo: torch.Tensor, sqc: torch.Tensor,
                rs: torch.Tensor, lse2: torch.Tensor, delta: torch.Tensor, n: int, causal: bool, qk_scale: float,
                softmax_scale: float, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """dK (B, N, H_kv, D) of ``matched_factored`` from the operands of Triton's factored dK launch, accumulated without
    per-tile promotion (Triton's ``ACC_PROMOTE=None``; ``kernels/cuda/dk_factored.cu``): ``q8`` (B, H, N_pad, D),
    ``k8`` and ``v8`` (B, H_kv, N_pad, D) codes with scales ``sq`` (B, H, N_pad / 128), ``sk`` and ``sv``
    (B, H_kv, N_pad / 64); ``do8`` the token-major dÔ codes (B, H, N_pad, D) with ``sdo`` (B, H, N_pad / 128);
    ``q8t`` Q' = s ⊙ Q per channel, channel-major (B, H, D, N_pad), with ``sqc`` (B, H, D); ``rs`` dŜ's row scales s,
    ``lse2`` and matched's ``delta``, each (B, H, N_pad)."""
    b, h, h_kv, n_pad, d = _attention_shape(q8, k8, n, dtype, "dK")
    pointers = _operand_pointers(
        [("q8", q8, (b, h, n_pad, d)), ("k8", k8, (b, h_kv, n_pad, d)), ("v8", v8, (b, h_kv, n_pad, d)),
         ("do8", do8, (b, h, n_pad, d)), ("q8t", q8t, (b, h, d, n_pad))],
        [("sq", sq, (b, h, n_pad // 128)), ("sk", sk, (b, h_kv, n_pad // 64)), ("sv", sv, (b, h_kv, n_pad // 64)),
         ("sdo", sdo, (b, h, n_pad // 128)), ("sqc", sqc, (b, h, d)), ("rs", rs, (b, h, n_pad)),
         ("lse2", lse2, (b, h, n_pad)), ("delta", delta, (b, h, n_pad))])
    device = q8.device
    dk = torch.empty((b, n, h_kv, d), dtype=dtype, device=device)
    params = DkFactoredParams(*pointers, dk.data_ptr(), dk.stride(0), dk.stride(1),
                              dk.stride(2), b, h, h_kv, n, n_pad, float(qk_scale), float(softmax_scale), int(causal),
                              int(dtype == torch.float16))
    _call(_library(), "dm_dk_factored", ctypes.byref(params), *_launch_args(dk))
    return dk


def dkdv_factored(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, do8: torch.Tensor, q8t: torch.Tensor,
                  do8t: torch.Tensor, sq: torch.Tensor, sk: torch.Tensor, sv: torch.Tensor, sdo: torch.Tensor,
                  sqc: torch.Tensor, sdoc: torch.Tensor, rs: torch.Tensor, lse2: torch.Tensor, delta: torch.Tensor,
                  n: int, causal: bool, qk_scale: float, softmax_scale: float, dtype: torch.dtype = torch.bfloat16,
                  promote: bool = True, variant: str = "ws3",
                  irs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dK, dV), each (B, N, H_kv, D), of ``matched_factored`` in one kernel, from the operands of Triton's factored dK
    and dV launches: the codes and scales of ``dk_factored`` plus ``do8t``, dÔ per channel, channel-major
    (B, H, D, N_pad), with ``sdoc`` (B, H, D). ``q8t`` and ``do8t`` in ``triton_quant.fragment_token_order``
    (``quantize_per_channel(..., fragment_order=True)``): the kernel's A fragments take that order. ``promote``
    (Triton's default, ``ACC_PROMOTE=64``): each 64-query tile's products are added into dK and dV in FP32; otherwise
    the wgmma accumulates all of them. ``variant``: one of ``DKDV_VARIANTS`` (at D = 64 one of
    :data:`DKDV_D64_VARIANTS`). ``irs``: div.full(1, s) of ``rs``, as the δ pass writes it (``row_scale_inverses`` forms
    it when None: one more small launch)."""
    _, dk, dv = _dkdv(q8, k8, v8, do8, q8t, do8t, sq, sk, sv, sdo, sqc, sdoc, rs, lse2, delta, n, causal, qk_scale,
                      softmax_scale, dtype, promote, variant, irs=irs)
    return dk, dv


def dqdkdv_factored(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, do8: torch.Tensor, q8t: torch.Tensor,
                    do8t: torch.Tensor, k8t: torch.Tensor, sq: torch.Tensor, sk: torch.Tensor, sv: torch.Tensor,
                    sdo: torch.Tensor, sqc: torch.Tensor, sdoc: torch.Tensor, skc: torch.Tensor, rs: torch.Tensor,
                    lse2: torch.Tensor, delta: torch.Tensor, n: int, causal: bool, qk_scale: float,
                    softmax_scale: float, dtype: torch.dtype = torch.bfloat16, variant: str = "ws3",
                    irs: torch.Tensor | None = None, ordered: bool = True, section_heads: int | None = None,
                    sync: int | None = None,
                    dq_acc: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ (B, N, H, D), dK, dV) of ``matched_factored`` from one dK/dV launch that also forms dQ (FA3's way): each
    64-query tile's dŜ over the launch's 128 keys times K̂ᶜ (``k8t``, channel-major (B, H_kv, D, N_pad), scales ``skc``
    (B, H_kv, D), in fragment order: ``dq_factored``'s operands) is added into an FP32 (B, H, N_pad, D) scratch by the
    bulk-copy engine's reduction, and a second kernel writes dQ with ``dq_factored``'s epilogue arithmetic. Promoted
    only. dQ is within FP32 round-off of ``dq_factored``'s before its cast. ``ordered`` (FA3's deterministic mode):
    the adds into each query tile land in one order (decreasing key blocks, each waiting on a counter per tile), so
    dQ is bit-reproducible, and dK and dV sum their query tiles in increasing order (within one bf16 rounding of
    ``dkdv_factored``'s); else the adds land in any order and dK and dV are ``dkdv_factored``'s bits.
    ``section_heads``: with ``ordered``, the kv heads whose CTAs are launched interleaved (default
    :data:`DQ_SECTION_ENV` where set, else :func:`ordered_section_heads`). ``sync`` (with ``ordered``; None:
    ``$DELTAMATCH_KERNEL_DQ_SYNC``, else :data:`DQ_SYNC_DEFAULT`): 11 FA3's count once read with no fence, 0 the count
    once written with fences, or one of tools/device/cuda_dv_bench.py's controls (``DqSync`` of
    kernels/cuda/dkdv_factored.cu: 1 no proxy fences, 2 FA3's count after the reads, 3 the launch order alone, 4 a
    relaxed count after the writes, 5 and 6: 0 and 4 with the counters read relaxed, not acquired, 7 the counts without
    the waits, 8 the waits' reads without the counts, 9 no fence at all, 10 its reads alone, 12 9's wait for the writes
    without its count). Where the adds are ordered (all but 3, 7, 8, 10 and 12) each query tile's first stores its
    product, so the scratch needs no zeroing.
    ``dq_acc``: the FP32 (B, H, N_pad, D) scratch to use (a new one when None), for a caller that reads the sums
    before the epilogue's cast (tools/device/dq_stress.py); its 64-row blocks are in the kernel's order.
    ``q8t``, ``do8t`` (fragment order) and ``irs`` as ``dkdv_factored``'s. At D = 64 ``variant`` is one of
    :data:`DKDV_D64_WITH_DQ` (the D = 64 build, ``dm_dkdv_factored_d64``, session 43)."""
    if section_heads is None and ordered:
        section_heads = section_heads_from_env()
    if section_heads is not None and (not ordered or int(section_heads) < 1):
        raise ValueError(f"section_heads = {section_heads}: expected at least 1, with ordered=True")
    if dq_acc is not None and (tuple(dq_acc.shape) != tuple(q8.shape) or dq_acc.dtype != torch.float32
                               or dq_acc.device != q8.device or not dq_acc.is_contiguous()):
        raise ValueError(f"dq_acc: {dq_acc.dtype} {tuple(dq_acc.shape)} on {dq_acc.device}"
                         f"{'' if dq_acc.is_contiguous() else ', not contiguous'}: expected a contiguous "
                         f"torch.float32 {tuple(q8.shape)} (Q̂'s (B, H, N_pad, D)) on {q8.device}")
    if sync is None:
        setting = os.environ.get(DQ_SYNC_ENV) or str(DQ_SYNC_DEFAULT)
        if not setting.isdigit():
            raise ValueError(f"${DQ_SYNC_ENV} = {setting!r}: expected an integer 0 .. {DQ_SYNC_MAX} (DqSync)")
        sync = int(setting)
    if not 0 <= sync <= DQ_SYNC_MAX:
        raise ValueError(f"sync = {sync} (or ${DQ_SYNC_ENV}): expected 0 .. {DQ_SYNC_MAX} (DqSync)")
    return _dkdv(q8, k8, v8, do8, q8t, do8t, sq, sk, sv, sdo, sqc, sdoc, rs, lse2, delta, n, causal, qk_scale,
                 softmax_scale, dtype, True, variant, k8t=k8t, skc=skc, irs=irs, ordered=ordered,
                 section_heads=section_heads, sync=sync, dq_acc=dq_acc)


L2_BYTES = 40 * 2**20
"""The share of the H200's 50 MB L2 that :func:`ordered_section_heads` fills (FA3 assumes 40 MB for its backward)."""


def ordered_section_heads(b: int, h: int, h_kv: int, n_pad: int, d: int = DV_HEAD_DIM) -> int:
    """How many kv heads the ordered dQ-in-dK/dV launch interleaves: the largest power of two whose query heads' tiles
    (Q̂, dÔ, Q'ᶜ, dÔᶜ codes, lse2, δ, 1/s, dQ's FP32 scratch) fit in :data:`L2_BYTES`, at least 1 and at most B·H_kv
    (FA3's L2 swizzle of its backward)."""
    per_kv_head = (h // h_kv) * n_pad * (4 * d + 3 * 4 + 4 * d)
    heads = 1
    while heads * 2 <= b * h_kv and heads * 2 * per_kv_head <= L2_BYTES:
        heads *= 2
    return heads


def section_heads_from_env() -> int | None:
    """:data:`DQ_SECTION_ENV` as a positive integer, or None where it is unset or empty; anything else is an error that
    names it."""
    value = os.environ.get(DQ_SECTION_ENV, "")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"${DQ_SECTION_ENV} = {value!r}: expected a positive integer (kv heads a section), or unset")
    return int(value)


def _dkdv(q8, k8, v8, do8, q8t, do8t, sq, sk, sv, sdo, sqc, sdoc, rs, lse2, delta, n, causal, qk_scale, softmax_scale,
          dtype, promote, variant, k8t=None, skc=None, irs=None, ordered=False, section_heads=None, sync=0,
          dq_acc=None):
    """The launch behind ``dkdv_factored`` and (with ``k8t``, ``skc``) ``dqdkdv_factored``: (dQ or None, dK, dV)."""
    if variant not in DKDV_VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {DKDV_VARIANTS}")
    d64 = q8.dim() == 4 and q8.shape[-1] == 64  # the D = 64 build: dm_dkdv_factored_d64
    if d64 and variant not in (DKDV_D64_WITH_DQ if k8t is not None else DKDV_D64_VARIANTS):
        raise ValueError(f"variant {variant!r}" + (" with dQ" if k8t is not None else "") + ": at D = 64 the dK/dV "
                         f"kernel is built as {DKDV_D64_VARIANTS} without dQ and {DKDV_D64_WITH_DQ} with it")
    if promote and variant in DKDV_UNPROMOTED_ONLY:
        raise ValueError(f"variant {variant!r} is built unpromoted only: pass promote=False")
    if k8t is not None and variant not in DKDV_WITH_DQ:
        raise ValueError(f"variant {variant!r} is not built with dQ: expected one of {DKDV_WITH_DQ}")
    if k8t is not None and not ordered and variant in DKDV_ORDERED_ONLY:
        raise ValueError(f"variant {variant!r} is built with its dQ adds ordered only: pass ordered=True")
    if k8t is None and variant in DKDV_DQ_ONLY:
        raise ValueError(f"variant {variant!r} is built with dQ only: call dqdkdv_factored, or pass one of "
                         f"{tuple(v for v in DKDV_VARIANTS if v not in DKDV_DQ_ONLY)}")
    b, h, h_kv, n_pad, d = _attention_shape(q8, k8, n, dtype, "dK/dV", (64,) if d64 else (DV_HEAD_DIM,))
    codes = [("q8", q8, (b, h, n_pad, d)), ("k8", k8, (b, h_kv, n_pad, d)), ("v8", v8, (b, h_kv, n_pad, d)),
             ("do8", do8, (b, h, n_pad, d)), ("q8t", q8t, (b, h, d, n_pad)), ("do8t", do8t, (b, h, d, n_pad))]
    if irs is None:  # referenced until the launch, so its memory cannot go back to the allocator before
        from deltamatch.kernels.triton_bwd import row_scale_inverses

        _operand_pointers(codes, [("rs", rs, (b, h, n_pad))])  # the inputs' checks before that small launch
        irs = row_scale_inverses(rs)
    if variant in DKDV_FOLDED:  # new tensors, referenced until the launch as irs above
        from deltamatch.kernels.quant import E4M3_MAX

        lse2, irs = lse2 - math.log2(E4M3_MAX), irs / E4M3_MAX
    pointers = _operand_pointers(
        codes,
        [("sq", sq, (b, h, n_pad // 128)), ("sk", sk, (b, h_kv, n_pad // 64)), ("sv", sv, (b, h_kv, n_pad // 64)),
         ("sdo", sdo, (b, h, n_pad // 128)), ("sqc", sqc, (b, h, d)), ("sdoc", sdoc, (b, h, d)),
         ("rs", rs, (b, h, n_pad)), ("irs", irs, (b, h, n_pad)), ("lse2", lse2, (b, h, n_pad)),
         ("delta", delta, (b, h, n_pad))])
    device = q8.device
    dk = torch.empty((b, n, h_kv, d), dtype=dtype, device=device)
    dv = torch.empty_like(dk)
    dq, extra = None, [None] * 4 + [0] * 3 + [None, 0, 0]
    if k8t is not None:
        if k8t.device != q8.device:
            raise ValueError(f"q8 on {q8.device}, k8t on {k8t.device}: expected one device")
        k8t_ptr, skc_ptr = _operand_pointers([("k8t", k8t, (b, h_kv, d, n_pad))], [("skc", skc, (b, h_kv, d))])
        dq = torch.empty((b, n, h, d), dtype=dtype, device=device)
        if dq_acc is None:  # (a caller's was checked by dqdkdv_factored)
            dq_acc = torch.empty((b, h, n_pad, d), dtype=torch.float32, device=device)  # zeroed by the launch if need be
        sem, heads = None, 0
        if ordered:
            heads = ordered_section_heads(b, h, h_kv, n_pad, d) if section_heads is None else int(section_heads)
            # a counter per query tile, and ws3xp's count of key blocks taken; zeroed by the launch
            sem = torch.empty(b * h * (n_pad // 64) + 1, dtype=torch.int32, device=device)
        extra = [k8t_ptr, skc_ptr, dq_acc.data_ptr(), dq.data_ptr(), dq.stride(0), dq.stride(1), dq.stride(2),
                 None if sem is None else sem.data_ptr(), heads, int(sync)]
    params = DkdvFactoredParams(*pointers, dk.data_ptr(), dv.data_ptr(), dk.stride(0),
                                dk.stride(1), dk.stride(2), b, h, h_kv, n, n_pad, float(qk_scale), float(softmax_scale),
                                int(causal), int(dtype == torch.float16), *extra)
    _call(_library(), "dm_dkdv_factored_d64" if d64 else "dm_dkdv_factored", ctypes.byref(params), int(promote),
          DKDV_VARIANTS.index(variant), *_launch_args(dk))  # the D = 64 build keeps this numbering
    return dq, dk, dv


def dq_factored(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, do8: torch.Tensor, k8t: torch.Tensor,
                sq: torch.Tensor, sk: torch.Tensor, sv: torch.Tensor, sdo: torch.Tensor, skc: torch.Tensor,
                rs: torch.Tensor, lse2: torch.Tensor, delta: torch.Tensor, n: int, causal: bool, qk_scale: float,
                softmax_scale: float, dtype: torch.dtype = torch.bfloat16, promote: bool = True,
                variant: str = "ws3") -> torch.Tensor:
    """dQ (B, N, H, D) of ``matched_factored`` from the operands of Triton's factored dQ launch
    (``kernels/cuda/dq_factored.cu``): ``q8``, ``do8`` (B, H, N_pad, D) and ``k8``, ``v8`` (B, H_kv, N_pad, D) codes with
    their block scales; ``k8t`` K̂ᶜ, the centred keys per channel, channel-major (B, H_kv, D, N_pad) in
    ``triton_quant.fragment_token_order`` (``quantize_per_channel(..., fragment_order=True)``), with ``skc``
    (B, H_kv, D); ``rs`` dŜ's row scales s, ``lse2`` and matched's ``delta``, each (B, H, N_pad). ``promote``: each
    64-key tile's product added into dQ in FP32 (``ACC_PROMOTE=64``), else accumulated by the wgmma. ``variant``: one of
    ``DQ_VARIANTS``. At D = 64 its D = 64 build runs (``dm_dq_factored_d64``: Triton's bits, but 1.707 ms promoted against
    Triton's 1.481 at B·H = 64, N = 8K, causal on an H100, session 43)."""
    if variant not in DQ_VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {DQ_VARIANTS}")
    d64 = q8.dim() == 4 and q8.shape[-1] == 64  # the D = 64 build (dm_dq_factored_d64), the same forms
    b, h, h_kv, n_pad, d = _attention_shape(q8, k8, n, dtype, "dQ", (64,) if d64 else (DV_HEAD_DIM,))
    pointers = _operand_pointers(
        [("q8", q8, (b, h, n_pad, d)), ("k8", k8, (b, h_kv, n_pad, d)), ("v8", v8, (b, h_kv, n_pad, d)),
         ("do8", do8, (b, h, n_pad, d)), ("k8t", k8t, (b, h_kv, d, n_pad))],
        [("sq", sq, (b, h, n_pad // 128)), ("sk", sk, (b, h_kv, n_pad // 64)), ("sv", sv, (b, h_kv, n_pad // 64)),
         ("sdo", sdo, (b, h, n_pad // 128)), ("skc", skc, (b, h_kv, d)), ("rs", rs, (b, h, n_pad)),
         ("lse2", lse2, (b, h, n_pad)), ("delta", delta, (b, h, n_pad))])
    device = q8.device
    dq = torch.empty((b, n, h, d), dtype=dtype, device=device)
    params = DqFactoredParams(*pointers, dq.data_ptr(), dq.stride(0), dq.stride(1),
                              dq.stride(2), b, h, h_kv, n, n_pad, float(qk_scale), float(softmax_scale), int(causal),
                              int(dtype == torch.float16))
    _call(_library(), "dm_dq_factored_d64" if d64 else "dm_dq_factored", ctypes.byref(params), int(promote),
          DQ_VARIANTS.index(variant), *_launch_args(dq))
    return dq


def fwd_factored(q8: torch.Tensor, k8: torch.Tensor, v8t: torch.Tensor, sq: torch.Tensor, sk: torch.Tensor,
                 svc: torch.Tensor, out_shape: tuple[int, int, int, int], causal: bool, qk_scale: float,
                 dtype: torch.dtype = torch.bfloat16, promote: bool = True,
                 variant: str = "ws4p") -> tuple[torch.Tensor, torch.Tensor]:
    """(O (B, N, H, D), lse2 (B, H, N_pad)) of ``matched_factored``'s forward (``kernels/cuda/fwd_factored.cu``) from the
    operands of Triton's factored forward: ``q8`` (B, H, N_pad, D) and ``k8`` (B, H_kv, N_pad, D) codes with scales
    ``sq`` (B, H, N_pad / 128) and ``sk`` (B, H_kv, N_pad / 64); ``v8t`` V̂ᶜ, V per channel, channel-major
    (B, H_kv, D, N_pad), with ``svc`` (B, H_kv, D); ``out_shape`` O's (B, N, H, D); ``qk_scale`` = softmax_scale ·
    log2(e). ``promote``: each 64-key tile's P̂ V̂ᶜ added into O in FP32 (``ACC_PROMOTE=64``), else accumulated by the
    wgmma. lse2 is written for every query of each 64-query block that holds one below N, as Triton's launch does.
    ``variant``: one of ``FWD_VARIANTS``."""
    return _forward("dm_fwd_factored", FWD_VARIANTS, variant, q8, k8, v8t, sq, sk, svc, out_shape, causal, qk_scale,
                    dtype, promote)


def _d64_build(q8: torch.Tensor, variant: str, built: tuple[str, ...], what: str) -> bool:
    """Whether ``q8`` holds D = 64 codes, for a kernel's D = 64 build (which keeps its D = 128 entry's numbering of
    the variants); ``variant`` not one of ``built``, those built at D = 64, is then an error naming ``what``."""
    if not (q8.dim() == 4 and q8.shape[-1] == 64):
        return False
    if variant not in built:
        raise ValueError(f"variant {variant!r}: at D = 64 the {what} is built as {built} only")
    return True


def _forward(entry: str, variants: tuple[str, ...], variant: str, q8, k8, v8t, sq, sk, svc, out_shape, causal,
             qk_scale, dtype, promote, row_max=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``fwd_factored`` and ``fwd_wide``: the operands checked, O and lse2 made, ``entry`` called with ``variant``'s
    index in ``variants`` (and, for ``fwd_wide``, ``row_max``'s pointer, 0 for none, before it)."""
    if variant not in variants:
        raise ValueError(f"variant {variant!r}: expected one of {variants}")
    n = out_shape[1]
    d64 = entry.endswith("_d64")
    b, h, h_kv, n_pad, d = _attention_shape(q8, k8, n, dtype, "forward", (64,) if d64 else (DV_HEAD_DIM,))
    if tuple(out_shape) != (b, n, h, d):
        raise ValueError(f"out_shape {tuple(out_shape)}: expected (B, N, H, D) = {(b, n, h, d)}")
    pointers = _operand_pointers(
        [("q8", q8, (b, h, n_pad, d)), ("k8", k8, (b, h_kv, n_pad, d)), ("v8t", v8t, (b, h_kv, d, n_pad))],
        [("sq", sq, (b, h, n_pad // 128)), ("sk", sk, (b, h_kv, n_pad // 64)), ("svc", svc, (b, h_kv, d))])
    device = q8.device
    o = torch.empty(out_shape, dtype=dtype, device=device)
    lse2 = torch.empty((b, h, n_pad), dtype=torch.float32, device=device)
    params = FwdFactoredParams(*pointers, lse2.data_ptr(), o.data_ptr(), o.stride(0), o.stride(1), o.stride(2), b, h,
                               h_kv, n, n_pad, float(qk_scale), int(causal), int(dtype == torch.float16))
    wide = () if entry == "dm_fwd_factored" else (_row_max_pointer(row_max, (b, h, n_pad), device),)
    _call(_library(), entry, ctypes.byref(params), *wide, int(promote), variants.index(variant), *_launch_args(o))
    return o, lse2


def fwd_wide(q8: torch.Tensor, k8: torch.Tensor, v8t: torch.Tensor, sq: torch.Tensor, sk: torch.Tensor,
             svc: torch.Tensor, out_shape: tuple[int, int, int, int], causal: bool, qk_scale: float,
             dtype: torch.dtype = torch.bfloat16, promote: bool = True, variant: str = "w4p",
             row_max: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O (B, N, H, D), lse2 (B, H, N_pad)) of ``matched_factored``'s forward over 128-key tiles
    (``kernels/cuda/fwd_wide.cu``), from ``fwd_factored``'s operands but for ``v8t``: V̂ᶜ channel-major with its tokens
    in ``triton_quant.fragment_token_order`` (``quantize_per_channel(..., fragment_order=True)``), so that P̂'s
    accumulator bytes are the product's A fragments. ``promote``: each tile's P̂ V̂ᶜ (128 keys) added into O in FP32,
    else accumulated by the wgmma. lse2 is written for every query of each 128-query block. ``variant``: one of
    ``FWD_WIDE_VARIANTS``. ``row_max``: a (B, H, N_pad) FP32 tensor that takes each row's m beside lse2 (the max of the
    scaled scores, log2 domain, less log2(448): lse2 = m + log2(l)), what the δ pass's :data:`DELTA_ROW_MAX` variants
    read; None writes none."""
    entry = "dm_fwd_wide_d64" if _d64_build(q8, variant, FWD_WIDE_D64_VARIANTS, "forward") else "dm_fwd_wide"
    return _forward(entry, FWD_WIDE_VARIANTS, variant, q8, k8, v8t, sq, sk, svc, out_shape, causal, qk_scale, dtype,
                    promote, row_max)


def _row_max_pointer(row_max: torch.Tensor | None, shape: tuple[int, int, int], device: torch.device) -> int:
    """``row_max``'s data pointer once it is a contiguous (B, H, N_pad) FP32 tensor on ``device``, or 0 for None."""
    if row_max is None:
        return 0
    if (row_max.dtype != torch.float32 or tuple(row_max.shape) != shape or not row_max.is_contiguous()
            or row_max.device != device):
        raise ValueError(f"row_max: {row_max.dtype} {tuple(row_max.shape)} on {row_max.device}, expected a contiguous "
                         f"torch.float32 {shape} on {device}")
    return row_max.data_ptr()


def delta_factored(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, do8: torch.Tensor, sq: torch.Tensor,
                   sk: torch.Tensor, sv: torch.Tensor, sdo: torch.Tensor, lse2: torch.Tensor, n: int, causal: bool,
                   qk_scale: float, variant: str = "ws4x2") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(δ, s, 1/s), each (B, H, N_pad) FP32: matched's δ_i = Σ_j P_ij dP̂_ij, the factored layout's dŜ row scales and
    their div.full(1, s) (what ``dkdv_factored`` reads as ``irs``), from the
    operands of Triton's δ pass (``kernels/cuda/delta_factored.cu``): ``q8``, ``do8`` (B, H, N_pad, D) and ``k8``,
    ``v8`` (B, H_kv, N_pad, D) codes with their block scales, ``lse2`` (B, H, N_pad). Every query of each 128-query block
    that holds one below N is written, as Triton's launch does. ``variant``: one of ``DELTA_VARIANTS``."""
    return _delta("dm_delta_factored", DELTA_VARIANTS, variant, q8, k8, v8, do8, sq, sk, sv, sdo, lse2, n, causal,
                  qk_scale)


def delta_wide(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, do8: torch.Tensor, sq: torch.Tensor,
               sk: torch.Tensor, sv: torch.Tensor, sdo: torch.Tensor, lse2: torch.Tensor, n: int, causal: bool,
               qk_scale: float, variant: str = "w4p",
               row_max: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``delta_factored``'s (δ, s, 1/s) from the same operands by the δ pass over 128-key tiles
    (``kernels/cuda/delta_wide.cu``): max P and max P·|dP̂| are Triton's bits, δ differs from Triton's by FP32 summation
    order (each thread sums its keys across the tiles, the quad's four sums are added at the end), and s follows δ.
    Queries ≥ N get δ = 0 and s = 1. ``variant``: one of ``DELTA_WIDE_VARIANTS``; those of :data:`DELTA_ROW_MAX` read
    ``row_max``, the row maxima ``fwd_wide`` wrote beside this ``lse2`` (and only they take it)."""
    if (variant in DELTA_ROW_MAX) != (row_max is not None):
        raise ValueError(f"variant {variant!r} " + ("reads the forward's row maxima: row_max is None"
                                                    if row_max is None else "takes no row_max"))
    entry = "dm_delta_wide_d64" if _d64_build(q8, variant, DELTA_WIDE_D64_VARIANTS, "δ pass") else "dm_delta_wide"
    return _delta(entry, DELTA_WIDE_VARIANTS, variant, q8, k8, v8, do8, sq, sk, sv, sdo, lse2, n, causal, qk_scale,
                  row_max)


def _delta(entry: str, variants: tuple[str, ...], variant: str, q8, k8, v8, do8, sq, sk, sv, sdo, lse2, n, causal,
           qk_scale, row_max=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``delta_factored`` and ``delta_wide``: the operands checked, δ, s and 1/s made, ``entry`` called with
    ``variant``'s index in ``variants`` (and, for ``delta_wide``, ``row_max``'s pointer, 0 for none, before it)."""
    if variant not in variants:
        raise ValueError(f"variant {variant!r}: expected one of {variants}")
    d64 = entry.endswith("_d64")
    b, h, h_kv, n_pad, d = _attention_shape(q8, k8, n, None, "δ", (64,) if d64 else (DV_HEAD_DIM,))
    pointers = _operand_pointers(
        [("q8", q8, (b, h, n_pad, d)), ("k8", k8, (b, h_kv, n_pad, d)), ("v8", v8, (b, h_kv, n_pad, d)),
         ("do8", do8, (b, h, n_pad, d))],
        [("sq", sq, (b, h, n_pad // 128)), ("sk", sk, (b, h_kv, n_pad // 64)), ("sv", sv, (b, h_kv, n_pad // 64)),
         ("sdo", sdo, (b, h, n_pad // 128)), ("lse2", lse2, (b, h, n_pad))])
    delta, rs, irs = torch.empty((3, b, h, n_pad), dtype=torch.float32, device=q8.device).unbind()  # one allocation
    params = DeltaFactoredParams(*pointers, delta.data_ptr(), rs.data_ptr(), irs.data_ptr(), b, h, h_kv, n, n_pad,
                                 float(qk_scale), int(causal))
    wide = () if entry == "dm_delta_factored" else (_row_max_pointer(row_max, (b, h, n_pad), q8.device),)
    _call(_library(), entry, ctypes.byref(params), *wide, variants.index(variant), *_launch_args(delta))
    return delta, rs, irs


QUANT_STATS_ROWS = {True: 1024, False: 128}
"""Rows per CTA of ``dm_quant_stats`` (a multiple of 128, ``kernels/cuda/quant_passes.cu``'s ``kStatsChunk``), the
default of ``quantize_block_and_channel``'s ``stats_rows``, by ``centre``. On the H200 (session 24, CUPTI at B·H = 64,
N = 8K) alone (``tools/device/quant_bench.py``) the centred statistics took 0.053 / 0.049 / 0.047 / 0.042 ms at 128 /
256 / 512 / 1024 rows and the max |x| ones 0.047 / 0.044 / 0.041 / 0.041; in the step (CUPTI, call 9) the centred
kept their gain (0.054 → 0.041) and the max |x| did not (0.046 each at 128 rows in three calls, 0.0485 at 1024 in
one), so those stay at 128."""


QUANT_HEAD_DIMS = (128, 64)
"""The head dims the CUDA quantisation passes are built at (``kernels/cuda/quant_passes.cu``; D = 64's kernels are
named ``..._d64``); matched_factored runs them at both unasked (``triton_bwd.CUDA_QUANT_DEFAULT``)."""


def _quant_entry(name: str, d: int) -> str:
    """The entry point of the quantisation pass ``name`` at head dim ``d`` (one of :data:`QUANT_HEAD_DIMS`)."""
    return name if d == DV_HEAD_DIM else f"{name}_d64"


def quant_reason(x: torch.Tensor) -> str:
    """Why ``quantize_block_and_channel`` cannot take ``x``, or ``""``: a CUDA (B, N, H, D) tensor of bf16 or fp16 at
    D = 128 or 64 whose rows are 16-byte aligned (D contiguous, every stride a multiple of 8 elements)."""
    if x.dim() != 4:
        return f"x has {x.dim()} dims, expected (B, N, H, D)"
    if x.device.type != "cuda":
        return f"x is on {x.device}, expected a CUDA tensor"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"x is {x.dtype}, expected torch.bfloat16 or torch.float16"
    if x.shape[-1] not in QUANT_HEAD_DIMS:
        return f"head dim {x.shape[-1]}: the CUDA quantisation is built for D = 128 and 64 only"
    if x.shape[1] == 0:
        return "x has no tokens"
    if x.stride(-1) != 1 or any(s % 8 for s in x.stride()[:3]) or x.data_ptr() % 16:
        return f"x's rows are not 16-byte aligned (strides {tuple(x.stride())})"
    return ""


def _quant_shape(x: torch.Tensor, block_rows: int, allowed: tuple[int, ...], what: str) -> tuple[int, ...]:
    """``(b, n, h, d, n_pad)`` of an ``x`` the CUDA quantisation takes (``quant_reason``), with ``block_rows`` one of
    ``allowed``; else a ValueError naming the problem."""
    from deltamatch.kernels.triton_quant import padded_len  # the code tensors' N_pad, the Triton passes' own

    if reason := quant_reason(x):
        raise ValueError(reason)
    if block_rows not in allowed:
        raise ValueError(f"block_rows {block_rows}: {what}")
    b, n, h, d = x.shape
    return b, n, h, d, padded_len(n)


def _quant_params(x: torch.Tensor, shape: tuple[int, ...], block_rows: int, **fields) -> QuantParams:
    """``QuantParams`` of ``x`` (``shape``: ``_quant_shape``'s) with the other ``fields``."""
    b, n, h, _, n_pad = shape
    return QuantParams(x=x.data_ptr(), stride_b=x.stride(0), stride_n=x.stride(1), stride_h=x.stride(2), b=b, h=h,
                       n=n, n_pad=n_pad, block_rows=block_rows, in_fp16=int(x.dtype == torch.float16), **fields)


def quantize_block(x: torch.Tensor, block_rows: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """The block-scaled token-major codes ``(B, H, N_pad, D)`` of ``x`` and their scales ``(B, H, N_pad / 128)``
    (``dm_quant_block_128_*``): the bits of ``triton_quant.quantize_operand(x, 128, layouts="token")``, Q's pass in
    matched_factored's forward. ``block_rows``: 128 only (``quant_reason`` says what else ``x`` must be)."""
    shape = b, n, h, d, n_pad = _quant_shape(x, block_rows, (128,), "the token-major pass alone is built for "
                                             "128-row blocks (Q's)")
    x8 = torch.empty((b, h, n_pad, d), dtype=torch.float8_e4m3fn, device=x.device)
    sx = torch.empty((b, h, n_pad // block_rows), dtype=torch.float32, device=x.device)
    params = _quant_params(x, shape, block_rows, x8=x8.data_ptr(), sx=sx.data_ptr())
    _call(_library(), _quant_entry("dm_quant_dual", d), ctypes.byref(params), 0, *_launch_args(x))  # token-major alone
    return x8, sx


def _channel_buffers(x: torch.Tensor, shape: tuple[int, ...], stats_rows: int) -> tuple:
    """What the statistics pass and a per-channel cast of ``x`` need beside it: ``(x8t, sxc, part, tickets,
    n_blocks)``, the channel-major codes ``(B, H, D, N_pad)``, their scales ``(B, H, D)``, the pass's partials and its
    tickets (zeroed), and its CTAs per (batch, head) at ``stats_rows`` rows each (a positive multiple of 128, else a
    ValueError)."""
    b, n, h, d, n_pad = shape
    if stats_rows <= 0 or stats_rows % 128:
        raise ValueError(f"stats_rows {stats_rows}: expected a positive multiple of 128")
    n_blocks = -(-n // stats_rows)
    x8t = torch.empty((b, h, d, n_pad), dtype=torch.float8_e4m3fn, device=x.device)
    sxc = torch.empty((b, h, d), dtype=torch.float32, device=x.device)
    part = torch.empty((b * h, n_blocks, 3, d), dtype=torch.float32, device=x.device)
    tickets = torch.zeros(b * h, dtype=torch.int32, device=x.device)
    return x8t, sxc, part, tickets, n_blocks


def quantize_block_and_channel(x: torch.Tensor, block_rows: int, *, centre: bool = False,
                               fragment_order: bool = False,
                               stats_rows: int | None = None) -> tuple[torch.Tensor, ...]:
    """Both of an operand's factored-layout copies from two reads of ``x`` (``kernels/cuda/quant_passes.cu``):
    ``(x8, sx, x8t, sxc, mean)``. ``x8`` (B, H, N_pad, D) are the block-scaled token-major codes and ``sx``
    (B, H, N_pad / block_rows) their scales, ``x8t`` (B, H, D, N_pad) the per-channel channel-major codes (in
    ``triton_quant.fragment_token_order`` with ``fragment_order``) and ``sxc`` (B, H, D) their scales; ``centre``
    subtracts the token mean ``mean`` (B, H, D) FP32 first (K's centring; None otherwise). The codes and scales are
    the bits of ``triton_quant.quantize_block_and_channel(x, block_rows, mean=mean, fragment_order=...)``; the mean
    is Σx / N folded in a fixed order (deterministic, not ``token_mean``'s bits; it depends on ``stats_rows``, the
    rows a CTA of the statistics pass reads, a multiple of 128; default ``QUANT_STATS_ROWS[centre]``). ``block_rows``:
    64 (K, V) or 128 (dO)."""
    shape = b, n, h, d, n_pad = _quant_shape(x, block_rows, (64, 128), "expected 64 (K, V) or 128 (Q, dO)")
    stats_rows = QUANT_STATS_ROWS[bool(centre)] if stats_rows is None else stats_rows
    x8t, sxc, part, tickets, n_blocks = _channel_buffers(x, shape, stats_rows)
    device = x.device
    x8 = torch.empty((b, h, n_pad, d), dtype=torch.float8_e4m3fn, device=device)
    sx = torch.empty((b, h, n_pad // block_rows), dtype=torch.float32, device=device)
    mean = torch.empty((b, h, d), dtype=torch.float32, device=device) if centre else None
    params = _quant_params(x, shape, block_rows, n_blocks=n_blocks, centre=int(centre),
                           fragment_order=int(fragment_order), part=part.data_ptr(),
                           tickets=tickets.data_ptr(), mean=mean.data_ptr() if centre else None,
                           scale_c=sxc.data_ptr(), x8=x8.data_ptr(), sx=sx.data_ptr(), x8t=x8t.data_ptr())
    lib = _library()
    _call(lib, _quant_entry("dm_quant_stats", d), ctypes.byref(params), stats_rows, *_launch_args(x))
    _call(lib, _quant_entry("dm_quant_dual", d), ctypes.byref(params), 1, *_launch_args(x))
    return x8, sx, x8t, sxc, mean


def quantize_channel_scaled(x: torch.Tensor, row_scales: torch.Tensor, *, fragment_order: bool = False,
                            stats_rows: int = QUANT_STATS_ROWS[False]) -> tuple[torch.Tensor, torch.Tensor]:
    """Q'ᶜ, the dK product's operand: the per-channel channel-major codes ``(B, H, D, N_pad)`` of ``x ⊙ row_scales``
    (each token times its row scale; ``row_scales`` (B, H, N_pad) FP32, the δ pass's dŜ row scales) and their scales
    ``(B, H, D)``, from two reads of ``x`` (``dm_quant_channel_scaled``: the max |x| pass, then the channel cast alone).
    The bits of ``triton_quant.quantize_per_channel(x, row_scales=row_scales, layouts="channel", fragment_order=...)``.
    ``stats_rows``: rows a CTA of the statistics pass reads (a positive multiple of 128)."""
    shape = b, n, h, d, n_pad = _quant_shape(x, 128, (128,), "")
    if row_scales.dtype != torch.float32 or tuple(row_scales.shape) != (b, h, n_pad):
        raise ValueError(f"row_scales is {row_scales.dtype} {tuple(row_scales.shape)}, expected torch.float32 "
                         f"{(b, h, n_pad)} (B, H, N_pad)")
    if row_scales.device != x.device:
        raise ValueError(f"row_scales on {row_scales.device}, x on {x.device}: expected one device")
    x8t, sxc, part, tickets, n_blocks = _channel_buffers(x, shape, stats_rows)
    row_scales = row_scales.contiguous()
    params = _quant_params(x, shape, 128, n_blocks=n_blocks, centre=0, fragment_order=int(fragment_order),
                           part=part.data_ptr(), tickets=tickets.data_ptr(), mean=None, scale_c=sxc.data_ptr(),
                           x8=None, sx=None, x8t=x8t.data_ptr())
    _call(_library(), _quant_entry("dm_quant_channel_scaled", d), ctypes.byref(params), stats_rows,
          row_scales.data_ptr(),
          *_launch_args(x))
    return x8t, sxc
