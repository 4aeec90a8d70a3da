"""Time the CUDA factored dV (M2, ``kernels/cuda/dv_factored.cu``) against Triton's factored dV launch on the same
operands: B·H = 64, N = 8192, D = 128, causal (the shape of kernels/NOTES.md's sweep), each promoted per 64-query
tile (the default, ``ACC_PROMOTE=64``) and not, every CUDA loop structure (``cuda_lib.DV_VARIANTS``); then the CUDA
factored dK (M3a, unpromoted) against Triton's factored dK launch; then the fused, warp-specialised dK/dV against
Triton's two factored launches (dK, dV), and the CUDA dQ against Triton's dQ launch, promoted and not. One JSON row
per variant on stdout and in ``--out``:
``ms`` (``do_bench`` median), ``tflops`` executed (two matmuls, S and dV, halved when causal, as the sweep counts),
and how far the CUDA result is from Triton's (``equal``: bit for bit; ``rel``: relative norm difference).

Usage (repo root, on the H200, after the library is built): ``python tools/device/cuda_dv_bench.py --out FILE``;
``--once`` launches each kernel once (dV promoted, then Triton's and the CUDA dK) for ``ncu``; ``--head-dim 64
--dkdv-only`` (``--dq-only``): the fused dK/dV's (the dQ's) D = 64 build against Triton's factored launch at D = 64.
"""

import argparse
import json
import math
import sys

import torch


def operands(b, h, n, d, causal):
    """Random bf16 inputs through the factored forward and the dÔ passes, as matched_factored's backward sees them."""
    from deltamatch.kernels.triton_attention import fp8_forward
    from deltamatch.kernels.triton_quant import quantize_do_and_delta, quantize_per_channel, token_mean

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4))
    scale = d**-0.5
    o, saved, forward_factored = fp8_forward(q, k, v, causal, "matched_factored", scale)
    do8, do8t, sdo, delta = quantize_do_and_delta(do, o, "matched_factored")
    _, do8t_c, sdoc = quantize_per_channel(do, "do")
    _, do8t_f, _ = quantize_per_channel(do, "do", layouts="channel", fragment_order=True)  # the CUDA dK/dV's
    # K̂ᶜ: natural for Triton's dQ, in fragment order for CUDA's (what the forward writes where CUDA's runs)
    k_mean = token_mean(k)
    _, k8t_c, _ = quantize_per_channel(k, "k", mean=k_mean, layouts="channel")
    _, k8t_f, _ = quantize_per_channel(k, "k", mean=k_mean, layouts="channel", fragment_order=True)
    return dict(saved=saved, do8=do8, do8t=do8t, sdo=sdo, delta=delta, do8t_c=do8t_c, do8t_f=do8t_f, sdoc=sdoc, d=d,
                scale=scale, qk=scale * math.log2(math.e), n=n, causal=causal, k=k, q=q, v=v, k8t_c=k8t_c,
                k8t_f=k8t_f, skc=forward_factored["skc"])


def launchers(ops, promote):
    """(triton, cuda): closures launching each dV into its own output, and the outputs."""
    from deltamatch.kernels import cuda_lib, triton_bwd
    from deltamatch.kernels.triton_fwd import FACTORED_ACC_PROMOTE

    s = ops["saved"]
    cfg = {**triton_bwd.factored_config(triton_bwd.backward_config(128), 128)["dkdv"], "DV_ONLY": True,
           "ACC_PROMOTE": FACTORED_ACC_PROMOTE if promote else None}
    dk, dv = torch.empty_like(ops["k"]), torch.empty_like(ops["k"])
    factored = dict(q8t=ops["do8t_c"], sqc=ops["sdoc"], do8t=ops["do8t_c"], sdoc=ops["sdoc"], rs=ops["delta"])
    out = {}

    def triton_dv():
        triton_bwd._launch_dkdv(s, ops["do8"], ops["do8t"], ops["sdo"], ops["delta"], dk, dv, None, ops["causal"],
                                ops["qk"], ops["scale"], ops["n"], cfg, factored=factored)
        out["triton"] = dv

    def cuda_dv(variant):
        def launch():
            out[variant] = cuda_lib.dv_factored(s["q8"], s["k8"], ops["do8t_c"], s["sq"], s["sk"], ops["sdoc"],
                                                s["lse2"], ops["n"], ops["causal"], ops["qk"], promote=promote,
                                                variant=variant)
        return launch

    return triton_dv, {v: cuda_dv(v) for v in cuda_lib.DV_VARIANTS
                       if not (promote and v in cuda_lib.DV_UNPROMOTED_ONLY)}, out


