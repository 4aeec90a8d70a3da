"""Four clocks on one fwd+bwd step, in one process, so that they can be held against each other (one device call).

    python3 tools/device/timing_check.py [--seq-len N] [METHOD ...]   (default matched_factored sdpa_cudnn_bf16
                                                                      fa4_cute_bf16; causal, D = 128, B·H = 64)

Session 38's bench and profile disagreed for FlashAttention's CuTe-DSL kernels only: CUPTI summed 7.39 ms a step where
``do_bench`` gave 6.66, while for ours (7.30 / 7.34) and cuDNN BF16 (7.28 / 7.44) they agreed. A gap to FA4 read off
either is only as good as that agreement. For each method, on the same inputs, one after another:

- ``bench_ms``: ``triton.testing.do_bench``'s median (the bench's number: an L2 flush before each step);
- ``events_ms``: CUDA events on the current stream around ``STEPS`` back-to-back steps (``bench.events_ms``);
- ``wall_ms``: ``time.perf_counter`` around the same steps, a device synchronisation before and after;
- ``events_in_wall_ms``: CUDA events recorded inside those wall-clock runs (session 41: ``events_ms`` still read
  0.76–0.85 ms above the wall clock with the device synchronised first; events inside the wall clock's own runs
  cannot exceed it unless the events themselves are off);
- ``cupti_ms``: ``torch.profiler``'s kernel durations (CUPTI) of ``STEPS`` steps, summed a step;
- ``streams``: the CUDA streams CUPTI saw the step's kernels on (a kernel off the current stream escapes the events
  and ``do_bench`` alike, and only CUPTI and the wall clock see it).

Each is the median of three rounds. A method that does not import is a row with its error.
"""

import json
import statistics
import sys
import time

import torch

STEPS = 10


def _rounds(fn, rounds: int = 3) -> float:
    return statistics.median(fn() for _ in range(rounds))


def measure(method: str, n: int) -> dict:
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench

    from deltamatch.kernels.bench import events_ms, profile_step

    step = profile_step(method, n)  # the bench's causal fwd+bwd at B 4, H 16, D 128, warmed up

    paired: list[float] = []  # the events' reading of each wall-clock run

    def wall():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        for _ in range(STEPS):
            step()
        end.record()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / STEPS
        paired.append(start.elapsed_time(end) / STEPS)
        return ms

    streams: set[int] = set()

    def cupti():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and e.device_time_total > 0]
        streams.update(getattr(e, "device_resource_id", -1) for e in kernels)
        return sum(e.device_time_total for e in kernels) / STEPS / 1e3

    return dict(method=method, seq_len=n, bench_ms=round(_rounds(lambda: do_bench(step, warmup=50, rep=200,
                                                                                  return_mode="median")), 4),
                events_ms=round(_rounds(lambda: events_ms(step, STEPS)), 4), wall_ms=round(_rounds(wall), 4),
                events_in_wall_ms=round(statistics.median(paired), 4),
                cupti_ms=round(_rounds(cupti), 4), streams=sorted(streams),
                current_stream=torch.cuda.current_stream().cuda_stream)


def main(argv: list[str]) -> None:
    n = 8192
    if argv[:1] == ["--seq-len"]:
        n, argv = int(argv[1]), argv[2:]
    for method in argv or ["matched_factored", "sdpa_cudnn_bf16", "fa4_cute_bf16"]:
        try:
            row = measure(method, n)
        except Exception as err:  # a baseline that does not import here (flash-attn-4 is staged by hand)
            row = dict(method=method, seq_len=n, error=f"{type(err).__name__}: {err}"[:300])
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
