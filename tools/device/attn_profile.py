"""Where one fwd+bwd of the FP8 attention spends its GPU time, kernel by kernel (``torch.profiler``, CUPTI).

``python3 tools/device/attn_profile.py --out DIR [--methods matched_factored ...] [--seq-len 8192] [--iters 10]``
prints, per method, a table of every kernel the step launches (Triton's, the CUDA library's, PyTorch's) with its
calls and GPU time per step, and writes ``DIR/attn_profile.{json,md}``. The reference shape: causal, D = 128, B 4,
H 16. Environment switches (``DELTAMATCH_KERNEL_*``) apply as in the bench; run the script once per setting to
compare (kernels/NOTES.md). Times are CUPTI's kernel durations, summed: no launch gaps, unlike ``do_bench``.
``--once`` runs the steps (three to warm up, then ``--iters``) without the profiler, for ``ncu`` to launch
(``NCU_DRIVER`` of ``tools/device/ncu_hotspots.sh``).
"""

import argparse
import json
import os
import re
import sys

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile



def short_name(name: str) -> str:
    """A kernel's name without its template arguments and Triton's mangled suffix."""
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"^void ", "", name)
    return name[:70]


def make_step(method: str, n: int, b: int = 4, h: int = 16, d: int = 128):
    """One fwd+bwd of ``method`` (an FP8 mode, or a baseline of ``dm-kernel-bench``: ``sdpa_cudnn_bf16``,
    ``fa4_cute_bf16``, ...) at (B, N, H, D), causal, on random inputs, warmed up (three steps run)."""
    from deltamatch.kernels.bench import _attention

    attend = _attention(method, True)
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()

    def step():
        torch.autograd.grad(attend(q, k, v), (q, k, v), do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    return step


def profile_method(method: str, n: int, iters: int) -> pd.DataFrame:
    step = make_step(method, n)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.device_time_total <= 0:
            continue
        name = short_name(e.name)
        calls, us = rows.get(name, (0, 0.0))
        rows[name] = (calls + 1, us + e.device_time_total)
    df = pd.DataFrame([dict(kernel=k, calls_per_step=c / iters, ms_per_step=us / iters / 1e3)
                       for k, (c, us) in rows.items()])
    df = df.sort_values("ms_per_step", ascending=False).reset_index(drop=True)
    df["share"] = df["ms_per_step"] / df["ms_per_step"].sum()
    return df


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for attn_profile.{json,md} (required but with --once)")
    parser.add_argument("--methods", nargs="+", default=["matched_factored"])
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--tag", default="", help="a suffix for the output files (the switch setting)")
    parser.add_argument("--once", action="store_true", help="run the steps without the profiler (for ncu)")
    args = parser.parse_args(argv)
    if not (args.out or args.once):
        parser.error("--out is required (but with --once)")
    if args.once:
        for method in args.methods:
            step = make_step(method, args.seq_len)
            for _ in range(args.iters):
                step()
        torch.cuda.synchronize()
        return 0
    os.makedirs(args.out, exist_ok=True)
    switches = {k: v for k, v in os.environ.items() if k.startswith("DELTAMATCH_KERNEL_")}
    out, md = {}, []
    for method in args.methods:
        df = profile_method(method, args.seq_len, args.iters)
        total = df["ms_per_step"].sum()
        out[method] = dict(total_ms=total, kernels=df.to_dict(orient="records"))
        md += [f"### {method}, N = {args.seq_len}, switches {switches or 'none'}: {total:.3f} ms of kernels per step",
               "", df.to_markdown(index=False, floatfmt=".3f"), ""]
    text = "\n".join(md)
    print(text)
    tag = f"_{args.tag}" if args.tag else ""
    for ext, body in (("json", json.dumps(dict(seq_len=args.seq_len, switches=switches, methods=out), indent=1)),
                      ("md", text)):
        path = os.path.join(args.out, f"attn_profile{tag}.{ext}")
        with open(path + ".tmp", "w") as f:
            f.write(body)
        os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