def matched_operands(ops):
    """What the factored dK and dQ launches also read: matched's δ with dŜ's row scales s (the δ pass), Q' = s ⊙ Q
    per channel. Formed once per operand set and kept in ``ops`` (the dK, dK/dV and dQ rows share them)."""
    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_quant import quantize_per_channel

    if "matched" not in ops:
        cfg = triton_bwd.factored_config(triton_bwd.backward_config(ops["d"]), ops["d"])
        delta, rs = ops["delta"].clone(), torch.empty_like(ops["delta"])
        irs = triton_bwd._launch_delta_matched(ops["saved"], ops["do8"], ops["sdo"], delta, True, ops["qk"],
                                               ops["n"], cfg["delta"], row_scales=rs)
        _, q8t_c, sqc = quantize_per_channel(ops["q"], "q", row_scales=rs)
        _, q8t_f, _ = quantize_per_channel(ops["q"], "q", row_scales=rs, layouts="channel", fragment_order=True)
        ops["matched"] = dict(delta_m=delta, rs=rs, irs=irs, q8t_c=q8t_c, q8t_f=q8t_f, sqc=sqc, cfg=cfg)
    return ops["matched"]


def timed(name, fn, do_bench, base, out=None, ref=None):
    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
    row = dict(kernel=name, **base, ms=round(ms, 4))
    if out is not None:
        row.update(equal=all(torch.equal(a, b) for a, b in zip(out, ref)),
                   rel=max(float((a.double() - b.double()).norm() / b.double().norm()) for a, b in zip(out, ref)))
    print(json.dumps(row), flush=True)
    return row


def dk_rows(ops, args, flop, do_bench):
    """The CUDA factored dK (M3a, unpromoted) against Triton's factored dK launch (``DK_ONLY``, ``ACC_PROMOTE=None``),
    on matched's δ and dŜ's row scales from the δ pass and Q' = s ⊙ Q per channel."""
    from deltamatch.kernels import cuda_lib, triton_bwd

    s = ops["saved"]
    m = matched_operands(ops)
    dk_cfg = {**m["cfg"]["dkdv"], "DK_ONLY": True, "ACC_PROMOTE": None}
    dk, dv = torch.empty_like(ops["k"]), torch.empty_like(ops["k"])
    factored = dict(q8t=m["q8t_c"], sqc=m["sqc"], do8t=ops["do8t_c"], sdoc=ops["sdoc"], rs=m["rs"])
    out = {}

    def triton_dk():
        triton_bwd._launch_dkdv(s, ops["do8"], ops["do8t"], ops["sdo"], m["delta_m"], dk, dv, None, True, ops["qk"],
                                ops["scale"], ops["n"], dk_cfg, factored=factored)
        out["triton"] = dk

    def cuda_dk():
        out["cuda"] = cuda_lib.dk_factored(s["q8"], s["k8"], s["v8"], ops["do8"], m["q8t_c"], s["sq"], s["sk"],
                                           s["sv"], ops["sdo"], m["sqc"], m["rs"], s["lse2"], m["delta_m"], ops["n"],
                                           True, ops["qk"], ops["scale"])

    triton_dk(), cuda_dk()
    torch.cuda.synchronize()
    base = dict(promoted=False, b_h=args.bh, n=args.n, d=128, causal=True)
    rows = [timed("dk_factored_triton", triton_dk, do_bench, base),
            timed("dk_factored_cuda", cuda_dk, do_bench, dict(base, variant="tma3"), [out["cuda"]], [out["triton"]])]
    for row in rows:
        row["tflops"] = round(flop / row["ms"] / 1e9, 1)
    return rows


