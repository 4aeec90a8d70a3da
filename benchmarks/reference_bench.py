"""Times the PyTorch reference's forward+backward on the CPU (the simulation the embedded default trains with).

    .venv/bin/python benchmarks/reference_bench.py [--out benchmarks/results/reference_cpu.md]

Prints a table of median wall time per (method, N) and writes it as Markdown with date, commit and machine.
"""

import argparse
import datetime
import platform
import statistics
import time

import pandas as pd
import torch

from deltamatch.kernels.reference import attention_reference
from deltamatch.methods import simulated_methods
from deltamatch.provenance import commit

METHODS = simulated_methods()


def time_case(method: str, n: int, heads: int, head_dim: int, repeats: int) -> float:
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, n, heads, head_dim, generator=gen) for _ in range(4))
    q, k, v = (t.bfloat16().requires_grad_() for t in (q, k, v))
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        attention_reference(q, k, v, True, method).backward(do.bfloat16())
        if i:  # the first run is warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/reference_cpu.md")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = [
        {"method": m, "N": n, "fwd+bwd ms": 1e3 * time_case(m, n, args.heads, args.head_dim, args.repeats)}
        for m in METHODS
        for n in args.lengths
    ]
    table = pd.DataFrame(rows).pivot(index="method", columns="N", values="fwd+bwd ms").loc[list(METHODS)]
    header = (
        f"# Reference fwd+bwd on the CPU\n\ndate {datetime.date.today()}, commit {commit()}, "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"B=1, H={args.heads}, D={args.head_dim}, causal, bf16 inputs; median of {args.repeats} runs, ms\n\n"
    )
    markdown = header + table.to_markdown(floatfmt=".1f") + "\n"
    with open(args.out, "w") as f:
        f.write(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
