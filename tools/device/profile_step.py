"""On the H200: time and profile training steps of a named hybrid, and check fla's kernels, in one process.

One process, so Triton compiles and autotunes every kernel once (fla's GDN/KDA kernels autotune over many configs:
minutes on a fresh machine). Each item is one of

- ``method:micro_batch[:flags]``: training steps, flags from ``nofused`` (plain-PyTorch norms/SwiGLU/CE instead of
  fla's kernels), ``twin`` (the pure-torch GDN recurrence), ``ckpt`` (activation checkpointing) and ``prof`` (print
  the top CUDA kernels of one step); a row with median step time, tokens/s, MFU, peak memory;
- ``verify:K:T:h0:warps[:bf16]``: fla's gated delta rule against the FP64 twin (tests/models/layers/fla_reference.py) at key head
  dim K (V = 2K), length T, with an initial state when h0 is 1, ``prepare_wy_repr_bwd`` autotuned over ``warps``
  warps only; fla's #640 guard is lifted for the item;
- ``kda:T:h0[:fp32]``: fla's KDA chunk kernel (BF16 inputs, or FP32) against its token-by-token reference.

A watchdog prints every thread's stack every ``--watchdog`` seconds to stderr (what a slow item is doing).
``--pins FILE`` then records fla's autotuning choices of the process as a pin file (``fla_autotune.py``).
"""

import argparse
import contextlib
import faulthandler
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "models" / "layers"))


def run_variant(spec: str, size: str, seq_len: int, steps: int, warmup: int) -> dict:
    from deltamatch.models import HybridForCausalLM, get_config
    from deltamatch.models.layers.fused import use_fused
    from deltamatch.models.layers.gdn import use_gdn_backend
    from deltamatch.models.train.config import OptimSection
    from deltamatch.models.train.optim import build_optimizers
    from deltamatch.models.train.throughput import flops_per_token, peak_tflops

    method, micro, *flags = spec.split(":")
    micro = int(micro)
    config = get_config(size, attn_method=method, vocab_size=32000)
    torch.manual_seed(0)
    model = HybridForCausalLM(config).cuda().train()
    if "ckpt" in flags:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opts = build_optimizers(model, OptimSection(lr=3e-4))
    x = torch.randint(0, 32000, (micro, seq_len), device="cuda")
    pins = contextlib.ExitStack()
    if "nofused" in flags:
        pins.enter_context(use_fused(False))
    if "twin" in flags:
        pins.enter_context(use_gdn_backend("torch"))
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        return loss

    with pins:
        for i in range(warmup + steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            loss = step()
            losses.append(float(loss))
            times.append(time.perf_counter() - t)
        if "prof" in flags:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            print(f"--- top CUDA kernels, {spec} ---")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
    step_s = statistics.median(times[warmup:])
    tok_s = micro * seq_len / step_s
    peak = peak_tflops(torch.device("cuda"))
    flops = flops_per_token(model, seq_len)
    row = {"variant": spec, "size": size, "seq_len": seq_len, "step_ms": step_s * 1e3, "tokens_per_s": tok_s,
           "mfu": tok_s * flops / (peak * 1e12) if peak else None, "first_step_s": times[0],
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "loss_first": losses[0], "loss_last": losses[-1]}
    del model, opts
    torch.cuda.empty_cache()
    return row


def run_check(spec: str) -> dict:
    from fla_reference import gdn_errors, kda_errors

    from deltamatch.models.layers import fla_hopper
    from deltamatch.models.train.fla_autotune import restrict_warps

    kind, *fields = spec.split(":")
    start = time.perf_counter()
    if kind == "verify":
        from fla.ops.gated_delta_rule import wy_fast

        K, T, h0, warps = map(int, fields[:4])
        dtype = torch.bfloat16 if fields[4:] == ["bf16"] else torch.float32
        with fla_hopper._guard_lifted(), restrict_warps(wy_fast.prepare_wy_repr_bwd_kernel, warps):
            errors = gdn_errors(2, T, 2, K, 2 * K, bool(h0), dtype=dtype)
    else:
        T, h0 = map(int, fields[:2])
        dtype = torch.float32 if fields[2:] == ["fp32"] else torch.bfloat16  # FP32 at K = 128 exceeds Hopper's smem
        errors = kda_errors(2, T, 2, 128, 256, bool(h0), dtype=dtype)
    return {"variant": spec, "max_err": max(errors.values()), "worst": max(errors, key=errors.get),
            "seconds": time.perf_counter() - start, **errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="method:micro_batch[:flag...]")
    parser.add_argument("--size", default="569M")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--watchdog", type=float, default=0, help="seconds between stack dumps (0: none)")
    parser.add_argument("--pins", type=Path, help="after the items, write fla's autotuning choices of this process "
                        "as a pin file (models/train/fla_pins/<GPU>.json; models/train/fla_autotune.py)")
    args = parser.parse_args(argv)
    if args.watchdog:
        faulthandler.dump_traceback_later(args.watchdog, repeat=True)
    rows = []
    for spec in args.variants:
        try:
            if spec.split(":")[0] in ("verify", "kda"):
                rows.append(run_check(spec))
            else:
                rows.append(run_variant(spec, args.size, args.seq_len, args.steps, args.warmup))
        except Exception as err:  # noqa: BLE001 - report the variant and go on with the next
            rows.append({"variant": spec, "error": f"{type(err).__name__}: {err}"[:500]})
            torch.cuda.empty_cache()
        print(json.dumps(rows[-1]), flush=True)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))
    import pandas as pd

    print(pd.DataFrame(rows).to_string(index=False))
    if args.pins:
        write_pins(args.pins, [r["variant"] for r in rows if "error" not in r], args)
    return 0


def write_pins(path: Path, items: list[str], args) -> None:
    """fla's autotuning choices so far in this process, as the pin file ``fla_autotune.apply_pins`` reads."""
    import datetime

    from deltamatch.atomic import write_json
    from deltamatch.models.train import fla_autotune
    from deltamatch.provenance import commit

    kernels = fla_autotune.record_choices(fla_autotune.loaded_autotuners(*fla_autotune.PINNED_PACKAGES))
    write_json(path, {**fla_autotune.versions(), "recorded": datetime.datetime.now(datetime.UTC).isoformat()[:16],
                      "commit": commit(), "items": items, "size": args.size, "seq_len": args.seq_len,
                      "kernels": kernels})
    print(f"{sum(map(len, kernels.values()))} choices of {len(kernels)} kernels -> {path}")


if __name__ == "__main__":
    sys.exit(main())
