"""Kernel benchmark on one Hopper GPU: ``python benchmarks/kernel_bench.py --out benchmarks/results [--memory] [--profile]``.

A thin wrapper over ``deltamatch.kernels.bench`` (also installed as ``dm-kernel-bench``); see that module for what is
timed and the FLOP convention.
"""

import sys

from deltamatch.kernels.bench import main

if __name__ == "__main__":
    sys.exit(main())
