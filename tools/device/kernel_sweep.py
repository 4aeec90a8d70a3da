"""Time each Triton attention kernel alone under several launch configurations (one device call, H200).

Run from the repo root: ``python3 tools/device/kernel_sweep.py --out DIR``. Compiles all variants first in parallel
worker processes (Triton's on-disk cache then serves the timing process), times each with ``do_bench`` (median),
and prints one table per kernel with executed TFLOP/s (causal, B·H = 64, N = 8192).
"""

import argparse
import json
import os
import subprocess
import sys

import torch

SEQ = 8192
F = lambda bm, w, s, **kw: dict(BLOCK_M=bm, BLOCK_N=64, num_warps=w, num_stages=s, **kw)  # noqa: E731
KV = lambda bn, w, s, **kw: dict(BLOCK_M=64, BLOCK_N=bn, num_warps=w, num_stages=s, **kw)  # noqa: E731
# the factored forward's 128-key tiles (DELTAMATCH_KERNEL_FWD_WIDE), promoted every ``p`` keys; their bits differ from
# the 64-key tiles' (the online softmax's max moves per 128 keys), so rel_diff_to_first is not 0 there (FP8 noise)
W = lambda bm, w, s, p: dict(BLOCK_M=bm, BLOCK_N=128, num_warps=w, num_stages=s, TMA=True, FACTORED=True,  # noqa: E731
                             ACC_PROMOTE=p)
