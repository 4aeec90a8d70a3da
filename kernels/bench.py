"""Kernel benchmark: FP8 attention (stale / consistent / matched) against SDPA cuDNN BF16, SDPA flash BF16, cuDNN FP8,
and FlashAttention's CuTe-DSL BF16 kernels (``fa4_cute_bf16``: FA3's Hopper design, where flash-attn-4 is installed).

``dm-kernel-bench --out DIR`` times forward and forward+backward on one GPU (``triton.testing.do_bench``, median) and
writes ``kernel_bench.csv`` and ``kernel_bench.md`` (date, commit, GPU in the header) to DIR; with ``--memory``, the
peak extra memory of each backward at long sequence lengths (``kernel_memory.*``); with ``--profile``, where one
fwd+bwd of each method spends its GPU time at the reference shape, kernel by kernel (``kernel_profile.*``: CUPTI's
kernel durations through ``torch.profiler``, no launch gaps).

FLOP convention (FlashAttention's): forward 4·B·H·N²·D, halved for causal; backward 2.5× forward; fwd+bwd 3.5×.
Matched's δ recompute pass (two more matmuls, one forward's worth) is not in the convention; ``executed_tflops``
counts it, so the column shows what the chip actually did.
"""

import argparse
import datetime
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch

from deltamatch.atomic import atomic_path
from deltamatch.config import load_with_flags
from deltamatch.methods import get_method, implemented_by
from deltamatch.provenance import commit

FP8_MODES = implemented_by("triton")
FA4 = "fa4_cute_bf16"
"""FlashAttention's CuTe-DSL kernels (``flash_attn.cute.flash_attn_func``, flash-attn-4; on sm90 FA3's Hopper
design: warp specialisation, ping-pong, intra-warpgroup overlap), BF16, an FA3-class baseline. Not on the H200 image:
``tools/device/fetch_fa4.sh`` stages it for a device call (kernels/README.md)."""
BASELINES = ("sdpa_cudnn_bf16", "sdpa_flash_bf16", *implemented_by("cudnn"), FA4)


