"""Where one fwd+bwd of the FP8 attention spends its GPU time, kernel by kernel (``torch.profiler``, CUPTI), under
the switches of this call (``dm-kernel-bench --profile`` gives the same table for the report).

``python3 tools/device/attn_profile.py --out DIR [--methods matched_factored ...] [--seq-len 8192] [--iters 10]
[--head-dim 128]`` prints, per method, a table of every kernel the step launches (Triton's, the CUDA library's,
PyTorch's) with its calls and GPU time per step, and writes ``DIR/attn_profile.{json,md}``. The reference shape:
causal, D = 128, B 4, H 16 (``--head-dim`` another D at the same B and H). Environment switches (``DELTAMATCH_KERNEL_*``) apply as in the bench; run the script once per setting to
compare (kernels/NOTES.md). Times are CUPTI's kernel durations, summed: no launch gaps, unlike ``do_bench``.
``--once`` runs the steps (three to warm up, then ``--iters``) without the profiler, for ``ncu`` to launch
(``NCU_DRIVER`` of ``tools/device/ncu_hotspots.sh``).
"""

import argparse
import json
import os
import sys

import torch

from deltamatch.kernels.bench import kernel_profile, profile_step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for attn_profile.{json,md} (required but with --once)")
    parser.add_argument("--methods", nargs="+", default=["matched_factored"])
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--tag", default="", help="a suffix for the output files (the switch setting)")
    parser.add_argument("--once", action="store_true", help="run the steps without the profiler (for ncu)")
    args = parser.parse_args(argv)
    if not (args.out or args.once):
        parser.error("--out is required (but with --once)")
    if args.once:
        for method in args.methods:
            step = profile_step(method, args.seq_len, d=args.head_dim)
            for _ in range(args.iters):
                step()
        torch.cuda.synchronize()
        return 0
    os.makedirs(args.out, exist_ok=True)
    switches = {k: v for k, v in os.environ.items() if k.startswith("DELTAMATCH_KERNEL_")}
    out, md = {}, []
    for method in args.methods:
        df = kernel_profile(method, args.seq_len, args.iters, d=args.head_dim).drop(columns="method")
        total = df["ms_per_step"].sum()
        out[method] = dict(total_ms=total, kernels=df.to_dict(orient="records"))
        md += [f"### {method}, N = {args.seq_len}, D = {args.head_dim}, switches {switches or 'none'}: {total:.3f} ms of "
               "kernels per step",
               "", df.to_markdown(index=False, floatfmt=".3f"), ""]
    text = "\n".join(md)
    print(text)
    tag = f"_{args.tag}" if args.tag else ""
    for ext, body in (("json", json.dumps(dict(seq_len=args.seq_len, head_dim=args.head_dim, switches=switches,
                                               methods=out), indent=1)),
                      ("md", text)):
        path = os.path.join(args.out, f"attn_profile{tag}.{ext}")
        with open(path + ".tmp", "w") as f:
            f.write(body)
        os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
