"""matched_factored's quantisation passes alone at the reference shape, kernel by kernel (CUPTI), on the H200.

``python3 tools/device/quant_bench.py [--stats-rows 128 256 512 1024] [--iters 20]`` prints one JSON line per case:
the CUDA passes (``cuda_lib.quantize_block_and_channel`` for K centred and V, at each ``--stats-rows``; ``quantize_block``
for Q) and the Triton launches they replace, with each kernel's GPU time per call (ms, the mean over ``--iters``) and
the case's total. B 4, N 8192, H 16, D 128, bf16. Every CUDA case is checked bit for bit against the Triton passes
first (given its K mean), so a timing is never of wrong codes.
"""

import argparse
import json

import torch

from deltamatch.kernels import cuda_lib
from deltamatch.kernels import triton_quant as tq
from deltamatch.kernels.bench import kernel_name


def _kernel_times(fn, iters: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            name = kernel_name(e.name)
            times[name] = times.get(name, 0.0) + e.device_time_total / 1e3 / iters
    return {k: round(v, 4) for k, v in sorted(times.items(), key=lambda kv: -kv[1])}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.view(torch.int32)


def _check(ours, want, what: str) -> None:
    for i, (a, b) in enumerate(zip(ours, want)):
        if not torch.equal(_bits(a), _bits(b)):
            raise SystemExit(f"{what}: output {i} differs from the Triton passes")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stats-rows", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((4, 8192, 16, 128), device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))

    def report(case: str, fn) -> None:
        times = _kernel_times(fn, args.iters)
        print(json.dumps({"case": case, "total_ms": round(sum(times.values()), 4), "kernels": times}), flush=True)

    _check(cuda_lib.quantize_block(q), tq.quantize_operand(q, tq.BLOCK_Q, layouts="token")[::2], "q block")
    report("q block: cuda", lambda: cuda_lib.quantize_block(q))
    report("q block: triton", lambda: tq.quantize_operand(q, tq.BLOCK_Q, layouts="token"))
    for rows in args.stats_rows:
        for name, x, centre in (("k", k, True), ("v", v, False)):
            ours = cuda_lib.quantize_block_and_channel(x, tq.BLOCK_KV, centre=centre, fragment_order=True,
                                                       stats_rows=rows)
            mean = ours[4]
            x8, _, sx = tq.quantize_operand(x, tq.BLOCK_KV, centre=centre, mean=mean, layouts="token")
            _, x8t, sxc = tq.quantize_per_channel(x, name, mean=mean, layouts="channel", fragment_order=True)
            _check(ours[:4], (x8, sx, x8t, sxc), f"{name} stats_rows {rows}")
            report(f"{name} both copies: cuda, stats_rows {rows}",
                   lambda x=x, centre=centre, rows=rows: cuda_lib.quantize_block_and_channel(
                       x, tq.BLOCK_KV, centre=centre, fragment_order=True, stats_rows=rows))
    def triton_k():  # as matched_factored's forward: one token mean for both copies
        mean = tq.token_mean(k)
        tq.quantize_operand(k, tq.BLOCK_KV, centre=True, mean=mean, layouts="token")
        tq.quantize_per_channel(k, "k", mean=mean, layouts="channel", fragment_order=True)

    report("k both copies: triton", triton_k)
    report("v both copies: triton", lambda: (tq.quantize_operand(v, tq.BLOCK_KV, layouts="token"),
                                             tq.quantize_per_channel(v, "v", layouts="channel", fragment_order=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
