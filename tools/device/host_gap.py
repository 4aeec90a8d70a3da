"""Where a fwd+bwd step's time beyond its kernels goes: the host's launch cost against the GPU's step (one device call).

    python3 tools/device/host_gap.py [--seq-len N] [METHOD ...]   (default matched_factored sdpa_cudnn_bf16; causal,
                                                                  D = 128, N = 8192, B·H = 64, the bench's step)

For each method, three numbers per step, each the median of five rounds of ``STEPS`` steps:
- ``host_ms``: the Python/launch time of a step with the GPU held busy by ``torch.cuda._sleep`` first, so no launch
  waits on the device (the host's cost alone; a step cannot run faster than this);
- ``gpu_ms``: CUDA events around ``STEPS`` back-to-back steps (``bench.events_ms``: no cache flush between them, so
  a little below ``do_bench``'s figure);
- ``bench_ms``: ``triton.testing.do_bench``'s median, as ``deltamatch.kernels.bench`` measures it.
Where ``host_ms`` approaches ``gpu_ms`` the step is launch-bound and a CUDA graph or fewer launches would show; where
it is far below, the gaps between kernels are the device's own (launch latency, dependent small kernels).
``STEPS`` is small on purpose: the launches queued behind the sleep must not fill the device's launch queue (≈ 1,000
entries), or the host would wait on it and the "host" time would include the sleep (session 18's first profile did).
"""

import json
import statistics
import sys
import time

import torch

STEPS = 10


def measure(method: str, n: int = 8192) -> dict:
    from triton.testing import do_bench

    from deltamatch.kernels.bench import events_ms, profile_step

    step = profile_step(method, n)  # the bench's causal fwd+bwd at B 4, H 16, D 128, warmed up
    host, gpu = [], []
    for _ in range(5):
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s of spinning on the device: the launches below queue behind it
        t0 = time.perf_counter()
        for _ in range(STEPS):
            step()
        host.append((time.perf_counter() - t0) * 1e3 / STEPS)
        gpu.append(events_ms(step, STEPS))  # once the sleep and the queued steps are done
    bench = do_bench(step, warmup=100, rep=500, return_mode="median")
    return dict(method=method, seq_len=n, host_ms=round(statistics.median(host), 4),
                gpu_ms=round(statistics.median(gpu), 4), bench_ms=round(bench, 4))


def main(argv: list[str]) -> None:
    n = 8192
    if argv[:1] == ["--seq-len"]:
        n, argv = int(argv[1]), argv[2:]
    for method in argv or ["matched_factored", "sdpa_cudnn_bf16"]:
        print(json.dumps(measure(method, n)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
