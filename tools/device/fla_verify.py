"""On the H200: fla's gated-delta-rule (and KDA) chunk kernels against FP64/FP32 references, the whole table.

For each key head dim K (V = 2K), length T, initial state or not, and each warp count that fla may autotune
``prepare_wy_repr_bwd`` to (fla #984), the relative RMS error of the output, the final state and every gradient.
fla's own version guard (#640) is lifted for the run, so head dims outside the verified set are measured too.
Writes JSON to --out and prints one row per case.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "models"))
from fla_reference import gdn_errors, kda_errors  # noqa: E402

from deltamatch.models.layers import fla_hopper  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--head-dims", type=int, nargs="*", default=[64, 128])
    parser.add_argument("--lengths", type=int, nargs="*", default=[63, 300, 8192])
    parser.add_argument("--kda-lengths", type=int, nargs="*", default=[63, 300])
    args = parser.parse_args()
    from fla.ops.gated_delta_rule import wy_fast

    rows = []
    with fla_hopper._guard_lifted():
        for K in args.head_dims:
            for warps in (2, 4):
                for T in args.lengths:
                    for h0 in (False, True):
                        start = time.perf_counter()
                        with fla_hopper.restrict_warps(wy_fast.prepare_wy_repr_bwd_kernel, warps):
                            err = gdn_errors(2, T, 2, K, 2 * K, h0)
                        rows.append({"op": "gdn", "K": K, "V": 2 * K, "T": T, "h0": h0, "wy_warps": warps,
                                     "max_err": max(err.values()), "worst": max(err, key=err.get), **err,
                                     "seconds": time.perf_counter() - start})
                        print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in rows[-1].items()}),
                              flush=True)
    for T in args.kda_lengths:
        for h0 in (False, True):
            start = time.perf_counter()
            err = kda_errors(2, T, 2, 128, 256, h0)
            rows.append({"op": "kda", "K": 128, "V": 256, "T": T, "h0": h0, "max_err": max(err.values()),
                         "worst": max(err, key=err.get), **err, "seconds": time.perf_counter() - start})
            print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in rows[-1].items()}),
                  flush=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