@dataclass
class BenchConfig:
    """What one benchmark run measures."""

    head_dims: list[int] = field(default_factory=lambda: [64, 128, 256])
    """Head dims to time."""
    seq_lens: list[int] = field(default_factory=lambda: [2048, 4096, 8192, 16384])
    """Sequence lengths to time."""
    batch_heads: int = 64
    """B·H, held constant (H = 2048 / D heads, B = batch_heads / H)."""
    causal: list[bool] = field(default_factory=lambda: [True, False])
    """Mask settings to time (non-causal only at D = 128)."""
    memory_seq_lens: list[int] = field(default_factory=lambda: [16384, 65536])
    """Sequence lengths for the peak-memory table (B = 1, H = 16, D = 128)."""
    warmup_ms: int = 50
    """``do_bench`` warm-up (ms)."""
    rep_ms: int = 200
    """``do_bench`` repetitions (ms)."""
    methods: list[str] = field(default_factory=lambda: [*FP8_MODES, *BASELINES])
    """FP8 modes and baselines to time."""
    memory: bool = False
    """Also measure the peak backward memory (``memory_seq_lens``)."""
    profile: bool = False
    """Also profile one fwd+bwd of each method kernel by kernel (causal, D = 128, B 4, H 16, N ``profile_seq_len``)."""
    profile_seq_len: int = 8192
    """Sequence length of the kernel profile."""
    profile_iters: int = 10
    """Profiled steps (after three warm-up steps) the profile's times are the mean of."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.methods) - set(FP8_MODES) - set(BASELINES))
        if unknown:
            raise ValueError(f"unknown methods {unknown}; choose from {[*FP8_MODES, *BASELINES]}")


def flops(b, h, n, d, causal, bwd: bool) -> float:
    fwd = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return fwd * (3.5 if bwd else 1.0)


def _attention(method: str, causal: bool) -> Callable:
    """method → f(q, k, v) on public-layout (B, N, H, D) tensors."""
    if method in FP8_MODES:
        from deltamatch.kernels.triton_attention import triton_attention

        return lambda q, k, v: triton_attention(q, k, v, causal, method)
    if method in implemented_by("cudnn"):
        from deltamatch.kernels.cudnn_fp8 import cudnn_fp8_attention

        return lambda q, k, v: cudnn_fp8_attention(q, k, v, causal)
    if method == FA4:
        from flash_attn.cute import flash_attn_func

        def fa4(q, k, v):  # (B, N, H, D), FlashAttention's layout; returns (out, lse)
            out = flash_attn_func(q, k, v, causal=causal)
            return out[0] if isinstance(out, tuple) else out

        return fa4
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa_cudnn_bf16": SDPBackend.CUDNN_ATTENTION, "sdpa_flash_bf16": SDPBackend.FLASH_ATTENTION}[method]

    def sdpa(q, k, v):  # SDPA's native layout is (B, H, N, D): transposed views of the public layout
        with sdpa_kernel(backend):
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
        return o.transpose(1, 2)

    return sdpa


def _inputs(b, n, h, d):
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], do


def time_method(method, b, h, n, d, causal, cfg: BenchConfig) -> dict:
    from triton.testing import do_bench

    fn = _attention(method, causal)
    (q, k, v), do = _inputs(b, n, h, d)
    t_fwd = do_bench(lambda: fn(q, k, v), warmup=cfg.warmup_ms, rep=cfg.rep_ms, return_mode="median")

    def fwd_bwd():
        torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    t_all = do_bench(fwd_bwd, warmup=cfg.warmup_ms, rep=cfg.rep_ms, return_mode="median")
    matched = method in FP8_MODES and get_method(method).delta == "matched"
    extra = flops(b, h, n, d, causal, False) if matched else 0.0  # the δ pass
    return dict(
        method=method, head_dim=d, seq_len=n, batch=b, heads=h, causal=causal,
        fwd_ms=t_fwd, fwd_bwd_ms=t_all,
        fwd_tflops=flops(b, h, n, d, causal, False) / t_fwd * 1e-9,
        fwd_bwd_tflops=flops(b, h, n, d, causal, True) / t_all * 1e-9,
        executed_tflops=(flops(b, h, n, d, causal, True) + extra) / t_all * 1e-9,
    )


def peak_backward_memory(method, n, causal=True, h=16, d=128) -> dict:
    """Peak memory the backward allocates beyond what is live when it starts (inputs, O, saved tensors, dO)."""
    import gc

    gc.collect()  # release the previous case's tensors now, not during this backward (which would hide its peak)
    fn = _attention(method, causal)
    (q, k, v), do = _inputs(1, n, h, d)
    o = fn(q, k, v)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del grads, o
    return dict(method=method, seq_len=n, heads=h, head_dim=d, causal=causal, peak_extra_backward_gib=peak / 2**30)


def kernel_name(name: str) -> str:
    """A kernel's name without its template arguments and Triton's mangled suffix, at most 70 characters."""
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"^void ", "", name)
    return name[:70]


def profile_step(method: str, n: int, b: int = 4, h: int = 16, d: int = 128) -> Callable[[], None]:
    """One causal fwd+bwd of ``method`` (an FP8 mode or a baseline) at (B, N, H, D) on random inputs, warmed up
    (three steps run)."""
    fn = _attention(method, True)
    (q, k, v), do = _inputs(b, n, h, d)

    def step():
        torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    return step


def events_ms(step: Callable[[], None], steps: int) -> float:
    """A step's mean GPU time by CUDA events on the current stream around ``steps`` back-to-back ``step()`` calls, the
    device synchronised first (no L2 flush between them, so a little below ``do_bench``'s figure)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def kernel_profile(method: str, n: int, iters: int = 10, d: int = 128) -> pd.DataFrame:
    """Where one fwd+bwd of ``method`` (:func:`profile_step`, head dim ``d``) spends its GPU time: per kernel, its
    launches and GPU time per step (CUPTI's kernel durations, summed over ``iters`` steps and divided by them) and its
    share of the step, the longest first."""
    from torch.profiler import ProfilerActivity, profile

    step = profile_step(method, n, d=d)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    rows: dict[str, tuple[int, float]] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.device_time_total <= 0:
            continue
        name = kernel_name(e.name)
        calls, us = rows.get(name, (0, 0.0))
        rows[name] = (calls + 1, us + e.device_time_total)
    df = pd.DataFrame([dict(method=method, kernel=k, calls_per_step=c / iters, ms_per_step=us / iters / 1e3)
                       for k, (c, us) in rows.items()])
    df = df.sort_values("ms_per_step", ascending=False).reset_index(drop=True)
    df["share"] = df["ms_per_step"] / df["ms_per_step"].sum()
    return df


def _available(method) -> str | None:
    """Why ``method`` cannot run on this machine, or None."""
    if method == FA4:
        return fa4_unavailable()
    if method not in implemented_by("cudnn"):
        return None
    try:
        from deltamatch.kernels.cudnn_fp8 import CudnnFP8Backend

        return CudnnFP8Backend().unavailable_reason()
    except ImportError as exc:
        return str(exc)


def fa4_unavailable() -> str | None:
    """Why FlashAttention's CuTe-DSL kernels cannot run here (not installed, no GPU, not an sm90/sm100 GPU), or None."""
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install (its CUTLASS DSL libraries load at import)
        return (f"flash-attn-4 (flash_attn.cute) does not import: {type(exc).__name__}: {str(exc)[:120]} "
                "(tools/device/fetch_fa4.sh stages it for the H200)")
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10):
        return f"sm{major}{minor}: FlashAttention's CuTe-DSL path runs on sm90 and sm100 here"
    return None


def _write(df: pd.DataFrame, out_dir: str, stem: str, header: str) -> None:
    """``stem``.csv and ``stem``.md (the table under ``header``) in ``out_dir``, each written whole or not at all."""
    for ext in ("csv", "md"):
        with atomic_path(os.path.join(out_dir, f"{stem}.{ext}")) as tmp:
            if ext == "csv":
                df.to_csv(tmp, index=False)
            else:
                tmp.write_text(header + "\n\n" + df.to_markdown(index=False, floatfmt=".3f") + "\n")


