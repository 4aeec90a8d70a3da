"""Is the ordered dQ-in-dK/dV form's order kept under load? Many launches of ``cuda_lib.dqdkdv_factored(ordered=True)``
at several shapes, section sizes and ``sync`` forms, every launch's FP32 sums (``dq_acc``, before the epilogue's cast,
so that one add out of order cannot hide in a bf16 rounding) and its dQ compared bit for bit with the first launch of
its shape (sync 0 counts each add once its writes have completed, the order the memory model guarantees; sync 11
counts an add once the bulk copy has read it, FA3's discipline: the same order, if the L2 applies two adds into a tile
in the order they were issued). Each tile's first add is a plain store in both. One JSON row per (shape, sync,
sections) on stdout and in ``--out``: launches, how many sums and dQ differ from the reference bits, the worst relative
difference of the sums. GQA, non-causal and ragged shapes are in the GPU tests
(``test_ordered_dq_is_bit_reproducible_however_the_launch_is_sectioned``); this is the long run at full size.

Usage (repo root, on the H200): ``python3 tools/device/dq_stress.py --out FILE [--repeats 200] [--syncs 0 11]``.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = ((8192, 64), (16384, 32), (4096, 128))
"""(N, B·H), causal, D = 128, 16 heads a batch: the reference shape, a longer one, a wider one."""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSONL file for the rows")
    parser.add_argument("--repeats", type=int, default=200, help="launches per (shape, sync, sections)")
    parser.add_argument("--syncs", type=int, nargs="+", default=[0, 11])
    parser.add_argument("--sections", type=int, nargs="+", default=[0, 1, 2, 4],
                        help="kv heads interleaved per section (0: ordered_section_heads' choice)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("dq_stress.py needs the H200 (a CUDA device and the library built by dm-cuda-build)")
    import cuda_dv_bench as bench
    from deltamatch.kernels.triton_quant import padded_len

    rows = []
    for n, bh in SHAPES:
        h, d = 16, 128
        fused = bench.dqdkdv_launcher(bench.operands(bh // h, h, n, d, causal=True))
        acc = torch.empty((bh // h, h, padded_len(n), d), dtype=torch.float32, device="cuda")

        def launch(sync, sections):
            acc.fill_(float("nan"))  # a tile its first add did not store stays NaN
            return fused("ws3", True, sections, sync, acc)()[0]

        reference = launch(0, 0).clone()
        reference_acc = acc.clone()
        unstored = int(reference_acc.isnan().sum())  # elements of tiles no add stored into: none expected
        torch.cuda.synchronize()
        for sync in args.syncs:
            for sections in args.sections:
                differ = sums_differ = 0
                worst = 0.0
                for _ in range(args.repeats):
                    dq = launch(sync, sections)
                    if not torch.equal(acc, reference_acc):
                        sums_differ += 1
                        a, r = acc.double().nan_to_num(1e30), reference_acc.double()
                        worst = max(worst, float((a - r).norm() / r.norm()))
                    differ += not torch.equal(dq, reference)
                row = dict(n=n, b_h=bh, causal=True, sync=sync, sections=sections, launches=args.repeats,
                           sums_differ=sums_differ, dq_differ=differ, worst_rel=worst, unstored=unstored)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    bad = sum(r["sums_differ"] + r["dq_differ"] + r["unstored"] for r in rows)
    print(f"{sum(r['launches'] for r in rows)} launches, {bad} sums or dQ with other bits than their shape's first")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
