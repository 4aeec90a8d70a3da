"""Time matched_factored's forward with a backward to follow (inputs that need a gradient) and without one
(``torch.no_grad``, as evaluation runs it), in one process on the H200.

    python3 tools/device/forward_bench.py [--seq-lens 8192 16384] [--repeats 3] [--out FILE.jsonl]

Causal, D = 128, B·H = 64 (the reference shape's heads). The two forms alternate, ``repeats`` do_bench medians each,
so a drift of the machine shows in both; one JSON line per (N, form) with the medians and TFLOP/s.
"""

import argparse
import json
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", default="matched_factored")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("no GPU: this bench times the H200's forward")
    from triton.testing import do_bench

    from deltamatch.kernels.bench import flops
    from deltamatch.kernels.triton_attention import triton_attention

    rows = []
    for n in args.seq_lens:
        b, h, d = 4, 16, 128  # B·H = 64
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        trained = [t.clone().requires_grad_() for t in (q, k, v)]

        def with_grad():
            return triton_attention(*trained, True, args.mode)

        def no_grad():
            with torch.no_grad():
                return triton_attention(q, k, v, True, args.mode)

        times = {"with_grad": [], "no_grad": []}
        for _ in range(args.repeats):
            for name, fn in (("with_grad", with_grad), ("no_grad", no_grad)):
                times[name].append(do_bench(fn, warmup=25, rep=200, return_mode="median"))
        for name, ms in times.items():
            best = min(ms)
            rows.append(dict(mode=args.mode, seq_len=n, batch=b, heads=h, head_dim=d, form=name, ms=ms,
                             tflops=flops(b, h, n, d, True, False) / best * 1e-9))
            print(json.dumps(rows[-1]))
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
