"""Build check of the CUDA library without a GPU: its SASS against the matrix instructions each kernel declares.

``dm-kernel-check --cuda`` builds ``build/cuda/libdm_attn_sm90.so`` (``cuda_build.build``; skipped when up to date)
and prints one JSON row per ``__global__`` function in the same schema as the Triton rows (``deltamatch.kernels.check``):

- ``qgmma``: QGMMA instructions in the SASS, and ``qgmma_forms`` by form (``QGMMA.64x64x32.F32.E4M3.E4M3``: 2);
  ``expected``: the form and count ``cuda_build.KERNELS`` declares;
- ``fp8_wgmma``: ``wgmma.mma_async … e4m3`` in the PTX of the same source (ptxas lowers each to one QGMMA);
- ``other_mma``: any other matrix instruction (HGMMA, HMMA, IMMA, non-FP8 wgmma, ``mma.sync``);
- ``registers``, ``sass_registers``, ``spill_bytes`` (STACK + LOCAL), ``stack_bytes``, ``shared_bytes`` from
  ``cuobjdump --dump-resource-usage`` and the SASS, read with the cuobjdump that Triton ships; ``claimed_registers``:
  the most a warpgroup claims by ``setmaxnreg`` (SASS ``USETMAXREG.TRY_ALLOC``), which the SASS may use beyond
  ``registers`` (the launch's count);
- ``loop_instructions`` and ``loop_mix``: the size of the innermost loop that holds a QGMMA (the tile loop: from a
  backward branch's target up to the branch, every arm of a branch inside counted once) and the count of its
  arithmetic, conversion and shared-memory opcodes (:data:`LOOP_OPS`); None where no loop holds one. A kernel's cost
  has followed its loop's instructions since the CUDA kernels became issue-bound (kernels/NOTES.md), so the rows
  record it for every build;
- ``problems`` and ``ok``: a kernel in the SASS but not declared (or the reverse) is a problem too.
"""

import re
import subprocess
from collections import Counter
from pathlib import Path

from deltamatch.kernels import cuda_build
from deltamatch.kernels.check import _cuobjdump

