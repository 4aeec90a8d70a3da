"""Matched's δ from a forward product: what rounding P as a tensor-core operand costs the softmax-gradient invariant.

Matched's δ_i = Σ_j P_ij dP̂_ij with dP̂ = dÔ V̂ᵀ reassociates to Σ_k dÔ_ik (P V̂)_ik, so the forward could form
Ô' = P V̂ beside O = P̂ V̂ and the backward take δ = rowsum(dÔ ⊙ Ô'), as FlashAttention takes rowsum(dO ⊙ O), with no δ
pass (1.18 ms of the 7.46 ms step on the H200, kernels/NOTES.md session 27). The reference's ``FORWARD_PV_KINDS`` are
that δ with P exact (``pv_fp32``), in TF32 and in BF16. This prints the sweep's measures (``dm-sweep``'s inputs: random
heads, Gaussian and outlier families, the score spreads; the median over seeds) for stale, consistent, matched and the
three, under the paper's block scales (``matched``) and the factored layout the CUDA kernels run
(``matched_factored``): the row-sum residual of dS before and after its FP8 cast, dK's column-sum share and dQ's and
dK's and dV's error against FP64 autograd (``sweep.probe_measures``).

Usage: ``python tools/delta_pv_probe.py [--seeds 3] [--tokens 512] [--out FILE.csv]`` (CPU, about a minute).
"""

import argparse
import sys

import pandas as pd
import torch

from deltamatch.kernels.reference import FORWARD_PV_KINDS, attention_exact, probe_backward
from deltamatch.kernels.sweep import SweepConfig, make_inputs, probe_measures

KINDS = ("stale", "consistent", "matched", *FORWARD_PV_KINDS)
METHODS = ("matched", "matched_factored")
COLUMNS = ("rowsum_before_cast", "rowsum_after_cast", "dk_colsum", "relerr_dq", "relerr_dk", "relerr_dv")


def measure(cfg: SweepConfig, methods=METHODS, kinds=KINDS) -> pd.DataFrame:
    """One row per (inputs, spread, method, δ kind): each of ``COLUMNS``, the median over ``cfg.seeds``."""
    rows = []
    for family in cfg.families:
        for spread in cfg.spreads:
            for seed in range(cfg.seeds):
                q, k, v, do = make_inputs(family, spread, seed, cfg)
                q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
                attention_exact(q64, k64, v64, cfg.causal).backward(do.double())
                for method in methods:
                    probes = probe_backward(q, k, v, do, causal=cfg.causal, method=method, kinds=kinds)
                    for kind, p in probes.items():
                        rows.append(dict(inputs=family, spread=spread, method=method, delta=kind, seed=seed,
                                         **probe_measures(p, q64, k64, v64)))
    raw = pd.DataFrame(rows)
    keys = ["inputs", "spread", "method", "delta"]
    return raw.groupby(keys, sort=False, as_index=False)[list(COLUMNS)].median()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--spreads", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--out", help="CSV of the table")
    args = parser.parse_args(argv)
    cfg = SweepConfig(seeds=args.seeds, tokens=args.tokens, spreads=tuple(args.spreads))
    table = measure(cfg)
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(table.to_string(index=False, float_format=lambda x: f"{x:.2e}"))
    if args.out:
        table.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
