"""A fwd+bwd step eager against the same step captured in one CUDA graph (one device call, H200).

    python3 tools/device/graph_step.py [METHOD ...]   (default matched_factored stale sdpa_cudnn_bf16)

Short sequences are host-bound (kernels/NOTES.md, session 18: at N = 2048 matched_factored's host needs more time a
step than its kernels); a training loop that captures its step in a CUDA graph pays the host once, at capture. For
each method and shape (causal, D = 128; B·H = 64 at N = 2K, 4K, 8K, and B·H = 16 at 4K, a training layer's size)
one JSON line: ``eager_ms`` and ``graph_ms`` (``triton.testing.do_bench`` medians of the step and of the graph's
replay), their TFLOP/s by the FlashAttention convention, and ``bits_equal`` (the replay's O, dQ, dK, dV against an
eager step on the same inputs; False for a method whose backward is not bit-reproducible).
"""

import json
import sys

import torch

SHAPES = ((4, 16, 2048), (4, 16, 4096), (4, 16, 8192), (1, 16, 4096))
"""(B, H, N)."""


def measure(method: str, b: int, h: int, n: int, d: int = 128) -> dict:
    from triton.testing import do_bench

    from deltamatch.kernels.bench import _attention, _inputs, flops

    fn = _attention(method, True)
    (q, k, v), do = _inputs(b, n, h, d)

    def step():
        o = fn(q, k, v)
        return (o, *torch.autograd.grad(o, (q, k, v), do))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream (compiles, allocator pools)
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    eager = step()
    torch.cuda.synchronize()
    equal = all(torch.equal(a, e) for a, e in zip(captured, eager))
    eager_ms = do_bench(step, warmup=100, rep=500, return_mode="median")
    graph_ms = do_bench(graph.replay, warmup=100, rep=500, return_mode="median")
    work = 3.5 * flops(b, h, n, d, True, False)
    del graph, captured, eager
    torch.cuda.empty_cache()
    return dict(method=method, batch=b, heads=h, seq_len=n, eager_ms=round(eager_ms, 4), graph_ms=round(graph_ms, 4),
                eager_tflops=round(work / eager_ms * 1e-9, 1), graph_tflops=round(work / graph_ms * 1e-9, 1),
                bits_equal=equal)


def main(argv: list[str]) -> None:
    for b, h, n in SHAPES:
        for method in argv or ["matched_factored", "stale", "sdpa_cudnn_bf16"]:
            try:
                print(json.dumps(measure(method, b, h, n)), flush=True)
            except Exception as exc:  # a method that cannot be captured is a row, not the end of the call
                print(json.dumps(dict(method=method, batch=b, heads=h, seq_len=n, error=repr(exc)[:300])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
