"""Where a fwd+bwd step's host time goes (one device call): cProfile over ``STEPS`` steps queued behind a GPU sleep.

    python3 tools/device/host_profile.py [METHOD] [N]      (default matched_factored 2048; causal, D = 128, B·H = 64)

The GPU is held busy by ``torch.cuda._sleep`` first, so no launch waits on the device and the profile is the host's
own cost (Python, Triton's launcher, the CUDA library's calls, allocations). Prints the functions by own time and by
cumulative time, and the host milliseconds per step.
"""

import cProfile
import io
import pstats
import sys
import time

import torch

STEPS = 10


def main(argv: list[str]) -> None:
    from deltamatch.kernels.bench import _attention, _inputs

    method = argv[0] if argv else "matched_factored"
    n = int(argv[1]) if len(argv) > 1 else 2048
    fn = _attention(method, True)
    (q, k, v), do = _inputs(4, n, 16, 128)

    def step():
        torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ≈ 0.5 s; STEPS' launches stay below the queue's depth
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(STEPS):
        step()
    prof.disable()
    host = (time.perf_counter() - t0) * 1e3 / STEPS
    torch.cuda.synchronize()
    print(f"{method} N = {n}: {host:.3f} ms of host time a step (profiled)")
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(45)
        print(buf.getvalue())


if __name__ == "__main__":
    main(sys.argv[1:])
