"""Where a fwd+bwd step's wall time beyond its kernels' durations lies: the idle time before each kernel of the step,
and how much of it the GPU spent waiting for the host's launch (one device call).

    python3 tools/device/step_gaps.py --out DIR [--seq-len 8192] [--iters 10] [METHOD ...]
                                      (default matched_factored sdpa_cudnn_bf16; causal, D = 128, B 4, H 16)

CUPTI's kernel durations summed (``attn_profile.py``) leave out the time between kernels; ``do_bench`` counts it. For
each method, ``--iters`` steps run back to back under ``torch.profiler`` (CPU and CUDA activity) and the Chrome trace
is read: each kernel (or memset, memcpy) in GPU order, the idle time since the previous one ended (``gap_us``), and
the part of it after which the host's launch call returned only (``host_late_us``: the GPU had nothing queued, so the
host set that gap). The table has one row per kernel of a step (position in the step, averaged over the steps) with
the host's operations that ran between the previous kernel's launch and this one's (``host_ops``: the longest three
``cpu_op`` events there), and ``step_gaps_<method>.md`` / ``.json`` under DIR. The profiler adds its own cost to each
launch, so ``host_late_us`` is an upper bound of the eager step's; compare with ``host_gap.py``.
"""

import argparse
import gzip
import json
import os
import sys
from bisect import bisect_left
from collections import defaultdict

import pandas as pd

from deltamatch.atomic import write_json, write_text

GPU_CATS = ("kernel", "gpu_memset", "gpu_memcpy")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def _short(name: str, width: int = 60) -> str:
    name = name.split("(", 1)[0] if not name.startswith("void ") else name[5:].split("(", 1)[0]
    return name if len(name) <= width else name[: width - 1] + "…"


