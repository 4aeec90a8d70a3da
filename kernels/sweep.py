"""``dm-sweep``: the random-head experiment — how far each method's backward is from the softmax-gradient invariant.

Heads of random inputs (default 4 heads × 512 tokens × head dim 64, causal, 6 seeds). Q and K entries are N(0, s)
(variance s), so the scores QKᵀ/√d have standard deviation s, the logit spread. V and dO are N(0, 1). The ``outlier``
family multiplies a few value channels by 20 and draws dO from Student-t(3), the heavy tails real activations have.
Every method is run on the same inputs; the value written is the median over seeds.
"""

import argparse
import math
import os
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm import tqdm

from deltamatch.atomic import atomic_path
from deltamatch.config import load_with_flags
from deltamatch.kernels.measures import dk_colsum_share, relative_error, rowsum_residual
from deltamatch.kernels.reference import attention_exact, attention_reference, probe_backward
from deltamatch.methods import get_method, simulated_methods

SWEEP_METHODS = simulated_methods()
FAMILIES = ("gaussian", "outlier")
METRICS = ("rowsum_before_cast", "rowsum_after_cast", "dk_colsum", "relerr_o", "relerr_dq", "relerr_dk", "relerr_dv")
OUTLIER_CHANNELS, OUTLIER_GAIN, STUDENT_DOF = 4, 20.0, 3


@dataclass
class SweepConfig:
    heads: int = 4
    """Attention heads per case."""
    tokens: int = 512
    """Sequence length."""
    head_dim: int = 64
    """Head dimension."""
    seeds: int = 6
    """Seeds per (family, spread); the reported value is their median."""
    spreads: tuple[float, ...] = (1.0, 2.0, 4.0)
    """Standard deviations of the scores QKᵀ/√d."""
    families: tuple[str, ...] = FAMILIES
    """Input families: ``gaussian`` and ``outlier``."""
    methods: tuple[str, ...] = SWEEP_METHODS
    """Methods to compare (``cudnn_fp8_sim`` is the per-tensor-scaled cuDNN baseline's numerics)."""
    causal: bool = True
    """Causal masking."""

    def __post_init__(self) -> None:
        for name in ("heads", "tokens", "head_dim", "seeds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if not self.spreads or not all(math.isfinite(s) and s > 0 for s in self.spreads):
            raise ValueError(f"--spreads must be finite and > 0 (a variance), got {list(self.spreads)}")
        for name, known in (("families", FAMILIES), ("methods", SWEEP_METHODS)):
            unknown = [x for x in getattr(self, name) if x not in known]
            if unknown:
                raise ValueError(f"unknown {name} {unknown}; choose from {list(known)}")


def make_inputs(family: str, spread: float, seed: int, cfg: SweepConfig):
    """q, k, v, dO in the public layout (1, N, H, D), FP32, deterministic for (family, spread, seed)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown input family {family!r}; choose one of {FAMILIES}")
    gen = torch.Generator().manual_seed(seed)
    shape = (1, cfg.tokens, cfg.heads, cfg.head_dim)
    q, k = (torch.randn(shape, generator=gen) * math.sqrt(spread) for _ in range(2))
    v, do = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    if family == "outlier":
        channels = torch.randperm(cfg.head_dim, generator=gen)[:OUTLIER_CHANNELS]
        v[..., channels] *= OUTLIER_GAIN
        chi2 = torch.randn((*shape, STUDENT_DOF), generator=gen).pow(2).sum(-1)
        do = do / torch.sqrt(chi2 / STUDENT_DOF)  # Student-t(3): a normal over sqrt(chi²₃ / 3)
    return q, k, v, do


def probe_measures(probe, q64, k64, v64) -> dict[str, float]:
    """The sweep's backward metrics of one probe (``reference.Probe``) against FP64 autograd's gradients (``q64.grad``
    and the others, already computed)."""
    return {
        "rowsum_before_cast": rowsum_residual(probe.ds_before_cast),
        "rowsum_after_cast": rowsum_residual(probe.ds_after_cast),
        "dk_colsum": dk_colsum_share(probe.dk),
        "relerr_dq": relative_error(probe.dq, q64.grad),
        "relerr_dk": relative_error(probe.dk, k64.grad),
        "relerr_dv": relative_error(probe.dv, v64.grad),
    }


def measure_case(q, k, v, do, method: str, causal: bool) -> dict[str, float]:
    """Every sweep metric for one method on one set of inputs."""
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o64 = attention_exact(q64, k64, v64, causal)
    o64.backward(do.double())
    probe = probe_backward(q, k, v, do, causal=causal, method=method)[get_method(method).delta_kind]
    with torch.no_grad():
        o = attention_reference(q, k, v, causal, method)
    return {"relerr_o": relative_error(o, o64), **probe_measures(probe, q64, k64, v64)}


def run_sweep(cfg: SweepConfig, progress: bool = True) -> pd.DataFrame:
    """The long table ``inputs, spread, method, metric, value`` (value: median over seeds)."""
    rows = []
    cases = [(f, s, seed) for f in cfg.families for s in cfg.spreads for seed in range(cfg.seeds)]
    for family, spread, seed in tqdm(cases, desc="dm-sweep", disable=not progress):
        q, k, v, do = make_inputs(family, spread, seed, cfg)
        for method in cfg.methods:
            for metric, value in measure_case(q, k, v, do, method, cfg.causal).items():
                rows.append((family, spread, method, metric, seed, value))
    raw = pd.DataFrame(rows, columns=["inputs", "spread", "method", "metric", "seed", "value"])
    keys = ["inputs", "spread", "method", "metric"]
    return raw.groupby(keys, sort=False, as_index=False)["value"].median()


def format_table(df: pd.DataFrame) -> str:
    wide = df.pivot_table(index=["inputs", "spread", "method"], columns="metric", values="value", sort=False)
    return wide[list(METRICS)].to_string(float_format=lambda x: f"{x:.2e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="dm-sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/sweep.csv", help="long CSV to write")
    parser.add_argument("--config", help="YAML file of SweepConfig keys (heads, tokens, ...); the flags below override it")
    parser.add_argument("--seeds", type=int, help=f"seeds per (family, spread); the median is reported "
                        f"(default {SweepConfig.seeds})")
    parser.add_argument("--tokens", type=int, help=f"sequence length (default {SweepConfig.tokens})")
    parser.add_argument("--heads", type=int, help=f"attention heads per case (default {SweepConfig.heads})")
    parser.add_argument("--head-dim", type=int, help=f"head dimension (default {SweepConfig.head_dim})")
    parser.add_argument("--spreads", type=float, nargs="+",
                        help=f"standard deviations of the scores QK^T/sqrt(d) (default {list(SweepConfig.spreads)})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:  # every argument is checked before any work or output
        cfg = load_with_flags(SweepConfig, args.config, {"heads": args.heads, "tokens": args.tokens,
                                                         "head_dim": args.head_dim, "seeds": args.seeds,
                                                         "spreads": args.spreads})
    except ValueError as err:
        parser.exit(2, f"dm-sweep: error: {err}\n")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    df = run_sweep(cfg, progress=not args.no_progress)
    table = format_table(df)
    try:
        with atomic_path(args.out) as tmp:
            df.to_csv(tmp, index=False)
    except OSError as err:
        parser.exit(2, f"dm-sweep: error: cannot write --out {args.out}: {err}\n")
    print(table)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