def dkdv_rows(ops, args, flop, do_bench, variants=None):
    """The fused CUDA dK/dV (``cuda_lib.dkdv_factored``, each of ``DKDV_VARIANTS``) against Triton's two factored
    launches (dK, then dV), promoted and not. ``flop``: the four matmuls (S, dP, dV, dK) the fused kernel executes."""
    from deltamatch.kernels import cuda_lib, triton_bwd
    from deltamatch.kernels.triton_fwd import FACTORED_ACC_PROMOTE

    s = ops["saved"]
    m = matched_operands(ops)
    factored = dict(q8t=m["q8t_c"], sqc=m["sqc"], do8t=ops["do8t_c"], sdoc=ops["sdoc"], rs=m["rs"])
    rows = []
    for promote in (True, False):
        cfg = {**m["cfg"]["dkdv"], "ACC_PROMOTE": FACTORED_ACC_PROMOTE if promote else None}
        dk, dv = torch.empty_like(ops["k"]), torch.empty_like(ops["k"])

        def triton_dkdv():
            triton_bwd._launch_dkdv(s, ops["do8"], ops["do8t"], ops["sdo"], m["delta_m"], dk, dv, None, True,
                                    ops["qk"], ops["scale"], ops["n"], cfg, factored=factored)

        def cuda_dkdv(variant):
            return lambda: cuda_lib.dkdv_factored(
                s["q8"], s["k8"], s["v8"], ops["do8"], m["q8t_f"], ops["do8t_f"], s["sq"], s["sk"], s["sv"],
                ops["sdo"], m["sqc"], ops["sdoc"], m["rs"], s["lse2"], m["delta_m"], ops["n"], True, ops["qk"],
                ops["scale"], promote=promote, variant=variant, irs=m["irs"])

        triton_dkdv()
        base = dict(promoted=promote, b_h=args.bh, n=args.n, d=ops["d"], causal=True)
        rows.append(timed("dkdv_factored_triton", triton_dkdv, do_bench, base))
        for variant in variants or (cuda_lib.DKDV_D64_VARIANTS if ops["d"] == 64 else cuda_lib.DKDV_VARIANTS):
            if (promote and variant in cuda_lib.DKDV_UNPROMOTED_ONLY) or variant in cuda_lib.DKDV_DQ_ONLY:
                continue
            fn = cuda_dkdv(variant)
            got = fn()
            torch.cuda.synchronize()
            rows.append(timed("dkdv_factored_cuda", fn, do_bench, dict(base, variant=variant), got, (dk, dv)))
    for row in rows:
        row["tflops"] = round(flop / row["ms"] / 1e9, 1)
    return rows


def dq_rows(ops, args, flop, do_bench):
    """The CUDA factored dQ (``cuda_lib.dq_factored``) against Triton's factored dQ launch, promoted and not.
    ``flop``: its three matmuls (S, dP, dQ)."""
    from deltamatch.kernels import cuda_lib, triton_bwd
    from deltamatch.kernels.triton_fwd import FACTORED_ACC_PROMOTE

    s = ops["saved"]
    m = matched_operands(ops)
    rows = []
    for promote in (True, False):
        cfg = {**m["cfg"]["dq"], "ACC_PROMOTE": FACTORED_ACC_PROMOTE if promote else None}
        dq = torch.empty_like(ops["q"])

        def triton_dq():
            triton_bwd._launch_dq(s, ops["do8"], ops["sdo"], m["delta_m"], dq, None, True, ops["qk"], ops["scale"],
                                  ops["n"], cfg, factored=dict(k8t=ops["k8t_c"], skc=ops["skc"], rs=m["rs"]))

        def cuda_dq(variant):
            return lambda: cuda_lib.dq_factored(
                s["q8"], s["k8"], s["v8"], ops["do8"], ops["k8t_f"], s["sq"], s["sk"], s["sv"], ops["sdo"], ops["skc"],
                m["rs"], s["lse2"], m["delta_m"], ops["n"], True, ops["qk"], ops["scale"], promote=promote,
                variant=variant)

        triton_dq()
        base = dict(promoted=promote, b_h=args.bh, n=args.n, d=ops["d"], causal=True)
        rows.append(timed("dq_factored_triton", triton_dq, do_bench, base))
        for variant in cuda_lib.DQ_VARIANTS:
            got = cuda_dq(variant)()
            torch.cuda.synchronize()
            rows.append(timed("dq_factored_cuda", cuda_dq(variant), do_bench, dict(base, variant=variant), [got],
                              [dq]))
    for row in rows:
        row["tflops"] = round(flop / row["ms"] / 1e9, 1)
    return rows