OTHER_MMA = re.compile(r"\b(HGMMA|HMMA|IMMA)\b")
SASS_LINE = re.compile(r"/\*([0-9a-f]+)\*/\s+([^;]*?)\s*;")
BACKWARD = re.compile(r"\bBRA(?:\.\S+)?\s+(?:\S+,\s*)?0x([0-9a-f]+)")
LOOP_OPS = ("QGMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "F2FP", "LOP3", "ISETP", "LDS", "STS", "R2UR")
"""The opcodes ``loop_mix`` counts (the first dotted part of each instruction's opcode)."""
CLAIM = re.compile(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL\s+\w+,\s*0x([0-9a-f]+)")


def _by_name(text: str, header: str) -> dict[str, str]:
    """Split cuobjdump or PTX text into each function's part, keyed by name (``header`` precedes every name)."""
    parts = re.split(rf"{header}\s*(\w+)", text)
    return {name: body for name, body in zip(parts[1::2], parts[2::2])}


def tile_loop(code: str) -> tuple[int, dict[str, int]] | tuple[None, None]:
    """The innermost loop of one kernel's SASS that holds a QGMMA: the smallest range from a backward branch's target
    up to that branch (excluded) with a QGMMA in it and no EXIT (which leaves out the jumps back from the out-of-line
    barrier-wait retries ptxas places after the kernel's exits); its instruction count and :data:`LOOP_OPS` counts."""
    lines = [(int(a, 16), text) for a, text in SASS_LINE.findall(code)]
    at = {address: i for i, (address, _) in enumerate(lines)}
    best = None
    for i, (address, text) in enumerate(lines):
        branch = BACKWARD.search(text)
        target = int(branch.group(1), 16) if branch else address
        if target >= address or target not in at:
            continue
        start = at[target]
        if best is not None and i - start >= best[1] - best[0]:
            continue
        body = [t for _, t in lines[start:i]]
        if any("QGMMA" in t for t in body) and not any(re.search(r"\bEXIT\b", t) for t in body):
            best = (start, i)
    if best is None:
        return None, None
    ops = Counter(t.split()[1 if t.startswith("@") else 0].split(".")[0] for _, t in lines[best[0]:best[1]])
    return best[1] - best[0], {op: ops[op] for op in LOOP_OPS}


def analyse_library(library: str | Path, ptx: str) -> list[dict]:
    """One row per kernel in ``library``'s SASS and per kernel ``cuda_build.KERNELS`` declares."""
    def dump(flag: str) -> str:
        return subprocess.run([_cuobjdump(), flag, str(library)], capture_output=True, text=True, check=True).stdout

    sass = _by_name(dump("-sass"), r"Function\s*:")
    usage = _by_name(dump("--dump-resource-usage"), r"Function")
    entries = _by_name(ptx, r"\.entry")
    declared = {k.name: k for k in cuda_build.KERNELS}
    rows = []
    for name in sorted(set(sass) | set(declared)):
        code, kernel = sass.get(name, ""), declared.get(name)
        res = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage.get(name, ""))}
        forms = Counter(re.findall(r"\b(QGMMA\.[\w.]+)", code))
        wgmma = [ln for ln in entries.get(name, "").splitlines() if "wgmma.mma_async" in ln]
        fp8 = sum(".e4m3.e4m3" in ln for ln in wgmma)
        loop, mix = tile_loop(code)
        row = dict(
            name=name, variant="cuda", head_dim=None,
            expected=(", ".join(f"{f} x{c}" for f, c in kernel.forms.items()) or None) if kernel else None,
            fp8_wgmma=fp8, qgmma=sum(forms.values()), qgmma_forms=dict(forms),
            other_mma=len(wgmma) - fp8 + entries.get(name, "").count("mma.sync") + len(OTHER_MMA.findall(code)),
            registers=res.get("REG"),
            sass_registers=max((int(r) + 1 for r in re.findall(r"\bR(\d+)\b", code)), default=0),
            claimed_registers=max((int(r, 16) for r in CLAIM.findall(code)), default=None),
            spill_bytes=res.get("LOCAL", 0) + res.get("STACK", 0), stack_bytes=res.get("STACK", 0),
            shared_bytes=res.get("SHARED"), loop_instructions=loop, loop_mix=mix,
        )
        row["problems"] = problems(row, kernel, in_sass=name in sass)
        row["ok"] = not row["problems"]
        rows.append(row)
    return rows


def problems(row: dict, kernel: cuda_build.CudaKernel | None, in_sass: bool) -> list[str]:
    """What disagrees between one kernel's SASS, its PTX and its declaration (empty when it passes)."""
    if kernel is None:
        return ["in the SASS but not declared in cuda_build.KERNELS"]
    if not in_sass:
        return ["declared in cuda_build.KERNELS but not in the library's SASS"]
    found = []
    want = kernel.forms
    if row["qgmma_forms"] != want:
        found.append(f"SASS: QGMMA {row['qgmma_forms']}, declared {want}")
    if row["fp8_wgmma"] != kernel.expected_wgmma():
        found.append(f"PTX: {row['fp8_wgmma']} e4m3 wgmma.mma_async, declared {kernel.expected_wgmma()}")
    if row["other_mma"]:
        found.append(f"{row['other_mma']} MMA instructions that are not FP8 wgmma")
    if row["spill_bytes"] > kernel.spill_bytes:
        found.append(f"{row['spill_bytes']} bytes of stack/local memory per thread (declared {kernel.spill_bytes})")
    covered = max(row["registers"] or 0, row.get("claimed_registers") or 0)
    if row["registers"] is None or covered < row["sass_registers"]:
        found.append(f"register count {row['registers']} (claimed {row.get('claimed_registers')}) does not cover "
                     f"R0..R{row['sass_registers'] - 1} in the SASS")
    return found


def check(out_dir: str | Path | None = None) -> list[dict]:
    """Build the library in ``out_dir`` (default ``build/cuda``; when stale) and its PTX beside it (likewise) and
    analyse them; raises ``cuda_build.CudaBuildError``."""
    library = cuda_build.build(out_dir or cuda_build.BUILD_DIR)
    return analyse_library(library, cuda_build.ptx(library.parent).read_text())