def gaps(trace: dict, iters: int) -> pd.DataFrame:
    """One row per kernel position of a step (the trace holds ``iters`` identical steps, back to back): ``kernel``,
    ``dur_us``, ``gap_us`` (idle since the previous GPU activity ended; the first kernel of the trace has none),
    ``host_late_us`` (the part of that gap before the launch call returned), ``host_ops``; means over the steps.
    ``attrs["by_step"]``: per step, its gaps, their host-bound part and the host's span from its first launch to its
    last (µs), which say whether the host falls behind in every step or only in the first."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: float(e["ts"]))
    if not gpu:
        raise ValueError("the trace holds no kernel, memset or memcpy events (was CUDA activity profiled?)")
    if len(gpu) % iters:
        raise ValueError(f"{len(gpu)} GPU events do not split into {iters} equal steps: the steps differ")
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    cpu_ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: float(e["ts"]))
    op_starts = [float(op["ts"]) for op in cpu_ops]
    per_step = len(gpu) // iters
    rows = defaultdict(lambda: dict(dur_us=0.0, gap_us=0.0, host_late_us=0.0, ops=defaultdict(float)))
    by_step = [dict(gap_us=0.0, host_late_us=0.0, launch_span_us=0.0) for _ in range(iters)]
    step_launches = [[] for _ in range(iters)]
    prev_end, prev_launch_end = None, None
    for i, e in enumerate(gpu):
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        launch = launches.get(e.get("args", {}).get("correlation"))
        launch_end = float(launch["ts"]) + float(launch.get("dur", 0.0)) if launch else None
        row, step = rows[i % per_step], by_step[i // per_step]
        if launch is not None:
            step_launches[i // per_step].append(float(launch["ts"]))
        row["kernel"] = _short(e["name"])
        row["dur_us"] += dur / iters
        if prev_end is not None:
            gap = max(0.0, ts - prev_end)
            row["gap_us"] += gap / iters
            step["gap_us"] += gap
            if launch_end is not None:
                late = min(gap, max(0.0, launch_end - prev_end))
                row["host_late_us"] += late / iters
                step["host_late_us"] += late
            if launch is not None and prev_launch_end is not None:  # what the host did between the two launches
                between = slice(bisect_left(op_starts, prev_launch_end), bisect_left(op_starts, float(launch["ts"])))
                for op in cpu_ops[between]:
                    row["ops"][op["name"]] += float(op.get("dur", 0.0)) / iters
        prev_end = max(prev_end or 0.0, ts + dur)
        if launch_end is not None:
            prev_launch_end = launch_end
    for step, launched in zip(by_step, step_launches):
        step["launch_span_us"] = max(launched) - min(launched) if launched else 0.0
    out = []
    for pos in range(per_step):
        r = rows[pos]
        top = sorted(r["ops"].items(), key=lambda kv: -kv[1])[:3]
        out.append(dict(pos=pos, kernel=r["kernel"], dur_us=r["dur_us"], gap_us=r["gap_us"],
                        host_late_us=r["host_late_us"],
                        host_ops=", ".join(f"{name} {us:.0f}" for name, us in top)))
    df = pd.DataFrame(out)
    df.attrs["by_step"] = by_step  # each step's gaps, their host-bound part and its first to last launch (µs)
    return df


def host_calls(trace: dict, iters: int, top: int = 8) -> pd.DataFrame:
    """The CUDA runtime and driver calls of a step, by name: calls a step, their host time a step and the longest one
    (µs), the most time first. A call that waits for the GPU (a synchronisation, a blocking copy or allocation) shows
    as a long one here, and as host-bound gaps before the kernels after it."""
    rows = defaultdict(lambda: [0, 0.0, 0.0])
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATS:
            r = rows[e["name"]]
            dur = float(e.get("dur", 0.0))
            r[0], r[1], r[2] = r[0] + 1, r[1] + dur, max(r[2], dur)
    df = pd.DataFrame([dict(call=name, calls=c / iters, us=us / iters, max_us=mx)
                       for name, (c, us, mx) in rows.items()], columns=["call", "calls", "us", "max_us"])
    return df.sort_values("us", ascending=False).head(top).reset_index(drop=True)


def summary(df: pd.DataFrame) -> dict:
    """The step's kernel time, its gaps (the first kernel's gap is the one between steps) and their host-bound part,
    in ms."""
    return dict(kernels_ms=round(df["dur_us"].sum() / 1e3, 4), gaps_ms=round(df["gap_us"].sum() / 1e3, 4),
                host_late_ms=round(df["host_late_us"].sum() / 1e3, 4),
                wall_ms=round((df["dur_us"].sum() + df["gap_us"].sum()) / 1e3, 4))


def profile(method: str, n: int, iters: int, path: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity

    from deltamatch.kernels.bench import profile_step

    step = profile_step(method, n)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    with open(path) as f:
        return json.load(f)


def sync_check(method: str, n: int) -> str:
    """One step under ``torch.cuda.set_sync_debug_mode("error")``: the traceback of the first PyTorch operation in it
    that synchronises the host with the GPU, or "" (operations outside PyTorch, such as a library's own
    synchronisation, are not seen)."""
    import traceback

    import torch

    from deltamatch.kernels.bench import profile_step

    step = profile_step(method, n)
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    except RuntimeError:
        return traceback.format_exc(limit=-12)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    return ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("methods", nargs="*", default=["matched_factored", "sdpa_cudnn_bf16"])
    parser.add_argument("--out", required=True, help="folder for step_gaps_<method>.{md,json}")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--keep-trace", action="store_true", help="keep the Chrome trace (gzipped)")
    parser.add_argument("--sync-debug", action="store_true",
                        help="also run one step under PyTorch's sync debug mode (the first synchronising operation)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for method in args.methods:
        trace_path = os.path.join(args.out, f"trace_{method}.json")
        trace = profile(method, args.seq_len, args.iters, trace_path)
        df, calls = gaps(trace, args.iters), host_calls(trace, args.iters)
        if args.keep_trace:  # gzipped: the device returns a handful of files, each within its size limit
            with open(trace_path, "rb") as f, gzip.open(trace_path + ".gz", "wb") as g:
                g.write(f.read())
        os.remove(trace_path)
        total = summary(df)
        steps = pd.DataFrame(df.attrs["by_step"])
        text = (f"### {method}, N = {args.seq_len}: {json.dumps(total)}\n\n"
                + df.to_markdown(index=False, floatfmt=".1f") + "\n\nCUDA runtime and driver calls a step:\n\n"
                + calls.to_markdown(index=False, floatfmt=".1f") + "\n\nEach step (µs):\n\n"
                + steps.to_markdown(floatfmt=".1f") + "\n")
        print(text)
        record = dict(summary=total, rows=df.to_dict("records"), host_calls=calls.to_dict("records"),
                      by_step=df.attrs["by_step"])
        if args.sync_debug:
            record["sync"] = sync_check(method, args.seq_len)
            print("PyTorch's synchronising operations in a step:", record["sync"] or "none")
        write_text(os.path.join(args.out, f"step_gaps_{method}.md"), text)
        write_json(os.path.join(args.out, f"step_gaps_{method}.json"), record, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