def dqdkdv_launcher(ops):
    """``fused(variant, ordered, sections, sync, dq_acc=None)``: a closure launching ``cuda_lib.dqdkdv_factored`` on
    ``ops`` (causal, with matched's δ and row scales), ``sections`` 0 for ``ordered_section_heads``'s choice, its FP32
    sums into ``dq_acc`` where given; dq_clock.py and dq_stress.py launch it too."""
    from deltamatch.kernels import cuda_lib

    s = ops["saved"]
    m = matched_operands(ops)

    def fused(variant, ordered, sections, sync, dq_acc=None):
        return lambda: cuda_lib.dqdkdv_factored(
            s["q8"], s["k8"], s["v8"], ops["do8"], m["q8t_f"], ops["do8t_f"], ops["k8t_f"], s["sq"], s["sk"], s["sv"],
            ops["sdo"], m["sqc"], ops["sdoc"], ops["skc"], m["rs"], s["lse2"], m["delta_m"], ops["n"], True,
            ops["qk"], ops["scale"], variant=variant, irs=m["irs"], ordered=ordered,
            section_heads=(sections or None) if ordered else None, sync=sync, dq_acc=dq_acc)

    return fused


def dqdkdv_rows(ops, args, flop, do_bench):
    """dQ inside the dK/dV launch (``cuda_lib.dqdkdv_factored``, each of ``DKDV_WITH_DQ``; its adds in any order, then
    ordered with each of ``args.sections`` kv heads interleaved, 0 for ``ordered_section_heads``'s choice) against
    the pair it replaces (the fused dK/dV, then the dQ kernel), promoted. ``flop``: the five matmuls (S, dP, dV, dK,
    dQ) the one launch executes. ``equal`` and ``rel``: dK and dV against the pair's (bit for bit); ``dq_rel``: dQ's
    relative difference from the dQ kernel's."""
    from deltamatch.kernels import cuda_lib

    s = ops["saved"]
    m = matched_operands(ops)
    common = (ops["sdo"], m["sqc"], ops["sdoc"])

    def pair(variant):
        def launch():
            dk, dv = cuda_lib.dkdv_factored(
                s["q8"], s["k8"], s["v8"], ops["do8"], m["q8t_f"], ops["do8t_f"], s["sq"], s["sk"], s["sv"], *common,
                m["rs"], s["lse2"], m["delta_m"], ops["n"], True, ops["qk"], ops["scale"], variant=variant,
                irs=m["irs"])
            dq = cuda_lib.dq_factored(
                s["q8"], s["k8"], s["v8"], ops["do8"], ops["k8t_f"], s["sq"], s["sk"], s["sv"], ops["sdo"], ops["skc"],
                m["rs"], s["lse2"], m["delta_m"], ops["n"], True, ops["qk"], ops["scale"])
            return dq, dk, dv
        return launch

    fused = dqdkdv_launcher(ops)

    base = dict(promoted=True, b_h=args.bh, n=args.n, d=128, causal=True)
    ref = pair("ws3")()
    rows = [timed("dkdv_then_dq_cuda", pair("ws3"), do_bench, dict(base, variant="ws3"))]
    for variant in cuda_lib.DKDV_WITH_DQ:
        # any order; ordered with each section size and each way to order the adds (``dqdkdv_factored``'s ``sync``:
        # 3 is the control, the ordered launch order without waits)
        forms = ([] if variant in cuda_lib.DKDV_ORDERED_ONLY else [(False, 0, 0)]) + [
            (True, k, sync) for k in args.sections for sync in args.syncs]
        for ordered, heads, sync in forms:
            launch = fused(variant, ordered, heads, sync)
            got = launch()
            torch.cuda.synchronize()
            dq_rel = float((got[0].double() - ref[0].double()).norm() / ref[0].double().norm())
            extra = dict(ordered=ordered, sync=sync, sections=heads, dq_rel=dq_rel)
            rows.append(timed("dqdkdv_factored_cuda", launch, do_bench, dict(base, variant=variant, **extra),
                              got[1:], ref[1:]))
    for row in rows:
        row["tflops"] = round(flop / row["ms"] / 1e9, 1)
    return rows