# the factored layout's kernels as matched_factored launches them (promoted per 64-deep tile; the δ pass with dŜ's row
# scales and its scales after each tile's sum)
FP = lambda bm, w, s, **kw: F(bm, w, s, FACTORED=True, ACC_PROMOTE=64, **kw)  # noqa: E731
KVP = lambda bn, w, s, **kw: KV(bn, w, s, SPLIT=True, FACTORED=True, ACC_PROMOTE=64, **kw)  # noqa: E731
DR = lambda bm, w, s, **kw: F(bm, w, s, ROW_SCALES=True, SCALE_AFTER_SUM=True, **kw)  # noqa: E731
SWEEP = {
    # D = 64: the paper layout's configs, then (session 40) the factored layout's, which matched_factored runs on
    # Triton at this head dim: each kind's launched config first among them (backward_config's fused-kernel shape for
    # its two dK/dV launches; forward_config's without PAIRED or TMA), then TMA, other depths and the D = 128 shapes
    64: dict(fwd=[F(64, 4, 4), F(128, 8, 3), F(64, 4, 4, PAIRED=True), F(128, 8, 3, PAIRED=True),
                  F(64, 4, 4, PAIRED=True, TMA=True), F(64, 4, 3, PAIRED=True, TMA=True), F(128, 8, 3, TMA=True),
                  FP(64, 4, 4), FP(64, 4, 4, TMA=True), FP(64, 4, 3, TMA=True), FP(64, 4, 5, TMA=True),
                  FP(64, 4, 6, TMA=True), FP(128, 8, 3, TMA=True), W(64, 4, 2, 64), W(64, 4, 3, 64),
                  W(128, 8, 2, 64)],
             dkdv=[KV(128, 8, 1, SPLIT=True), KV(128, 8, 1, SEPARATE=True), KV(128, 8, 2, SEPARATE=True),
                   # the factored layout's dK and dV in one launch (session 41; S, P and dŜ formed once, two
                   # accumulators of 64 × 64 FP32), launched; then as two launches (session 40's shapes)
                   KVP(64, 4, 3, SEPARATE=False),
                   KVP(128, 8, 1), KVP(128, 8, 2), KVP(64, 4, 2), KVP(64, 4, 3), KVP(64, 4, 2, TMA=True),
                   KVP(64, 4, 3, TMA=True), KVP(64, 4, 4, TMA=True), KVP(128, 8, 2, TMA=True),
                   KVP(64, 4, 2, SEPARATE=False), KVP(64, 4, 4, SEPARATE=False),
                   KVP(64, 8, 3, SEPARATE=False), KVP(128, 8, 1, SEPARATE=False), KVP(128, 8, 2, SEPARATE=False),
                   KVP(64, 4, 3, SEPARATE=False, TMA=True), KVP(64, 4, 2, SEPARATE=False, TMA=True),
                   # one stage: 32 bytes of spill where 3 stages spill 696 (dm-kernel-check, session 41)
                   KVP(64, 4, 1, SEPARATE=False), KVP(64, 4, 1, SEPARATE=False, TMA=True)],
             dq=[F(64, 4, 3), F(128, 8, 3),
                 FP(64, 4, 3), FP(64, 4, 3, TMA=True), FP(64, 4, 4, TMA=True), FP(64, 4, 2, TMA=True),
                 FP(128, 8, 3, TMA=True)],
             delta=[F(128, 8, 3),
                    DR(128, 8, 3), DR(128, 8, 3, TMA=True), DR(128, 8, 4), DR(128, 8, 2), DR(64, 4, 3), DR(64, 4, 4),
                    DR(128, 4, 3)]),
    # D = 128: the launched paper-layout configs beside the factored layout's, with its dots promoted per 64-deep tile
    # (ACC_PROMOTE=64, the default of matched_factored) and without (every product in the tensor core's accumulator)
    128: dict(fwd=[F(64, 4, 4, TMA=True), F(64, 4, 3, TMA=True), F(64, 4, 3, PAIRED=True, TMA=True),
                   F(64, 4, 4, TMA=True, FACTORED=True, ACC_PROMOTE=64), F(64, 4, 3, TMA=True, FACTORED=True,
                                                                        ACC_PROMOTE=64),
                   F(64, 4, 4, TMA=True, FACTORED=True),
                   # session 16: the factored forward (launched: 64 rows, 4 warps, 4 stages, promoted) at 128 rows
                   F(128, 8, 3, TMA=True, FACTORED=True, ACC_PROMOTE=64),
                   F(128, 8, 4, TMA=True, FACTORED=True, ACC_PROMOTE=64),
                   F(64, 4, 5, TMA=True, FACTORED=True, ACC_PROMOTE=64),
                   # session 19: 128-key tiles
                   W(64, 4, 2, 64), W(64, 4, 3, 64), W(64, 4, 2, 128), W(128, 8, 2, 64), W(128, 8, 2, 128)],
              dkdv=[KV(64, 4, 2, SEPARATE=True, SPLIT=True, TMA=True), KV(64, 4, 3, SEPARATE=True, SPLIT=True, TMA=True),
                    KV(64, 4, 2, SPLIT=True, TMA=True, FACTORED=True, ACC_PROMOTE=64),
                    KV(64, 4, 3, SPLIT=True, TMA=True, FACTORED=True, ACC_PROMOTE=64),
                    KV(64, 4, 2, SPLIT=True, TMA=True, FACTORED=True)],
              dv=[KV(64, 4, 2, SPLIT=True, TMA=True, DV_ONLY=True),
                  KV(64, 4, 2, SPLIT=True, TMA=True, DV_ONLY=True, FACTORED=True, ACC_PROMOTE=64),
                  KV(64, 4, 2, SPLIT=True, TMA=True, DV_ONLY=True, FACTORED=True)],
              dq=[F(64, 4, 3, TMA=True), F(64, 4, 4, TMA=True),
                  F(64, 4, 3, TMA=True, FACTORED=True, ACC_PROMOTE=64), F(64, 4, 4, TMA=True, FACTORED=True,
                                                                         ACC_PROMOTE=64),
                  F(64, 4, 3, TMA=True, FACTORED=True)],
              delta=[F(128, 8, 3), F(128, 8, 3, TMA=True), F(128, 8, 3, ROW_SCALES=True),
                     F(128, 8, 3, TMA=True, ROW_SCALES=True),
                     # session 16: matched_factored's δ pass (row scales, launched as the line above) in other shapes
                     F(128, 8, 2, TMA=True, ROW_SCALES=True), F(128, 8, 4, TMA=True, ROW_SCALES=True),
                     F(128, 4, 3, TMA=True, ROW_SCALES=True), F(64, 4, 3, TMA=True, ROW_SCALES=True),
                     F(64, 4, 4, TMA=True, ROW_SCALES=True), F(256, 8, 2, TMA=True, ROW_SCALES=True)]),
    256: dict(fwd=[F(64, 4, 2), F(64, 4, 2, PAIRED=True), F(64, 8, 2, PAIRED=True), F(64, 4, 2, TMA=True),
                   F(64, 4, 1, TMA=True), F(64, 8, 2, PAIRED=True, TMA=True), F(64, 4, 3), F(64, 4, 3, TMA=True),
                   # the factored layout's (matched_factored runs Triton at D = 256), the launched config first:
                   # session 41 launched TMA at each kind (triton_fwd.TMA_HEAD_DIMS) and swept its depths
                   FP(64, 4, 3, TMA=True), FP(64, 4, 2, TMA=True), FP(64, 4, 4, TMA=True), FP(64, 4, 1, TMA=True),
                   FP(64, 8, 2, TMA=True), FP(64, 4, 2), FP(64, 4, 3), FP(128, 8, 2, TMA=True)],
              dkdv=[KV(64, 8, 1, SPLIT=False), KV(64, 8, 1, SEPARATE=True), KV(64, 4, 1, SEPARATE=True),
                    KV(64, 8, 1, SEPARATE=True, SPLIT=False), KV(64, 4, 1, SEPARATE=True, SPLIT=True, TMA=True),
                    KV(64, 4, 2, SEPARATE=True, SPLIT=True, TMA=True),
                    KVP(64, 4, 1, TMA=True), KVP(64, 4, 2, TMA=True), KVP(64, 4, 1), KVP(64, 8, 2),
                    KVP(128, 8, 1, TMA=True)],
              dq=[F(64, 4, 1), F(64, 4, 2), F(64, 4, 1, TMA=True), F(64, 4, 2, TMA=True),
                  FP(64, 4, 1, TMA=True), FP(64, 4, 2, TMA=True), FP(64, 8, 2, TMA=True), FP(64, 4, 1),
                  FP(128, 8, 1, TMA=True)],
              delta=[F(64, 4, 2),
                     DR(64, 4, 2), DR(64, 4, 3), DR(64, 8, 2), DR(128, 8, 2), DR(64, 4, 1), DR(64, 4, 2, TMA=True)]),
}