def _each_method(methods: list[str], skipped: dict, measure: Callable, **where) -> pd.DataFrame:
    """``measure(method)`` (a row as a dict, or a frame) of every method not ``skipped``, as one frame; a method that
    cannot run here gives a row with ``where`` and its error, and the others go on."""
    parts = []
    for method in methods:
        if method in skipped:
            continue
        try:
            out = measure(method)
        except Exception as exc:  # a baseline that cannot run this shape: record why, keep going
            out = dict(method=method, **where, error=repr(exc)[:200])
        parts.append(out if isinstance(out, pd.DataFrame) else pd.DataFrame([out]))
        torch.cuda.empty_cache()
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def run(cfg: BenchConfig, out_dir: str) -> pd.DataFrame:
    from tqdm import tqdm

    if not torch.cuda.is_available():
        raise ValueError("dm-kernel-bench needs a CUDA GPU (sm90 for the FP8 kernels)")
    os.makedirs(out_dir, exist_ok=True)
    skipped = {m: r for m in cfg.methods if (r := _available(m)) is not None}
    cases = [(d, n, c) for d in cfg.head_dims for n in cfg.seq_lens for c in cfg.causal if c or d == 128]
    stamp = (f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, commit {commit()}, "
             f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")
    not_run = "".join(f"\n\n{m} not run: {r}" for m, r in skipped.items())

    def header(title: str, what: str) -> str:
        return f"# {title}\n\n{stamp}; {what}{not_run}"

    frames, df = [], pd.DataFrame()
    for d, n, causal in tqdm(cases, desc="shapes"):
        h = max(1, 2048 // d)
        b = max(1, cfg.batch_heads // h)
        frames.append(_each_method(cfg.methods, skipped, lambda m: time_method(m, b, h, n, d, causal, cfg),
                                   head_dim=d, seq_len=n, causal=causal))
        df = pd.concat(frames, ignore_index=True)  # written after every shape: a run cut short keeps the shapes timed
        _write(df, out_dir, "kernel_bench",
               header("Kernel benchmark", f"B·H = {cfg.batch_heads}, bf16 inputs, TFLOP/s by the FlashAttention "
                                          "convention"))
    if cfg.memory:
        mem = [_each_method(cfg.methods, skipped, lambda m: peak_backward_memory(m, n), seq_len=n)
               for n in cfg.memory_seq_lens]
        mem = pd.concat(mem, ignore_index=True) if mem else pd.DataFrame()
        _write(mem, out_dir, "kernel_memory",
               header("Backward memory", "B = 1, H = 16, D = 128, causal, bf16 inputs; GiB allocated by the backward "
                                         "beyond what was live before it"))
        print(mem.to_string(index=False, float_format="%.3f"))
    if cfg.profile:
        prof = _each_method(cfg.methods, skipped, lambda m: kernel_profile(m, cfg.profile_seq_len, cfg.profile_iters))
        _write(prof, out_dir, "kernel_profile",
               header("Kernel time per step", f"one causal fwd+bwd at B = 4, H = 16, D = 128, N = "
                                              f"{cfg.profile_seq_len}, bf16 inputs; CUPTI kernel time per step, the "
                                              f"mean of {cfg.profile_iters} steps"))
        print(prof.to_string(index=False, float_format="%.3f"))
    return df


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time the FP8 attention kernels against BF16 and FP8 baselines.")
    parser.add_argument("--out", required=True, help="folder for kernel_bench.{csv,md} (and kernel_memory.*)")
    parser.add_argument("--config", help="YAML file of BenchConfig keys (head_dims, seq_lens, ...); flags override it")
    parser.add_argument("--head-dims", type=int, nargs="+", help="head dimensions to time (default 64 128 256)")
    parser.add_argument("--seq-lens", type=int, nargs="+", help="sequence lengths to time (default 2048 ... 16384)")
    parser.add_argument("--methods", nargs="+",
                        help=f"FP8 modes and baselines to time (default {' '.join([*FP8_MODES, *BASELINES])})")
    parser.add_argument("--causal-only", action="store_true", help="time causal attention only")
    parser.add_argument("--memory", action="store_true", help="also measure peak backward memory (16K, 64K)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one fwd+bwd of each method kernel by kernel (causal, D = 128, N = 8192)")
    args = parser.parse_args(argv)
    try:
        cfg = load_with_flags(BenchConfig, args.config, {
            "head_dims": args.head_dims, "seq_lens": args.seq_lens, "methods": args.methods,
            "causal": [True] if args.causal_only else None, "memory": True if args.memory else None,
            "profile": True if args.profile else None})
    except ValueError as err:
        parser.exit(2, f"dm-kernel-bench: error: {err}\n")
    df = run(cfg, args.out)
    cols = [c for c in ("method", "head_dim", "seq_len", "causal", "fwd_tflops", "fwd_bwd_tflops") if c in df]
    print(df[cols].to_string(index=False, float_format="%.0f"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
