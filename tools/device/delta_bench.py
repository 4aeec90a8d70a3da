"""Time matched's δ pass as matched_factored launches it, with and without ``SCALE_AFTER_SUM``, and at D = 128 the CUDA
pass over 128-key tiles (``cuda_lib.delta_wide``, each variant) (one device call).

    python3 tools/device/delta_bench.py [HEAD_DIM ...]      (default 128; causal, N = 8192, B·H = 64)

For each head dim: the factored forward's codes and lse, dÔ's block codes, then the δ pass (with dŜ's row scales)
under ``backward_config``'s launch with the switch off and on, three do_bench medians each, and how far δ and the
row scales of the two differ (FP32 rounding: the scales are applied after the row sum instead of per element). On a
machine without a GPU it runs a small case in Triton's interpreter (``TRITON_INTERPRET=1``) and prints the
differences only.
"""

import json
import math
import os
import sys

import torch


def measure(d: int) -> dict:
    from deltamatch.kernels import triton_bwd
    from deltamatch.kernels.triton_attention import fp8_forward
    from deltamatch.kernels.triton_quant import quantize_do_and_delta

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    b, n, h = (64 * d // 2048, 8192, 2048 // d) if cuda else (1, 200, 2)
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn(b, n, h, d, device=dev, generator=gen).to(torch.bfloat16) for _ in range(4))
    o, saved, _ = fp8_forward(q, k, v, True, "matched_factored", d ** -0.5)
    do8, _, sdo, delta = quantize_do_and_delta(do, o, "matched_factored", layouts="token")
    cfg = triton_bwd.factored_config(triton_bwd.backward_config(d), d)["delta"]
    row = dict(head_dim=d, launched_scale_after_sum=bool(cfg.get("SCALE_AFTER_SUM")))
    out = {}
    for after in (False, True):
        dl, rs = torch.empty_like(delta), torch.empty_like(delta)

        def run():
            triton_bwd._launch_delta_matched(saved, do8, sdo, dl, True, d ** -0.5 * math.log2(math.e), n,
                                             {**cfg, "SCALE_AFTER_SUM": after}, row_scales=rs)
        run()
        out[after] = (dl[..., :n].clone(), rs[..., :n].clone())
        if cuda:
            from triton.testing import do_bench

            row[f"ms_after_sum_{after}"] = [do_bench(run, warmup=25, rep=200, return_mode="median") for _ in range(3)]
    (d0, r0), (d1, r1) = out[False], out[True]
    row.update(delta_max_abs_diff=(d0 - d1).abs().max().item(), delta_max_abs=d0.abs().max().item(),
               rs_max_rel_diff=((r0 - r1).abs() / r0).max().item())
    if cuda and d == 128:  # the CUDA pass over 128-key tiles, each variant, against the launched Triton pass
        from triton.testing import do_bench

        from deltamatch.kernels import cuda_lib

        args = (saved["q8"], saved["k8"], saved["v8"], do8, saved["sq"], saved["sk"], saved["sv"], sdo,
                saved["lse2"], n, True, d ** -0.5 * math.log2(math.e))
        for variant in cuda_lib.DELTA_WIDE_VARIANTS:
            kw = dict(variant=variant, row_max=saved["m2"] if variant in cuda_lib.DELTA_ROW_MAX else None)
            dl, rs, _ = cuda_lib.delta_wide(*args, **kw)
            row[f"ms_wide_{variant}"] = [do_bench(lambda: cuda_lib.delta_wide(*args, **kw), warmup=25,
                                                  rep=200, return_mode="median") for _ in range(3)]
            row[f"wide_{variant}_delta_max_abs_diff"] = (dl[..., :n] - d1).abs().max().item()
            row[f"wide_{variant}_rs_max_rel_diff"] = ((rs[..., :n] - r1).abs() / r1).max().item()
    return row


def main() -> None:
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("no GPU: run with TRITON_INTERPRET=1 for the interpreter's small case")
    if not torch.cuda.is_available():
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "kernels"))
        from triton_child import patch_interpreter_index

        patch_interpreter_index()
    for d in map(int, sys.argv[1:] or ["128"]):
        print(json.dumps(measure(d)), flush=True)


if __name__ == "__main__":
    main()