def variants(d, kinds=None, factored_only=False):
    """(kind, config) pairs of ``SWEEP[d]``: of ``kinds`` only where given, and of the factored layout only (its
    forward, ``FACTORED``; its δ pass, ``ROW_SCALES``) with ``factored_only``, so that each kind's first row (the
    one the others are compared with) is the launched factored config."""
    return [(kind, c) for kind, cs in SWEEP[d].items() for c in cs if (kinds is None or kind in kinds)
            and (not factored_only or c.get("FACTORED") or c.get("ROW_SCALES"))]


def setup(d, n=SEQ, causal=True):
    import math

    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_fwd import attention_forward
    from deltamatch.kernels.triton_quant import (quantize_do_and_delta, quantize_operand, quantize_per_channel,
                                                 token_mean)

    h = 2048 // d
    b = 64 // h
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q8, q8t, sq = quantize_operand(q, 128)
    k8, k8t, sk = quantize_operand(k, 64, centre=True)
    v8, v8t, sv = quantize_operand(v, 64)
    o, lse2 = attention_forward(q8, k8, v8t, sq, sk, sv, q.shape, q.dtype, causal, d**-0.5)
    do8, do8t, sdo, delta = quantize_do_and_delta(do, o, "stale")
    saved = dict(q8=q8, q8t=q8t, k8=k8, k8t=k8t, v8=v8, v8t=v8t, sq=sq, sk=sk, sv=sv, lse2=lse2)
    # the factored layout's operands (kernels/README.md): V̂ for PV, dÔ for dV, K̂ᶜ for dQ, Q' = s ⊙ Q for dK, with s
    # the dŜ row scales of matched's δ pass
    _, saved["v8t_channel"], saved["sv_channel"] = quantize_per_channel(v, "v")
    rs, matched_delta = torch.ones_like(delta), torch.empty_like(delta)
    triton_bwd._launch_delta_matched(saved, do8, sdo, matched_delta, causal, d**-0.5 * math.log2(math.e), n,
                                     triton_bwd.backward_config(d)["delta"], row_scales=rs)
    factored = dict(rs=rs)
    _, factored["do8t"], factored["sdoc"] = quantize_per_channel(do, "do")
    _, factored["q8t"], factored["sqc"] = quantize_per_channel(q, "q", row_scales=rs)
    _, factored["k8t"], factored["skc"] = quantize_per_channel(k, "k", mean=token_mean(k))
    return dict(saved=saved, do8=do8, do8t=do8t, sdo=sdo, delta=delta, q=q, k=k, b=b, h=h, n=n, d=d, causal=causal,
                factored=factored)