def delta_rows(ops, args, flop, do_bench):
    """The CUDA δ pass with dŜ's row scales (``cuda_lib.delta_factored``) against Triton's (``_launch_delta_matched``
    with row scales), each variant. ``flop``: its two matmuls (S, dP)."""
    from deltamatch.kernels import cuda_lib, triton_bwd

    s = ops["saved"]
    cfg = triton_bwd.factored_config(triton_bwd.backward_config(128), 128)["delta"]
    delta, rs = ops["delta"].clone(), torch.empty_like(ops["delta"])

    def triton_delta():
        triton_bwd._launch_delta_matched(s, ops["do8"], ops["sdo"], delta, True, ops["qk"], ops["n"], cfg,
                                         row_scales=rs)

    def cuda_delta(variant):
        return lambda: cuda_lib.delta_factored(s["q8"], s["k8"], s["v8"], ops["do8"], s["sq"], s["sk"], s["sv"],
                                               ops["sdo"], s["lse2"], ops["n"], True, ops["qk"], variant=variant)

    triton_delta()
    base = dict(b_h=args.bh, n=args.n, d=128, causal=True)
    rows = [timed("delta_factored_triton", triton_delta, do_bench, base)]
    for variant in cuda_lib.DELTA_VARIANTS:
        got = cuda_delta(variant)()
        torch.cuda.synchronize()
        rows.append(timed("delta_factored_cuda", cuda_delta(variant), do_bench, dict(base, variant=variant), list(got),
                          [delta, rs]))
    for row in rows:
        row["tflops"] = round(flop / row["ms"] / 1e9, 1)
    return rows


