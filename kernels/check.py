"""Build check without a GPU: compile every Triton kernel ahead of time for sm_90a and read its PTX, SASS and resources.

``dm-kernel-check [--head-dims 64 128 256] [--causal both|yes|no] [--out FILE.jsonl]`` prints one JSON object per
(kernel, variant, head dim): every attention kernel causal and non-causal (``--load-variants``: each also with its tiles
loaded the other way, through TMA descriptors where pointers are launched, variant ``…-tma``, and through pointers
where TMA is, variant ``…-pointers``), and every quantisation-pass variant the autograd function launches
(Q, centred K, V; dO with no, stale or consistent δ; ``--store-variants``: each pass that stores codes also under the
code-store modes it does not launch, variant ``<operand>-<mode>``, ``triton_quant.STORE_MODES``). Each row holds

- ``fp8_wgmma_dots``: dots lowered to ``ttng.warp_group_dot`` on E4M3 operands (one per matmul, from the TTGIR);
- ``dots``: all dots in the kernel (``tt.dot`` in the TTIR) — equal to the above when every matmul is FP8 wgmma;
  ``matmuls`` × ``copies`` (a matmul appears in the unmasked and in the masked loop body, twice more when paired);
- ``fp8_wgmma``: ``wgmma.mma_async … e4m3`` instructions in the PTX; ``qgmma``: QGMMA instructions in the SASS;
- ``other_mma``: any other MMA instruction (BF16/FP16 wgmma, ``mma.sync``, HMMA, HGMMA);
- ``registers``, ``spill_bytes`` (the stack frame, where ptxas spills, plus local memory per thread) from
  ``cuobjdump --dump-resource-usage``; ``sass_registers``, one more than the highest register the SASS names, which the
  reported count must cover; ``shared_bytes``;
- ``problems``: why the row fails (``ok`` when empty). The TTGIR dots, the PTX and the SASS must agree: every dot an
  FP8 warp-group dot, at least one ``wgmma … e4m3`` per dot in the PTX, none without a dot, and exactly one QGMMA per
  such wgmma in the SASS (ptxas lowers each to one instruction; a mismatch means the SASS is not what the PTX asks).

Triton ships ``ptxas`` and ``cuobjdump`` with its NVIDIA backend, so this runs in CPU CI. ``--cuda`` checks the CUDA
C++ library instead (``cuda_check``: each kernel's QGMMA as ``cuda_build.KERNELS`` declares them).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import dataclasses
from dataclasses import dataclass, field

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from deltamatch.kernels import cuda_lib, triton_bwd, triton_fwd, triton_quant
from deltamatch.atomic import write_text
from deltamatch.config import load_with_flags
from deltamatch.kernels.hardware import hardware

SM90 = GPUTarget("cuda", 90, 32)
HEAD_DIMS = (64, 128, 256)


@dataclass
class KernelSpec:
    """One kernel to compile: its function, pointer element types, and how many of the seven matmuls it holds."""

    name: str
    variant: str
    """``causal`` / ``non-causal`` for the attention kernels; the operand (and δ) for the quantisation passes."""
    fn: object
    pointers: dict[str, str]
    """Argument name → Triton pointer type (``*fp8e4nv``, ``*fp32``, ``*bf16``); other args are i32 or fp32."""
    matmuls: int
    """How many of the seven FP8 matmuls this kernel computes (each must be an FP8 wgmma)."""
    copies: int = 1
    """Loop bodies each matmul appears in (unmasked tiles and masked tiles are separate loops)."""
    floats: tuple[str, ...] = ("qk_scale", "softmax_scale")
    constexprs: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)


def _fp8(*names):
    return {n: "*fp8e4nv" for n in names}


def _fp32(*names):
    return {n: "*fp32" for n in names}


CAUSAL = (True, False)


def kernel_specs(head_dim: int, causal: tuple[bool, ...] = CAUSAL, load_variants: bool = False,
                 store_variants: bool = False) -> list[KernelSpec]:
    """Every kernel at its launch configuration for ``head_dim``: the attention kernels once per setting in
    ``causal`` (and with ``load_variants`` each with its tiles loaded the other way), then the quantisation passes
    (they have no mask; with ``store_variants`` each that stores codes also under every other store mode)."""
    specs = [spec for c in causal for spec in attention_specs(head_dim, c, load_variants) + factored_specs(head_dim, c)]
    specs += quant_specs(head_dim)
    return specs + (store_mode_specs(specs) if store_variants else [])


def attention_specs(head_dim: int, causal: bool, load_variants: bool = False) -> list[KernelSpec]:
    """The forward and backward kernels (matched δ, dK/dV or dK and dV, dQ), and (``load_variants``) each with its
    tiles loaded the other way: ``TMA=True`` as variant ``<mask>-tma`` where pointers are launched, ``TMA=False`` as
    ``<mask>-pointers`` where TMA is (``triton_fwd.tma_enabled``)."""
    fwd = triton_fwd.forward_config(head_dim)
    bwd = triton_bwd.backward_config(head_dim)
    variant = "causal" if causal else "non-causal"

    def split(cfg):
        opts = {k: cfg[k] for k in ("num_warps", "num_stages")}
        return {k: v for k, v in cfg.items() if k not in opts}, opts

    common = dict(HEAD_DIM=head_dim, CAUSAL=causal, ROUND_FP32=False)
    specs = []
    c, o = split({"PAIRED": False, **fwd})
    specs.append(KernelSpec("attn_fwd", variant, triton_fwd._attn_fwd_kernel,
                            {**_fp8("q8_ptr", "k8_ptr", "v8t_ptr"), **_fp32("sq_ptr", "sk_ptr", "sv_ptr", "lse_ptr"),
                             "o_ptr": "*bf16"}, 2, copies=4 if c.get("PAIRED") else 2,
                            constexprs={**c, **common}, options=o))
    c, o = split(bwd["delta"])
    specs.append(KernelSpec("attn_bwd_delta_matched", variant, triton_bwd._attn_bwd_delta_matched_kernel,
                            {**_fp8("q8_ptr", "k8_ptr", "v8_ptr", "do8_ptr"),
                             **_fp32("sq_ptr", "sk_ptr", "sv_ptr", "sdo_ptr", "lse_ptr", "delta_ptr", "rs_ptr",
                                      "irs_ptr")}, 2,
                            copies=2, constexprs={**c, "HEAD_DIM": head_dim, "CAUSAL": causal}, options=o))
    c, o = split({"SPLIT": True, **bwd["dkdv"]})
    separate = c.pop("SEPARATE", False)
    parts = [("attn_bwd_dk", 3, dict(DO_DK=True, DO_DV=False)), ("attn_bwd_dv", 2, dict(DO_DK=False, DO_DV=True))]
    for name, matmuls, flags in parts if separate else [("attn_bwd_dkdv", 4, dict(DO_DK=True, DO_DV=True))]:
        atomic = bool(c.get("DQ_ATOMIC")) and flags["DO_DK"]  # matmul 6 in the dK launch (DELTAMATCH_KERNEL_DQ_ATOMIC)
        specs.append(KernelSpec(name, variant, triton_bwd._attn_bwd_dkdv_kernel,
                                {**_fp8("q8_ptr", "q8t_ptr", "k8_ptr", "v8_ptr", "do8_ptr", "do8t_ptr", "k8t_ptr"),
                                 **_fp32("sq_ptr", "sk_ptr", "sv_ptr", "sdo_ptr", "lse_ptr", "delta_ptr",
                                         "dq_acc_ptr", "sdoc_ptr", "sqc_ptr", "rs_ptr"),
                                 "dk_ptr": "*bf16", "dv_ptr": "*bf16", "stats_ptr": "*fp32"},
                                matmuls + atomic, copies=2 if c["SPLIT"] else 1,
                                constexprs={**c, **common, "DS_STATS": False, **flags, "DQ_ATOMIC": atomic},
                                options=o))
    c, o = split(bwd["dq"])
    specs.append(KernelSpec("attn_bwd_dq", variant, triton_bwd._attn_bwd_dq_kernel,
                            {**_fp8("q8_ptr", "k8_ptr", "k8t_ptr", "v8_ptr", "do8_ptr"),
                             **_fp32("sq_ptr", "sk_ptr", "sv_ptr", "sdo_ptr", "lse_ptr", "delta_ptr", "skc_ptr",
                                     "rs_ptr"),
                             "dq_ptr": "*bf16", "stats_ptr": "*fp32"}, 3, copies=2,
                            constexprs={**c, **common, "DS_STATS": False}, options=o))
    if load_variants:
        specs += [dataclasses.replace(spec, variant=f"{spec.variant}-{'pointers' if tma else 'tma'}",
                                      constexprs={**spec.constexprs, "TMA": not tma})
                  for spec in specs for tma in [bool(spec.constexprs.get("TMA"))]]
    return specs


def factored_specs(head_dim: int, causal: bool) -> list[KernelSpec]:
    """``matched_factored``'s kernels as ``triton_attention`` launches them (variant ``<mask>-factored``): the forward,
    the δ pass with dŜ's row scales, dK and dV as two launches or one (``factored_config``) and dQ, all
    ``FACTORED``; then the quantisation passes, which have no mask and come with the causal ones: the per-channel ones
    (V̂, dÔ; K̂ᶜ centred; Q' row-scaled), K's mean and centred amax (``column_stats``, variant ``k_mean``), and the
    passes that write both copies of K (centred, fragment order), V and dO (``block_and_channel_pass``, variants
    ``k_both``, ``v_both``, ``do_both``)."""
    bwd = triton_bwd.factored_config(triton_bwd.backward_config(head_dim), head_dim)
    configs = {"attn_fwd": triton_fwd.forward_config(head_dim, factored=True), "attn_bwd_dq": bwd["dq"],
               "attn_bwd_delta_matched": {**bwd["delta"], "ROW_SCALES": True}}
    variant = f"{'causal' if causal else 'non-causal'}-factored"
    dkdv_parts = ([("attn_bwd_dk", 3, dict(DO_DK=True, DO_DV=False)), ("attn_bwd_dv", 2, dict(DO_DK=False, DO_DV=True))]
                  if bwd["dkdv"].get("SEPARATE", True) else [("attn_bwd_dkdv", 4, dict(DO_DK=True, DO_DV=True))])
    out = []
    for spec in attention_specs(head_dim, causal):
        parts = [(spec.name, spec.matmuls, {})]
        if spec.name in ("attn_bwd_dkdv", "attn_bwd_dk"):  # the paper layout's dK/dV launch(es): the factored ones
            parts = dkdv_parts
        elif spec.name == "attn_bwd_dv":
            parts = []
        cfg = {k: v for k, v in configs.get(spec.name, bwd["dkdv"]).items() if k != "SEPARATE"}
        options = {k: cfg[k] for k in ("num_warps", "num_stages")}
        constexprs = {**spec.constexprs, **{k: v for k, v in cfg.items() if k not in options}}
        for name, matmuls, flags in parts:  # masked and unmasked loops: 2 copies, and the key-tile pairs' 2 more
            out.append(dataclasses.replace(spec, name=name, variant=variant, matmuls=matmuls,
                                           copies=4 if constexprs.get("PAIRED") else 2,
                                           constexprs={**constexprs, **flags}, options=options))
    if not causal:
        return out
    for variant, centre, row_scaled in (("v_channel", False, False), ("k_channel", True, False),
                                        ("q_channel", False, True)):
        # as launched: each launch's (rows, warps), the channel-major codes only, in the CUDA kernels' token order
        # where they run (K̂ᶜ for dQ, Q̂'ᶜ and dÔᶜ, which this variant's form shares, for dK/dV)
        pointers = {"x_ptr": "*bf16", "mean_ptr": "*fp32", "row_scale_ptr": "*fp32", "amax_ptr": "*fp32"}
        flags = dict(HEAD_DIM=head_dim, CENTRE=centre, ROW_SCALED=row_scaled)
        rows, warps = triton_quant._per_channel_launch(head_dim, "amax")
        out.append(KernelSpec("per_channel_amax_pass", variant, triton_quant._per_channel_amax_pass_kernel, pointers,
                              0, constexprs={**flags, "BLOCK_ROWS": rows}, options=dict(num_warps=warps)))
        rows, warps = triton_quant._per_channel_launch(head_dim, "cast")
        fragment = variant != "v_channel" and head_dim == cuda_lib.DV_HEAD_DIM
        out.append(KernelSpec("per_channel_quant_pass", variant, triton_quant._per_channel_quant_pass_kernel,
                              {**pointers, **_fp8("x8_ptr", "x8t_ptr"), "scale_ptr": "*fp32"}, 0,
                              constexprs={**flags, "BLOCK_ROWS": rows, "ROUND_FP32": False,
                                          "STORE_MODE": triton_quant.STORE_MODE, "STORES": 2,
                                          "FRAGMENT_ORDER": fragment},
                              options=dict(num_warps=warps)))
    stats = dict(HEAD_DIM=head_dim, BLOCK_ROWS=triton_quant.STATS_ROWS)
    out.append(KernelSpec("column_stats", "k_mean", triton_quant._column_stats_kernel,
                          {"x_ptr": "*bf16", "part_ptr": "*fp32"}, 0, constexprs=stats,
                          options=dict(num_warps=triton_quant._warps(triton_quant.STATS_ROWS, head_dim))))
    out.append(KernelSpec("column_stats_reduce", "k_mean", triton_quant._column_stats_reduce_kernel,
                          _fp32("part_ptr", "mean_ptr", "amax_ptr"), 0,
                          constexprs=dict(HEAD_DIM=head_dim, CHUNK=16), options=dict(num_warps=4)))
    warps = dict(num_warps=triton_quant.BLOCK_AND_CHANNEL_WARPS[head_dim])
    for variant, rows, centre, fragment in (("k_both", triton_quant.BLOCK_KV, True, True),
                                            ("v_both", triton_quant.BLOCK_KV, False, False),
                                            ("do_both", triton_quant.BLOCK_Q, False, True)):
        out.append(KernelSpec("block_and_channel_pass", variant, triton_quant._block_and_channel_pass_kernel,
                              {"x_ptr": "*bf16", **_fp32("mean_ptr", "amax_ptr", "sx_ptr", "sxc_ptr"),
                               **_fp8("x8_ptr", "x8t_ptr")}, 0,
                              constexprs=dict(HEAD_DIM=head_dim, BLOCK_ROWS=rows, CENTRE=centre, ROUND_FP32=False,
                                              STORE_MODE=triton_quant.STORE_MODE, FRAGMENT_ORDER=fragment),
                              options=warps))
    return out


def quant_specs(head_dim: int) -> list[KernelSpec]:
    """The quantisation passes as ``triton_attention`` launches them: Q, centred K and V, then dO with each δ."""
    specs = []
    for variant, rows, centre in (("q", triton_quant.BLOCK_Q, False), ("k", triton_quant.BLOCK_KV, True),
                                  ("v", triton_quant.BLOCK_KV, False)):
        specs.append(KernelSpec("quant_pass", variant, triton_quant._quant_pass_kernel,
                                {"x_ptr": "*bf16", "mean_ptr": "*fp32", **_fp8("x8_ptr", "x8t_ptr"),
                                 "scale_ptr": "*fp32"}, 0,
                                constexprs=dict(HEAD_DIM=head_dim, BLOCK_ROWS=rows, CENTRE=centre, ROUND_FP32=False,
                                                STORE_MODE=triton_quant.STORE_MODE),
                                options=dict(num_warps=triton_quant._warps(rows, head_dim))))
    for mode, code in triton_quant.DELTA_CODES.items():
        specs.append(KernelSpec("quant_do_delta_pass", f"do_{mode}", triton_quant._quant_do_delta_pass_kernel,
                                {"do_ptr": "*bf16", "o_ptr": "*bf16", **_fp8("do8_ptr", "do8t_ptr"),
                                 **_fp32("scale_ptr", "delta_ptr")}, 0,
                                constexprs=dict(HEAD_DIM=head_dim, BLOCK_ROWS=triton_quant.BLOCK_Q, DELTA=code,
                                                ROUND_FP32=False, STORE_MODE=triton_quant.STORE_MODE),
                                options=dict(num_warps=triton_quant._warps(triton_quant.BLOCK_Q, head_dim))))
    return specs


def store_mode_specs(specs: list[KernelSpec]) -> list[KernelSpec]:
    """Each quantisation pass among ``specs`` that stores codes, under every store mode it is not launched with
    (variant ``<variant>-<mode name>``): the modes the H200 sweep times before one becomes ``STORE_MODE``."""
    return [dataclasses.replace(spec, variant=f"{spec.variant}-{name}",
                                constexprs={**spec.constexprs, "STORE_MODE": mode})
            for spec in specs if "STORE_MODE" in spec.constexprs
            for name, mode in triton_quant.STORE_MODES.items() if mode != spec.constexprs["STORE_MODE"]]


def compile_sm90(spec: KernelSpec):
    """``triton.compile`` for sm_90a with every pointer 16-byte aligned; returns the compiled kernel."""
    signature, attrs = {}, {}
    constexprs = dict(spec.constexprs)
    for param in spec.fn.params:  # a constexpr left out takes its default, as at a launch
        if param.is_constexpr and param.name not in constexprs and param.has_default:
            constexprs[param.name] = param.default
    for i, name in enumerate(spec.fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in spec.pointers:
            signature[name] = spec.pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name in spec.floats else "i32"
    src = ASTSource(spec.fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=SM90, options=spec.options)


def _cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def _sass_and_resources(cubin: bytes) -> tuple[str, dict]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    return sass, {k: int(v) for k, v in found.items()}


def analyse(spec: KernelSpec, head_dim: int) -> dict:
    """Compile one kernel, count its matrix instructions and judge them (``problems``, ``ok``)."""
    compiled = compile_sm90(spec)
    ptx, ttir, ttgir = compiled.asm["ptx"], compiled.asm["ttir"], compiled.asm["ttgir"]
    sass, res = _sass_and_resources(compiled.asm["cubin"])
    wgmma_lines = [ln for ln in ptx.splitlines() if "wgmma.mma_async" in ln]
    fp8_wgmma = sum(".e4m3.e4m3" in ln for ln in wgmma_lines)
    wgdots = re.findall(r"ttng\.warp_group_dot .*", ttgir)
    row = dict(
        name=spec.name,
        variant=spec.variant,
        head_dim=head_dim,
        matmuls=spec.matmuls,
        copies=spec.copies,
        dots=len(re.findall(r"\btt\.dot\b", ttir)),
        fp8_wgmma_dots=sum("f8E4M3FN" in ln for ln in wgdots),
        fp8_wgmma=fp8_wgmma,
        qgmma=len(re.findall(r"\bQGMMA\b", sass)),
        other_mma=(len(wgmma_lines) - fp8_wgmma) + ptx.count("mma.sync")
        + len(re.findall(r"\b(HMMA|HGMMA|IMMA)\b", sass)),
        registers=res.get("REG"),
        sass_registers=max((int(r) + 1 for r in re.findall(r"\bR(\d+)\b", sass)), default=0),
        spill_bytes=res.get("LOCAL", 0) + res.get("STACK", 0),  # ptxas spills into the stack frame
        stack_bytes=res.get("STACK", 0),
        shared_bytes=compiled.metadata.shared,
        num_warps=spec.options.get("num_warps"),
    )
    row["problems"] = problems(row)
    row["ok"] = not row["problems"]
    return row


def problems(row: dict) -> list[str]:
    """What disagrees in one row of ``analyse`` (empty when the kernel passes)."""
    found = []
    expected = row["matmuls"] * row["copies"]
    if not row["fp8_wgmma_dots"] == row["dots"] == expected:
        found.append(f"TTGIR: {row['fp8_wgmma_dots']} FP8 warp-group dots of {row['dots']} dots, expected {expected}")
    if row["other_mma"]:
        found.append(f"{row['other_mma']} MMA instructions that are not FP8 wgmma")
    if row["fp8_wgmma"] < row["dots"] or (row["fp8_wgmma"] > 0) != (row["dots"] > 0):
        found.append(f"PTX: {row['fp8_wgmma']} e4m3 wgmma.mma_async for {row['dots']} dots")
    if row["qgmma"] != row["fp8_wgmma"]:
        found.append(f"SASS: {row['qgmma']} QGMMA for {row['fp8_wgmma']} e4m3 wgmma in the PTX")
    if row["registers"] is None or row["registers"] < row["sass_registers"]:
        found.append(f"register count {row['registers']} does not cover R0..R{row['sass_registers'] - 1} in the SASS")
    return found


@dataclass
class CheckConfig:
    """Which kernels the build check compiles (the pipeline writes it from config key ``kernel.check``)."""

    head_dims: list[int] = field(default_factory=lambda: list(HEAD_DIMS))
    """Head dimensions to compile."""
    causal: str = "both"
    """Mask settings of the attention kernels: ``both``, ``yes`` or ``no``."""
    load_variants: bool = False
    """Also compile each attention kernel with its tiles loaded the other way (variant ``<mask>-tma`` or
    ``<mask>-pointers``)."""
    store_variants: bool = False
    """Also compile each quantisation pass that stores codes under every code-store mode it is not launched with
    (variant ``<operand>-<mode>``)."""

    def __post_init__(self) -> None:
        bad = [d for d in self.head_dims if d not in HEAD_DIMS]
        if bad or not self.head_dims:
            raise ValueError(f"head_dims {self.head_dims}: each must be one of {list(HEAD_DIMS)}")
        if self.causal not in ("both", "yes", "no"):
            raise ValueError(f"causal {self.causal!r} must be both, yes or no")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML file of CheckConfig keys (head_dims, causal, load_variants, "
                        "store_variants); flags override it")
    parser.add_argument("--head-dims", type=int, nargs="+",
                        help=f"head dimensions to compile (default {' '.join(map(str, HEAD_DIMS))})")
    parser.add_argument("--causal", choices=("both", "yes", "no"),
                        help="which mask settings of the attention kernels to compile (default both)")
    parser.add_argument("--out", help="also write the JSON lines to this file")
    parser.add_argument("--load-variants", action="store_true",
                        help="also compile each attention kernel with its tiles loaded the other way: through TMA "
                        "(variant '<mask>-tma') where pointers are launched, through pointers ('<mask>-pointers') "
                        "where TMA is")
    parser.add_argument("--store-variants", action="store_true",
                        help="also compile each quantisation pass that stores codes under the code-store modes it is "
                        "not launched with (variant '<operand>-<mode>', triton_quant.STORE_MODES)")
    parser.add_argument("--cuda", action="store_true",
                        help="check the CUDA library instead of the Triton kernels: build build/cuda/libdm_attn_sm90.so "
                        "(when stale) and compare each kernel's SASS with its declared QGMMA (kernels/cuda_check.py)")
    parser.add_argument("--gpu-tests", metavar="DIR", help="then, on a Hopper GPU, run the GPU correctness tests in DIR "
                        "(pytest -m gpu: the Triton and cuDNN kernels against the reference); skipped elsewhere")
    args = parser.parse_args(argv)
    try:
        cfg = load_with_flags(CheckConfig, args.config, {"head_dims": args.head_dims, "causal": args.causal,
                                                         "load_variants": True if args.load_variants else None,
                                                         "store_variants": True if args.store_variants else None})
    except ValueError as err:
        parser.exit(2, f"dm-kernel-check: error: {err}\n")
    causal = {"both": CAUSAL, "yes": (True,), "no": (False,)}[cfg.causal]
    if args.cuda:
        from deltamatch.kernels import cuda_build, cuda_check

        try:
            found = cuda_check.check()
        except cuda_build.CudaBuildError as err:
            parser.exit(1, f"dm-kernel-check: error: {err}\n")
    else:
        found = (analyse(spec, d) for d in cfg.head_dims
                 for spec in kernel_specs(d, causal, cfg.load_variants, cfg.store_variants))
    rows = []
    for row in found:  # a Triton row as soon as its kernel is compiled
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        write_text(args.out, "".join(json.dumps(r) + "\n" for r in rows))
    if not all(r["ok"] for r in rows):
        return 1
    return gpu_tests(args.gpu_tests) if args.gpu_tests else 0


def gpu_tests(folder: str) -> int:
    """Run the GPU correctness tests in ``folder`` where a Hopper GPU is present (their exit status); 0 elsewhere."""
    found = hardware()
    if not found["hopper"]:
        print(f"GPU correctness tests not run: no Hopper GPU ({json.dumps(found)})", flush=True)
        return 0
    print(f"GPU correctness tests on {found['device']}: pytest -m gpu {folder}", flush=True)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", folder]).returncode


if __name__ == "__main__":
    sys.exit(main())