def launcher(kind, cfg, st):
    """(run, result): a closure launching one kernel with ``cfg`` and one returning its output for comparison."""
    import math

    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_fwd import attention_forward

    s, d, n, causal = st["saved"], st["d"], st["n"], st["causal"]
    scale = d**-0.5
    qk = scale * math.log2(math.e)
    if kind == "fwd":
        out = {}

        v8t, sv = (s["v8t_channel"], s["sv_channel"]) if cfg.get("FACTORED") else (s["v8t"], s["sv"])

        def run():
            out["o"] = attention_forward(s["q8"], s["k8"], v8t, s["sq"], s["sk"], sv, st["q"].shape,
                                         st["q"].dtype, causal, scale, config=cfg)[0]

        return run, lambda: out["o"]
    if kind == "delta":  # ROW_SCALES: also the factored layout's dŜ row scales
        delta = torch.zeros_like(st["delta"])
        cfg = dict(cfg)
        rs = torch.ones_like(delta) if cfg.pop("ROW_SCALES", False) else None
        return (lambda: triton_bwd._launch_delta_matched(s, st["do8"], st["sdo"], delta, causal, qk, n, cfg, rs),
                lambda: delta[..., :n])
    if kind == "dv":  # the dV launch alone: the paper layout's, or the factored one (per-channel dÔ codes)
        dk, dv = torch.zeros_like(st["k"]), torch.zeros_like(st["k"])
        return (lambda: triton_bwd._launch_dkdv(s, st["do8"], st["do8t"], st["sdo"], st["delta"], dk, dv, None,
                                                causal, qk, scale, n, cfg, factored=st["factored"]), lambda: dv)
    if kind == "dkdv":
        dk, dv = torch.zeros_like(st["k"]), torch.zeros_like(st["k"])
        dq_acc = torch.zeros(s["q8"].shape, device="cuda") if cfg.get("DQ_ATOMIC") else None  # + dQ by atomics

        def run():
            if dq_acc is not None:
                dq_acc.zero_()
            triton_bwd._launch_dkdv(s, st["do8"], st["do8t"], st["sdo"], st["delta"], dk, dv, None, causal, qk,
                                    scale, n, cfg, dq_acc, factored=st["factored"])

        return run, lambda: torch.cat([dk, dv])
    dq = torch.zeros_like(st["q"])
    return (lambda: triton_bwd._launch_dq(s, st["do8"], st["sdo"], st["delta"], dq, None, causal, qk, scale, n, cfg,
                                          factored=st["factored"]), lambda: dq)


MATMULS = dict(fwd=2, delta=2, dkdv=4, dq=3, dv=2)  # dv: S recomputed, then dV