def fwd_rows(ops, args, flop, do_bench):
    """The CUDA factored forward (``cuda_lib.fwd_factored``) against Triton's factored forward, promoted and not, on
    the codes the forward reads (Q̂, K̂ token-major; V̂ᶜ channel-major). ``flop``: its two matmuls (S, PV)."""
    from deltamatch.kernels import cuda_lib, triton_fwd
    from deltamatch.kernels.triton_quant import quantize_per_channel

    s, q = ops["saved"], ops["q"]
    _, v8t_c, svc = quantize_per_channel(ops["v"], "v", layouts="channel")
    rows = []
    for promote in (True, False):
        cfg = {**triton_fwd.forward_config(128, factored=True),
               "ACC_PROMOTE": triton_fwd.FACTORED_ACC_PROMOTE if promote else None}

        def triton_fwd_launch():
            return triton_fwd.attention_forward(s["q8"], s["k8"], v8t_c, s["sq"], s["sk"], svc, q.shape, q.dtype, True,
                                                ops["scale"], config=cfg)

        def cuda_fwd(variant):
            return lambda: cuda_lib.fwd_factored(s["q8"], s["k8"], v8t_c, s["sq"], s["sk"], svc, tuple(q.shape), True,
                                                 ops["qk"], promote=promote, variant=variant)

        ref = triton_fwd_launch()
        base = dict(promoted=promote, b_h=args.bh, n=args.n, d=128, causal=True)
        rows.append(timed("fwd_factored_triton", triton_fwd_launch, do_bench, base))
        for variant in cuda_lib.FWD_VARIANTS:
            got = cuda_fwd(variant)()
            torch.cuda.synchronize()
            rows.append(timed("fwd_factored_cuda", cuda_fwd(variant), do_bench, dict(base, variant=variant), list(got),
                              list(ref)))
    for row in rows:
        row["tflops"] = round(flop / row["ms"] / 1e9, 1)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSONL file for the rows")
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--bh", type=int, default=64)
    parser.add_argument("--once", action="store_true",
                        help="launch each kernel once, untimed (for a profiler: ncu -k ...)")
    parser.add_argument("--fused-only", action="store_true",
                        help="time only the warp-specialised kernels (forward, dK/dV, dQ) and Triton's launches")
    parser.add_argument("--forward-only", action="store_true", help="time only the forward and Triton's")
    parser.add_argument("--head-dim", type=int, default=128, choices=(64, 128),
                        help="64: with --dkdv-only or --dq-only only")
    parser.add_argument("--dkdv-only", action="store_true", help="time only the fused dK/dV and Triton's")
    parser.add_argument("--dq-only", action="store_true", help="time only the dQ kernel and Triton's")
    parser.add_argument("--dq-fused-only", action="store_true",
                        help="time only dQ inside the dK/dV launch against the dK/dV and dQ launches it replaces")
    parser.add_argument("--sections", type=int, nargs="+", default=[0],
                        help="kv heads the ordered dQ-in-dK/dV launch interleaves, each timed (0: its default)")
    parser.add_argument("--syncs", type=int, nargs="+", default=[0],
                        help="how the ordered form orders its adds, each timed (dqdkdv_factored's sync: 0 .. 4)")
    args = parser.parse_args(argv)
    if args.head_dim != 128 and not (args.dkdv_only or args.dq_only):
        parser.error("--head-dim 64 times the fused dK/dV or the dQ only: add --dkdv-only or --dq-only")
    from triton.testing import do_bench

    d, h = args.head_dim, 16
    b = args.bh // h
    ops = operands(b, h, args.n, d, causal=True)
    flop = 2 * 2 * args.bh * args.n**2 * d * 0.5
    rows = []
    if args.once:
        triton_dv, cuda_dvs, _ = launchers(ops, True)
        for fn in (triton_dv, *cuda_dvs.values()):
            fn()
        dk_rows(ops, args, flop * 1.5, lambda fn, **_: 1.0)  # Triton's dK, then the CUDA dK, once each (untimed)
        dkdv_rows(ops, args, flop * 2, lambda fn, **_: 1.0, variants=("ws3", "ws3s"))
        dq_rows(ops, args, flop * 1.5, lambda fn, **_: 1.0)
        fwd_rows(ops, args, flop, lambda fn, **_: 1.0)
        delta_rows(ops, args, flop, lambda fn, **_: 1.0)
        dqdkdv_rows(ops, args, flop * 2.5, lambda fn, **_: 1.0)
        torch.cuda.synchronize()
        return 0
    if args.dkdv_only or args.dq_only or args.dq_fused_only:
        if args.dkdv_only:
            rows += dkdv_rows(ops, args, flop * 2, do_bench)  # four matmuls (S, dP, dV, dK)
        if args.dq_only:
            rows += dq_rows(ops, args, flop * 1.5, do_bench)  # three (S, dP, dQ)
        if args.dq_fused_only:
            rows += dqdkdv_rows(ops, args, flop * 2.5, do_bench)  # five matmuls (S, dP, dV, dK, dQ)
        if args.out:
            with open(args.out, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        return 0
    rows += fwd_rows(ops, args, flop, do_bench)  # the forward: two matmuls (S, PV)
    rows += delta_rows(ops, args, flop, do_bench)  # the δ pass: two (S, dP)
    for promote in () if args.fused_only or args.forward_only else (True, False):
        triton_dv, cuda_dvs, out = launchers(ops, promote)
        triton_dv()
        for fn in cuda_dvs.values():
            fn()
        torch.cuda.synchronize()
        for name, fn in (("triton", triton_dv), *cuda_dvs.items()):
            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
            row = dict(kernel=f"dv_factored_{'triton' if name == 'triton' else 'cuda'}", promoted=promote,
                       b_h=args.bh, n=args.n, d=d, causal=True, ms=round(ms, 4), tflops=round(flop / ms / 1e9, 1))
            if name != "triton":
                diff = (out[name].double() - out["triton"].double()).norm() / out["triton"].double().norm()
                row.update(variant=name, equal=torch.equal(out[name], out["triton"]), rel=float(diff))
            rows.append(row)
            print(json.dumps(row), flush=True)
    if not (args.fused_only or args.forward_only):
        rows += dk_rows(ops, args, flop * 1.5, do_bench)  # dK: three matmuls (S, dP, dK) where dV has two
    if not args.forward_only:
        rows += dkdv_rows(ops, args, flop * 2, do_bench)  # the fused dK/dV: four (S, dP, dV, dK)
        rows += dq_rows(ops, args, flop * 1.5, do_bench)  # dQ: three (S, dP, dQ)
        rows += dqdkdv_rows(ops, args, flop * 2.5, do_bench)  # dQ in the dK/dV launch: five
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