def quant_rows(d, n=SEQ) -> list[dict]:
    """Each quantisation pass alone at the reference shape, against a copy of the same bytes: issue 19's target is
    the passes at <= 1.3x their copy-speed time. Bytes = BF16 read + codes and their token-major copy written (+ O read
    by the dO pass). The per-channel passes of the factored layout read x a second time (their amax spans every token),
    so their floor is 1.5x; K's mean and Q's row scales are inputs formed elsewhere, made before the timing."""
    from triton.testing import do_bench

    from deltamatch.kernels.triton_quant import (padded_len, quantize_do_and_delta, quantize_operand,
                                                 quantize_per_channel)

    h = 2048 // d
    x, o = (torch.randn(64 // h, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    elems = x.numel()
    mean = x.mean(dim=1, dtype=torch.float32)
    row_scales = torch.rand(64 // h, h, padded_len(n), device="cuda") + 0.5
    passes = {"q (128 rows)": (lambda: quantize_operand(x, 128), 4 * elems),
              "k centred (64 rows)": (lambda: quantize_operand(x, 64, centre=True), 4 * elems),
              "v (64 rows)": (lambda: quantize_operand(x, 64), 4 * elems),
              "dO + stale delta": (lambda: quantize_do_and_delta(x, o, "stale"), 6 * elems),
              "v per channel": (lambda: quantize_per_channel(x, "v"), 4 * elems),
              "dO per channel": (lambda: quantize_per_channel(x, "do"), 4 * elems),
              "k centred per channel": (lambda: quantize_per_channel(x, "k", mean=mean), 4 * elems),
              "q row-scaled per channel": (lambda: quantize_per_channel(x, "q", row_scales=row_scales), 4 * elems)}
    passes.update(_store_diagnostics(x, elems))
    rows = []
    for name, (fn, nbytes, *extra) in passes.items():
        extra = extra[0] if extra else {}  # the store modes: {"store_mode": name, "bit_equal": ...}
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        buf = torch.empty(nbytes, device="cuda", dtype=torch.uint8)  # nbytes of traffic: read half, write half
        copy = do_bench(lambda: buf[: nbytes // 2].copy_(buf[nbytes // 2:]), warmup=25, rep=100, return_mode="median")
        del buf
        rows.append(dict(head_dim=d, kernel="quant", config={"pass": name}, ms=ms, copy_ms=copy,
                         gb_per_s=nbytes / ms * 1e-6, vs_copy=ms / copy, **extra))
        equal = f"  bit-equal to pointers: {extra['bit_equal']}" if "bit_equal" in extra else ""
        print(f"D={d} quant  {name:30s} {ms:7.3f} ms {nbytes / ms * 1e-6:6.0f} GB/s  {ms / copy:4.2f}x a copy of the "
              f"same bytes ({copy:.3f} ms){equal}", flush=True)
    return rows


def _store_diagnostics(x, elems) -> dict:
    """Where a pass's time goes: the q pass with one of its two code stores, with neither (load, amax, cast only), and
    the per-channel pass's amax launch alone (its atomic column max). Bytes are what each variant moves. Then the q
    pass under each code-store mode (``triton_quant.STORE_MODES``), each with whether its codes (both layouts) and
    scales are the pointer stores' bits: the timing that picks ``triton_quant.STORE_MODE``."""
    from deltamatch.kernels.triton_quant import (BLOCK_Q, STORE_MODE, STORE_MODES, _per_channel_amax_pass_kernel,
                                                 _quant_pass_kernel, _warps, code_buffers, padded_len,
                                                 round_fp32_in_kernels, store_flags)

    b, n, h, d = x.shape
    n_pad = padded_len(n)
    x8, x8t = code_buffers(x)
    scales = torch.empty((b, h, n_pad // BLOCK_Q), device=x.device, dtype=torch.float32)
    amax = torch.zeros((b, h, d), device=x.device, dtype=torch.float32)
    shape = (x.stride(0), x.stride(1), x.stride(2), n, n_pad, h)
    grid = (n_pad // BLOCK_Q, b * h)

    def q_pass(stores, mode=STORE_MODE, out=(x8, x8t, scales)):
        flags = store_flags(mode)  # sets Triton's allocator for the TMA modes, once, outside the timing
        return lambda: _quant_pass_kernel[grid](x, scales, *out, *shape, HEAD_DIM=d, BLOCK_ROWS=BLOCK_Q, CENTRE=False,
                                                ROUND_FP32=round_fp32_in_kernels(), **{**flags, "STORES": stores},
                                                num_warps=_warps(BLOCK_Q, d))

    def outputs(mode):  # each mode's codes and scales in buffers of its own, filled with 0xff (an E4M3 NaN) first
        out = (*code_buffers(x), torch.empty_like(scales))
        for t in out:
            t.view(torch.uint8).fill_(0xFF)
        q_pass(3, mode, out)()
        return [t.view(torch.uint8) for t in out]

    def amax_pass():
        _per_channel_amax_pass_kernel[grid](x, amax, amax, amax, *shape, HEAD_DIM=d, BLOCK_ROWS=BLOCK_Q, CENTRE=False,
                                            ROW_SCALED=False, num_warps=_warps(BLOCK_Q, d))

    rows = {"q, token-major store only": (q_pass(1), 3 * elems), "q, channel-major store only": (q_pass(2), 3 * elems),
            "q, no code store (load, amax)": (q_pass(0), 2 * elems), "per-channel amax launch": (amax_pass, 2 * elems)}
    pointers = outputs(STORE_MODES["pointers"])
    for name, mode in STORE_MODES.items():
        equal = all(torch.equal(a, b) for a, b in zip(outputs(mode), pointers))
        rows[f"q, stores: {name}"] = (q_pass(3, mode), 4 * elems, {"store_mode": name, "bit_equal": equal})
    return rows


def _bits_and_times(launches, outputs, reference, what):
    """Run ``launches`` once in order, read ``outputs`` as bytes and compare them with ``reference`` (None: they become
    it), then time each launch alone (do_bench median): (reference, bit_equal, [ms, ...]), or None, printed, where a
    launch fails (a config that does not compile is a row of the sweep, not its end)."""
    from triton.testing import do_bench

    try:
        for launch in launches:
            launch()
        torch.cuda.synchronize()
        out = tuple(t.view(torch.uint8).clone() for t in outputs)
        reference = reference or out
        equal = all(torch.equal(a, r) for a, r in zip(out, reference))
        return reference, equal, [do_bench(fn, warmup=25, rep=100, return_mode="median") for fn in launches]
    except Exception as exc:
        print(f"{what} failed: {exc!r}"[:300], flush=True)
        return None


PER_CHANNEL_CONFIGS = [(64, 4), (64, 8), (128, 4), (128, 16), (256, 4), (256, 8), (256, 16)]
"""(BLOCK_ROWS, num_warps) of the per-channel passes timed by ``per_channel_rows`` (launched: 128 rows, 8 warps)."""


def per_channel_rows(d=128, n=SEQ) -> list[dict]:
    """The per-channel passes' two launches (``_per_channel_amax_pass_kernel``, ``_per_channel_quant_pass_kernel``) as
    matched_factored runs them (channel-major codes only; K̂ᶜ centred and dÔᶜ in fragment order; V̂ᶜ natural; Q̂'ᶜ
    row-scaled in fragment order) under each of ``PER_CHANNEL_CONFIGS``, each launch timed alone (do_bench median)
    and its codes and scales compared bit for bit with those of the launch before session 16 (``BLOCK_Q`` rows,
    ``_warps``; the first row of each case) (``bit_equal``)."""
    from deltamatch.kernels.triton_quant import (BLOCK_Q, _per_channel_amax_pass_kernel,
                                                 _per_channel_quant_pass_kernel, _warps, padded_len,
                                                 round_fp32_in_kernels, store_flags)

    h = 2048 // d
    x = torch.randn(64 // h, n, h, d, device="cuda", dtype=torch.bfloat16)
    b, n_pad = x.shape[0], padded_len(n)
    mean = x.mean(dim=1, dtype=torch.float32)
    row_scales = torch.rand(b, h, n_pad, device="cuda") + 0.5
    cases = {"v": (None, None, False), "k centred": (mean, None, True), "dO": (None, None, True),
             "q row-scaled": (None, row_scales, True)}
    shape = (x.stride(0), x.stride(1), x.stride(2), n, n_pad, h)
    rows = []
    for name, (centre, scaled, fragment) in cases.items():
        amax = torch.zeros((b, h, d), device="cuda")
        stand_in = amax
        operands = (x, stand_in if centre is None else centre, stand_in if scaled is None else scaled)
        flags = dict(HEAD_DIM=d, CENTRE=centre is not None, ROW_SCALED=scaled is not None)
        reference = None
        for block_rows, warps in [(BLOCK_Q, min(_warps(BLOCK_Q, d), 8))] + PER_CHANNEL_CONFIGS:  # the old launch first
            if n_pad % block_rows:
                continue
            grid = (n_pad // block_rows, b * h)
            codes = torch.full((b, h, d, n_pad), 0xFF, device="cuda", dtype=torch.uint8).view(torch.float8_e4m3fn)
            scales = torch.empty((b, h, d), device="cuda")

            def amax_pass():
                amax.zero_()
                _per_channel_amax_pass_kernel[grid](*operands, amax, *shape, **flags, BLOCK_ROWS=block_rows,
                                                    num_warps=warps)

            def quant_pass():
                _per_channel_quant_pass_kernel[grid](*operands, amax, codes, codes, scales, *shape, **flags,
                                                     BLOCK_ROWS=block_rows, num_warps=warps,
                                                     ROUND_FP32=round_fp32_in_kernels(),
                                                     **store_flags(None, "channel"), FRAGMENT_ORDER=fragment)
            timed = _bits_and_times((amax_pass, quant_pass), (codes, scales), reference,
                                    f"per-channel {name} {block_rows} rows {warps} warps")
            if timed is None:
                continue
            reference, equal, (amax_ms, quant_ms) = timed
            rows.append(dict(head_dim=d, kernel="per_channel", config=dict(case=name, BLOCK_ROWS=block_rows,
                                                                            num_warps=warps),
                             amax_ms=amax_ms, quant_ms=quant_ms, bit_equal=equal))
            print(f"D={d} per-channel {name:14s} {block_rows:3d} rows {warps:2d} warps: amax {amax_ms:.4f} ms, "
                  f"cast {quant_ms:.4f} ms, bit-equal {equal}", flush=True)
    return rows


BLOCK_PASS_WARPS = (2, 4, 8, 16)
"""num_warps timed by ``block_pass_rows`` (a block pass's rows are its scale's block: not a launch choice)."""


def block_pass_rows(d=128, n=SEQ) -> list[dict]:
    """The block passes (token-major codes only: Q̂ over 128 rows, K̂ centred and V̂ over 64, dÔ over 128 without δ)
    under each of ``BLOCK_PASS_WARPS``, timed alone (do_bench median), codes and scales compared bit for bit with the
    launched ``_warps`` (the first row of each case)."""
    from deltamatch.kernels.triton_quant import (_quant_do_delta_pass_kernel, _quant_pass_kernel, _warps, code_buffers,
                                                 padded_len, round_fp32_in_kernels, store_flags)

    h = 2048 // d
    x, o = (torch.randn(64 // h, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    b, n_pad = x.shape[0], padded_len(n)
    mean = x.mean(dim=1, dtype=torch.float32)
    shape = (x.stride(0), x.stride(1), x.stride(2), n, n_pad, h)
    flags = dict(HEAD_DIM=d, ROUND_FP32=round_fp32_in_kernels(), **store_flags(None, "token"))
    rows = []
    for name, block_rows, centre in (("q", 128, False), ("k centred", 64, True), ("v", 64, False), ("dO", 128, None)):
        x8, _ = code_buffers(x, "token")
        scales = torch.empty((b, h, n_pad // block_rows), device="cuda")
        grid = (n_pad // block_rows, b * h)
        reference = None
        for warps in (_warps(block_rows, d), *BLOCK_PASS_WARPS):
            if centre is None:
                def run():
                    _quant_do_delta_pass_kernel[grid](x, o, x8, x8, scales, scales, *shape[:3], *shape[:3], *shape[3:],
                                                      BLOCK_ROWS=block_rows, DELTA=0, num_warps=warps, **flags)
            else:
                def run():
                    _quant_pass_kernel[grid](x, mean, x8, x8, scales, *shape, BLOCK_ROWS=block_rows, CENTRE=centre,
                                             num_warps=warps, **flags)
            x8.view(torch.uint8).fill_(0xFF)
            timed = _bits_and_times((run,), (x8, scales), reference, f"block pass {name} {warps} warps")
            if timed is None:
                continue
            reference, equal, (ms,) = timed
            rows.append(dict(head_dim=d, kernel="block_pass", config=dict(case=name, BLOCK_ROWS=block_rows,
                                                                           num_warps=warps),
                             ms=ms, bit_equal=equal))
            print(f"D={d} block pass {name:10s} {block_rows:3d} rows {warps:2d} warps: "
                  f"{ms:.4f} ms, bit-equal {equal}", flush=True)
    return rows


BOTH_PASS_WARPS = (4, 8, 16)
"""num_warps timed by ``both_pass_rows`` (the launched ``triton_quant.BLOCK_AND_CHANNEL_WARPS`` first)."""
STATS_CONFIGS = [(64, 4), (128, 4), (128, 8), (256, 8), (256, 16)]
"""(BLOCK_ROWS, num_warps) of ``centring_stats``'s partial-sum launch timed by ``both_pass_rows``."""


def both_pass_rows(d=128, n=SEQ) -> list[dict]:
    """matched_factored's one-read passes, timed alone (do_bench median): ``quantize_block_and_channel``'s launch for
    K (centred, fragment order), V and dO under each of ``BOTH_PASS_WARPS`` (the amax given), and K's mean and centred
    amax (``centring_stats``: the partial-sum launch under each of ``STATS_CONFIGS``, then the fold); codes, scales,
    mean and amax compared bit for bit with the launched config's (the first row of each case). Mean and amax are
    compared as FP32 sums in another block order would differ: only configs with the launched rows are bit-equal."""
    from deltamatch.kernels import triton_quant as tq

    h = 2048 // d
    x = torch.randn(64 // h, n, h, d, device="cuda", dtype=torch.bfloat16)
    b, n_pad = x.shape[0], tq.padded_len(n)
    mean, amax = tq.centring_stats(x)
    plain_amax = x.float().abs().amax(dim=1).contiguous()
    shape = (x.stride(0), x.stride(1), x.stride(2), n, n_pad, h)
    rows = []
    for name, block_rows, centre, fragment in (("k centred", 64, True, True), ("v", 64, False, False),
                                                ("dO", 128, False, True)):
        x8, x8t = tq.code_buffers(x, "both")
        sx, sxc = torch.empty((b, h, n_pad // block_rows), device="cuda"), torch.empty((b, h, d), device="cuda")
        reference = None
        launched = tq.BLOCK_AND_CHANNEL_WARPS[d]
        for warps in (launched, *BOTH_PASS_WARPS):
            def run():
                tq._block_and_channel_pass_kernel[(n_pad // block_rows, b * h)](
                    x, mean, amax if centre else plain_amax, x8, sx, x8t, sxc, *shape, HEAD_DIM=d,
                    BLOCK_ROWS=block_rows, CENTRE=centre, ROUND_FP32=tq.round_fp32_in_kernels(),
                    STORE_MODE=tq.STORE_MODE, FRAGMENT_ORDER=fragment, num_warps=warps)
            for t in (x8, x8t):
                t.view(torch.uint8).fill_(0xFF)
            timed = _bits_and_times((run,), (x8, sx, x8t, sxc), reference, f"both {name} {warps} warps")
            if timed is None:
                continue
            reference, equal, (ms,) = timed
            rows.append(dict(head_dim=d, kernel="block_and_channel", config=dict(case=name, BLOCK_ROWS=block_rows,
                                                                                  num_warps=warps), ms=ms,
                             bit_equal=equal))
            print(f"D={d} both {name:10s} {block_rows:3d} rows {warps:2d} warps: {ms:.4f} ms, bit-equal {equal}",
                  flush=True)
    reference = None
    for block_rows, warps in [(tq.STATS_ROWS, tq._warps(tq.STATS_ROWS, d))] + STATS_CONFIGS:
        nblk = (n + block_rows - 1) // block_rows
        part = torch.empty((b * h, nblk, 3, d), device="cuda")
        m, a = torch.empty_like(mean), torch.empty_like(mean)

        def partial():
            tq._column_stats_kernel[(nblk, b * h)](x, part, *shape[:3], n, h, nblk, HEAD_DIM=d, BLOCK_ROWS=block_rows,
                                                   num_warps=warps)

        def fold():
            tq._column_stats_reduce_kernel[(b * h,)](part, m, a, n, nblk, HEAD_DIM=d, CHUNK=16, num_warps=4)
        timed = _bits_and_times((partial, fold), (m, a), reference, f"centring stats {block_rows} rows {warps} warps")
        if timed is None:
            continue
        reference, equal, (partial_ms, fold_ms) = timed
        rows.append(dict(head_dim=d, kernel="centring_stats", config=dict(BLOCK_ROWS=block_rows, num_warps=warps),
                         partial_ms=partial_ms, fold_ms=fold_ms, bit_equal=equal))
        print(f"D={d} centring stats {block_rows:3d} rows {warps:2d} warps: partial {partial_ms:.4f} ms, fold "
              f"{fold_ms:.4f} ms, bit-equal {equal}", flush=True)
    return rows


def _write_rows(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128, 64, 256])
    parser.add_argument("--worker", type=str, default=None, help="i/n: compile every n-th variant, starting at i")
    parser.add_argument("--quant-only", action="store_true", help="time the quantisation passes only")
    parser.add_argument("--per-channel-only", action="store_true",
                        help="time the per-channel passes' launch configs (PER_CHANNEL_CONFIGS) and the block "
                        "passes' warps (BLOCK_PASS_WARPS) only, at each of --head-dims")
    parser.add_argument("--kinds", nargs="+", choices=sorted(MATMULS), help="time these kernels only")
    parser.add_argument("--factored-only", action="store_true",
                        help="only the factored layout's configs (FACTORED forward, ROW_SCALES δ pass)")
    parser.add_argument("--both-only", action="store_true",
                        help="time matched_factored's one-read passes only (BOTH_PASS_WARPS, STATS_CONFIGS)")
    args = parser.parse_args()
    select = dict(kinds=args.kinds, factored_only=args.factored_only)
    if args.both_only:
        _write_rows(os.path.join(args.out, "both_sweep.jsonl"), [r for d in args.head_dims for r in both_pass_rows(d)])
        return
    if args.per_channel_only:
        _write_rows(os.path.join(args.out, "per_channel_sweep.jsonl"),
                    [r for d in args.head_dims for r in per_channel_rows(d) + block_pass_rows(d)])
        return
    if args.quant_only:
        _write_rows(os.path.join(args.out, "quant_sweep.jsonl"), [r for d in args.head_dims for r in quant_rows(d)])
        return
    jobs = [(d, kind, cfg) for d in args.head_dims for kind, cfg in variants(d, **select)]
    if args.worker:
        i, n = map(int, args.worker.split("/"))
        states = {}
        for d, kind, cfg in jobs[i::n]:
            st = states.setdefault(d, setup(d, n=512))
            try:
                launcher(kind, cfg, st)[0]()
            except Exception as exc:  # reported again (and recorded) by the timing process
                print(f"compile failed {d} {kind} {cfg}: {exc!r}"[:300], file=sys.stderr)
        torch.cuda.synchronize()
        return
    n_workers = 8
    forwarded = [*(["--kinds", *args.kinds] if args.kinds else []), *(["--factored-only"] if args.factored_only else [])]
    procs = [subprocess.Popen([sys.executable, __file__, "--out", args.out, "--worker", f"{i}/{n_workers}",
                               "--head-dims", *map(str, args.head_dims), *forwarded]) for i in range(n_workers)]
    for p in procs:
        p.wait()
    from triton.testing import do_bench

    rows = []
    for d in args.head_dims:
        st = setup(d)
        fwd_flops = 4.0 * st["b"] * st["h"] * st["n"] ** 2 * d * 0.5
        first = {}
        for kind, cfg in variants(d, **select):
            diff = float("nan")
            try:
                run, result = launcher(kind, cfg, st)
                run()
                out = result().float()
                ref = first.setdefault(kind, out.clone())  # every variant must compute what the first one does
                diff = ((out - ref).norm() / ref.norm()).item()
                ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                tflops = fwd_flops * (MATMULS[kind] + bool(cfg.get("DQ_ATOMIC"))) / 2 / ms * 1e-9  # + matmul 6
            except Exception as exc:
                ms, tflops = float("nan"), float("nan")
                print(f"failed {d} {kind} {cfg}: {exc!r}"[:300])
            rows.append(dict(head_dim=d, kernel=kind, config=cfg, ms=ms, tflops=tflops, rel_diff_to_first=diff))
            print(f"D={d} {kind:6s} {json.dumps(cfg):100s} {ms:7.3f} ms {tflops:5.0f} TFLOP/s diff {diff:.1e}",
                  flush=True)
        del st
        torch.cuda.empty_cache()
        if not args.kinds:
            rows += quant_rows(d)
    _write_rows(os.path.join(args.out, "kernel_sweep.jsonl"), rows)
    print("\nbest per kernel:")
    for d in args.head_dims:
        for kind in MATMULS:
            cand = [r for r in rows if r["head_dim"] == d and r["kernel"] == kind and r["ms"] == r["ms"]]
            if cand:
                best = min(cand, key=lambda r: r["ms"])
                print(f"D={d} {kind:6s} {best['ms']:.3f} ms {best['tflops']:.0f} TFLOP/s {json.dumps(best['config'])}")


if __name__ == "__main__":
    main()
