"""Build of the CUDA C++ kernels (``kernels/cuda/*.cu``) into one ``extern "C"`` library, ``libdm_attn_sm90.so``.

``dm-cuda-build [--out DIR] [--force]`` compiles with nvcc for sm_90a only (``-gencode=arch=compute_90a,code=sm_90a``:
wgmma and setmaxnreg need the ``a`` target, and the ``-arch=sm_90a`` shorthand also ran a plain sm_90 pass that
rejected them, /work/.library/device/HOPPER.md) into ``build/cuda/`` (git-ignored; the device call carries it). The
CUDA runtime, libstdc++ and libgcc are linked statically, so the library needs only libc: it loads through ctypes
under any torch (kernels/CUDA_BACKWARD.md section 4: torch's C++ ABI differs between the torch here and the device's).

The kernels use inline PTX (``kernels/cuda/wgmma.cuh``), not CuTe/CUTLASS: the M0/M1 primitives need descriptors,
two wgmma shapes and a cvt, a build takes a few seconds with no header download, and the PTX states the fragment
layouts the tests pin down. The M2 dV kernel (``dv_factored.cu``) stays in inline PTX too, with cp.async loads; CuTe
and TMA can come with the warp-specialised pipeline (M3/M6).

A build is skipped when ``build/cuda/libdm_attn_sm90.so.stamp`` holds the hash of the sources and the flags.
``KERNELS`` declares each kernel's matrix instructions; ``deltamatch.kernels.cuda_check`` holds the SASS to it.
"""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from deltamatch.atomic import atomic_path, write_text

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
LIBRARY = "libdm_attn_sm90.so"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build" / "cuda"
"""``build/cuda`` in the checkout (this module lives in ``kernels/``)."""
ARCH = "-gencode=arch=compute_90a,code=sm_90a"
NVCC_FLAGS = ("-std=c++17", "-O3", ARCH, "-lineinfo", "-Xcompiler", "-fPIC,-static-libstdc++,-static-libgcc",
              "-shared", "-cudart", "static", "-Xptxas", "-v")
SERIALISED = re.compile(r"\(C75\d\d\) Potential Performance Loss: wgmma\.mma_async instructions are serialized "
                        r"(due to .*?) in the function '(\w+)'")
"""ptxas's note (with ``-v`` only; C7510, C7511, C7515, … by reason) that it serialised every wgmma of a kernel: each
waits for the previous one, which undoes the pipeline the kernel was written for. The build refuses such a library (kernels/CUDA_BACKWARD.md, M2)."""
NVCC_ENV = "NVCC"
"""Environment variable naming the nvcc to use (default: ``nvcc`` on the PATH, then /usr/local/cuda/bin/nvcc)."""


@dataclass(frozen=True)
class CudaKernel:
    """One ``__global__`` function of the library and the matrix instructions its SASS must hold."""

    name: str
    """Its ``extern "C"`` name, as cuobjdump prints it."""
    forms: dict[str, int]
    """Each QGMMA form the SASS must hold (``QGMMA.64x64x32.F32.E4M3.E4M3``) and how many; empty for a kernel without
    matmuls. The PTX must hold as many ``wgmma.mma_async … e4m3`` in all."""
    spill_bytes: int = 0
    """The stack ptxas may give it (spilled registers), in bytes per thread: 0 for every kernel but the fused dK/dV,
    whose consumers hold two FP32 accumulators at 240 registers and spill a few scalars, reloaded once per tile, and
    the persistent δ pass, whose producer keeps its loop's state there."""

    def expected_wgmma(self) -> int:
        """How many e4m3 ``wgmma.mma_async`` the PTX must hold."""
        return sum(self.forms.values())


def _qgmma(n: int) -> str:
    return f"QGMMA.64x{n}x32.F32.E4M3.E4M3"


KERNELS = (
    CudaKernel("dm_wgmma_ss_n64_noswizzle", {_qgmma(64): 4}),  # four k = 32 steps over K = 128
    CudaKernel("dm_wgmma_ss_n64_swizzle128", {_qgmma(64): 4}),
    CudaKernel("dm_wgmma_ss_n128_swizzle128", {_qgmma(128): 4}),
    CudaKernel("dm_wgmma_rs_n64_swizzle128", {_qgmma(64): 4}),
    CudaKernel("dm_wgmma_rs_n128_swizzle128", {_qgmma(128): 4}),
    CudaKernel("dm_quant_e4m3", {}),
    CudaKernel("dm_dpt_tile_n64", {_qgmma(64): 4}),  # the swapped dP̂ᵀ tile, V̂ dÔᵀ over D = 128
    # the factored dV (dv_factored.cu), one loop body per query tile: Sᵀ = K̂ Q̂ᵀ (four SS m64n64k32 over D = 128),
    # then dV += P̂ᵀ dÔᶜ (two RS m64n128k32 over 64 queries)
    CudaKernel("dm_dv_factored_promoted", {_qgmma(64): 4, _qgmma(128): 2}),
    CudaKernel("dm_dv_factored_unpromoted", {_qgmma(64): 4, _qgmma(128): 2}),
    # its pipelined forms, cp.async or TMA (Sᵀ of the next tile and dV of this one issued together, the softmax beside
    # dV): Sᵀ of the first tile before the loop, dV of the last after it: 2 x 4 m64n64k32 (SS, or RS with K̂ in
    # registers) and 2 x 2 m64n128k32
    *(CudaKernel(f"dm_dv_factored_{variant}_{promoted}", {_qgmma(64): 8, _qgmma(128): 4})
      for variant in ("pipe3_ss", "pipe3_rs", "pipe5_rs", "tma3", "tma4") for promoted in ("promoted", "unpromoted")),
    CudaKernel("dm_dv_factored_tma3x3_unpromoted", {_qgmma(64): 8, _qgmma(128): 4}),
    # the factored dK (dk_factored.cu): Sᵀ and dP̂ᵀ (2 x four SS m64n64k32) for the first tile and in the loop, dK
    # (two RS m64n128k32) in the loop and for the last tile
    CudaKernel("dm_dk_factored_tma3_unpromoted", {_qgmma(64): 16, _qgmma(128): 4}),
    # the fused, warp-specialised dK/dV (dkdv_factored.cu): promoted, one loop body per tile (Sᵀ and dP̂ᵀ, then dV and
    # dK: 8 SS m64n64k32, 4 RS m64n128k32); unpromoted, pipelined like the dK (the first tile's Sᵀ and dP̂ᵀ before the
    # loop, the last tile's dV and dK after it)
    *(CudaKernel(f"dm_dkdv_factored_{variant}_promoted", {_qgmma(64): 8, _qgmma(128): 4}, spill_bytes=24)
      for variant in ("ws3", "ws4")),
    *(CudaKernel(f"dm_dkdv_factored_{variant}_unpromoted", {_qgmma(64): 16, _qgmma(128): 8}, spill_bytes=24)
      for variant in ("ws3", "ws4")),
    CudaKernel("dm_dkdv_factored_ws3s_unpromoted", {_qgmma(64): 8, _qgmma(128): 4}, spill_bytes=24),
    # at D = 64 (without dQ): Sᵀ and dP̂ᵀ over 64 channels (2 x two SS m64n64k32), dV and dK over the tile's 64 queries
    # into 64 channels (2 x two RS m64n64k32); unpromoted, at two sites
    *(CudaKernel(f"dm_dkdv_factored_{variant}_{promoted}_d64", {_qgmma(64): count})
      for variant in ("ws3", "ws4") for promoted, count in (("promoted", 8), ("unpromoted", 16))),
    # with dQ (promoted): also the tile's dQ product over the CTA's 128 keys (4 SS m64n64k32 per half), reduced into
    # dq_acc by a producer thread, which the epilogue kernel turns into dQ
    CudaKernel("dm_dkdv_factored_ws3_promoted_dq", {_qgmma(64): 12, _qgmma(128): 4}, spill_bytes=32),
    CudaKernel("dm_dkdv_factored_ws3_promoted_dq_ordered", {_qgmma(64): 12, _qgmma(128): 4}, spill_bytes=32),
    # ws3x: the same with the dŜ tile written by lane exchange (a word a store where ws3 stores bytes)
    CudaKernel("dm_dkdv_factored_ws3x_promoted_dq", {_qgmma(64): 12, _qgmma(128): 4}, spill_bytes=32),
    CudaKernel("dm_dkdv_factored_ws3x_promoted_dq_ordered", {_qgmma(64): 12, _qgmma(128): 4}, spill_bytes=32),
    # ws3xf: ws3x with 448 folded into the row terms (one FMUL an element fewer)
    CudaKernel("dm_dkdv_factored_ws3xf_promoted_dq", {_qgmma(64): 12, _qgmma(128): 4}, spill_bytes=32),
    CudaKernel("dm_dkdv_factored_ws3xf_promoted_dq_ordered", {_qgmma(64): 12, _qgmma(128): 4}, spill_bytes=32),
    # ws3xfs: ws3xf with the promotion in 64-channel halves (dV's and dK's products 2 + 2 m64n64 each, not 2 m64n128);
    # ws3xfd: that with dQ's product in a fourth warpgroup (4 channel chunks of 4 SS m64n32k32 a tile)
    *(CudaKernel(f"dm_dkdv_factored_ws3xfs_promoted_dq{o}", {_qgmma(64): 20}, spill_bytes=32) for o in ("", "_ordered")),
    *(CudaKernel(f"dm_dkdv_factored_ws3xfd_promoted_dq{o}", {_qgmma(64): 16, _qgmma(32): 16}, spill_bytes=32)
      for o in ("", "_ordered")),
    # ws3xfdt: ws3xfd with dK and dV staged in shared memory and written by tensor stores
    *(CudaKernel(f"dm_dkdv_factored_ws3xfdt_promoted_dq{o}", {_qgmma(64): 16, _qgmma(32): 16}, spill_bytes=32)
      for o in ("", "_ordered")),
    # ws3xfdp: ws3xfd with the promotion in quarters (dV's and dK's products 4 + 4 m64n32 pairs), pipelined
    *(CudaKernel(f"dm_dkdv_factored_ws3xfdp_promoted_dq{o}", {_qgmma(64): 8, _qgmma(32): 32}, spill_bytes=32)
      for o in ("", "_ordered")),
    # ws3xp: ws3x ordered, persistent (key blocks from a counter, one CTA an SM); its spills are the producer's and the
    # reducers' (24 registers: the walk of each key block) but for one word a consumer thread keeps a block
    CudaKernel("dm_dkdv_factored_ws3xp_promoted_dq_ordered", {_qgmma(64): 12, _qgmma(128): 4}, spill_bytes=96),
    # at D = 64 with dQ, ws3xfd's form: the consumers' products over 64 channels (2 x two SS m64n64k32, 2 x two RS
    # m64n64k32), the dQ warpgroup's two 32-channel chunks of 4 SS m64n32k32; the spills the reducers' as at D = 128;
    # ws3xfdt's the same with dK and dV through shared memory and tensor stores
    *(CudaKernel(f"dm_dkdv_factored_{form}_promoted_dq{o}_d64", {_qgmma(64): 8, _qgmma(32): 8}, spill_bytes=32)
      for form in ("ws3xfd", "ws3xfdt") for o in ("", "_ordered")),
    CudaKernel("dm_dkdv_dq_epilogue", {}),
    CudaKernel("dm_dkdv_dq_epilogue_d64", {}),
    # the factored dQ (dq_factored.cu), one loop body per key tile: S and dP̂ (8 SS m64n64k32), then dQ (2 RS
    # m64n128k32)
    *(CudaKernel(f"dm_dq_factored_ws3_{promoted}", {_qgmma(64): 8, _qgmma(128): 2})
      for promoted in ("promoted", "unpromoted")),
    # at D = 64: S and dP̂ over 64 channels (2 x two SS m64n64k32), dQ into 64 channels (two RS m64n64k32)
    *(CudaKernel(f"dm_dq_factored_ws3_{promoted}_d64", {_qgmma(64): 6}) for promoted in ("promoted", "unpromoted")),
    # the factored forward (fwd_factored.cu), one loop body per key tile: S (4 SS m64n64k32), then O += P̂ V̂ᶜ (2 RS
    # m64n128k32)
    *(CudaKernel(f"dm_fwd_factored_ws4_{promoted}", {_qgmma(64): 4, _qgmma(128): 2})
      for promoted in ("promoted", "unpromoted")),
    # matched's δ pass with dŜ's row scales (delta_factored.cu): S and dP̂ (8 SS m64n64k32) per key tile; pipelined,
    # the first tile's before the loop and the next tile's in it
    CudaKernel("dm_delta_factored_ws4", {_qgmma(64): 8}),
    CudaKernel("dm_delta_factored_ws4p", {_qgmma(64): 24}),  # the first tile before the loop, two in it
    CudaKernel("dm_delta_factored_ws4x2", {_qgmma(64): 8}),  # ws4 at two CTAs per SM, its consumers at 104 registers
    # the δ pass over 128-key tiles (delta_wide.cu): S and dÔ V̂ᵀ (8 SS m64n128k32) per tile; pipelined, the first
    # tile's S before the loop, two steps (dÔ V̂ᵀ, the next S) in it, and the last tile's dÔ V̂ᵀ at either exit
    CudaKernel("dm_delta_wide_w4", {_qgmma(128): 8}),
    CudaKernel("dm_delta_wide_w4p", {_qgmma(128): 28}),
    CudaKernel("dm_delta_wide_w4t", {_qgmma(128): 8}),  # w4 with the consumers' turns
    CudaKernel("dm_delta_wide_w4po", {_qgmma(128): 28}),  # w4p with the second consumer started half a tile late
    # w4p persistent: one CTA an SM, query tiles by a counter; its producer thread, at 24 registers after setmaxnreg,
    # keeps the loop's state (the tile, the ring's count) on the stack: a few local loads and stores a key tile
    CudaKernel("dm_delta_wide_w4pd", {_qgmma(128): 28}, spill_bytes=24),
    # w4p with a share of the exponentials on the FMA pipe (factored.cuh ex2_poly)
    *(CudaKernel(f"dm_delta_wide_w4pe{k}", {_qgmma(128): 28}) for k in (8, 4, 2)),
    # w4p and two of those with max P bounded from the forward's row maxima (factored.cuh p_max_bound)
    *(CudaKernel(f"dm_delta_wide_w4pm{e}", {_qgmma(128): 28}) for e in ("", "e8", "e4")),
    # w4p at D = 64, and its emulating and row-max forms: rows of 64 codes, two k = 32 steps a product where D = 128
    # takes four
    *(CudaKernel(f"dm_delta_wide_{v}_d64", {_qgmma(128): 14})
      for v in ("w4p", "w4pe8", "w4pe4", "w4pe2", "w4pm", "w4pme8", "w4pme4")),
    # the forward's w4p at D = 64 and its emulating forms: S over 64 channels (2 k-steps, at 2 sites), P̂ V̂ᶜ into 64
    # channels (m64n64k32, 4 k-steps over the tile's 128 keys, at 2 sites)
    *(CudaKernel(f"dm_fwd_wide_{v}_{promoted}_d64", {_qgmma(128): 4, _qgmma(64): 8})
      for v in ("w4p", "w4pe8", "w4pe4", "w4pe2") for promoted in ("promoted", "unpromoted")),
    # its pipelined form: S of the first tile before the loop, S of the next and P̂ V̂ᶜ of this one in it, the last
    # tile's P̂ V̂ᶜ after it
    *(CudaKernel(f"dm_fwd_factored_ws4p_{promoted}", {_qgmma(64): 8, _qgmma(128): 4})
      for promoted in ("promoted", "unpromoted")),
    # the factored forward over 128-key tiles (fwd_wide.cu): S (4 SS m64n128k32) and O += P̂ V̂ᶜ (4 RS m64n128k32),
    # the first tile's S before the loop in both forms, and in the pipelined one the last tile's P̂ V̂ᶜ after it
    *(CudaKernel(f"dm_fwd_wide_w4_{promoted}", {_qgmma(128): 12}) for promoted in ("promoted", "unpromoted")),
    *(CudaKernel(f"dm_fwd_wide_{v}_{promoted}", {_qgmma(128): 16})
      for v in ("w4p", "w4pp", "w4po", "w4pe8", "w4pe4", "w4pe2") for promoted in ("promoted", "unpromoted")),
    # matched_factored's quantisation of K, V and dO (quant_passes.cu): per-channel statistics, then both casts; each
    # at D = 128 and (suffix _d64) at D = 64
    *(CudaKernel(f"dm_quant_stats_{stat}_{dtype}{d}", {}) for stat in ("centred", "absmax")
      for dtype in ("bf16", "fp16") for d in ("", "_d64")),
    *(CudaKernel(f"dm_quant_dual_{rows}{centred}_{order}_{dtype}{d}", {}) for rows in (64, 128)
      for centred in ("", "_centred") for order in ("natural", "fragment") for dtype in ("bf16", "fp16")
      for d in ("", "_d64")),
    *(CudaKernel(f"dm_quant_block_128_{dtype}{d}", {}) for dtype in ("bf16", "fp16") for d in ("", "_d64")),  # Q's
    # Q'ᶜ (the rows times their scales): the max |x| statistics, then the channel-major cast alone
    *(CudaKernel(f"dm_quant_stats_scaled_{dtype}{d}", {}) for dtype in ("bf16", "fp16") for d in ("", "_d64")),
    *(CudaKernel(f"dm_quant_channel_scaled_{order}_{dtype}{d}", {}) for order in ("natural", "fragment")
      for dtype in ("bf16", "fp16") for d in ("", "_d64")),
)


class CudaBuildError(RuntimeError):
    """The library cannot be built here; the message says what is missing."""


def find_nvcc() -> str:
    """The nvcc to build with: ``$NVCC``, ``nvcc`` on the PATH, or /usr/local/cuda/bin/nvcc."""
    if os.environ.get(NVCC_ENV):
        found = shutil.which(os.environ[NVCC_ENV])
        if not found:
            raise CudaBuildError(f"${NVCC_ENV}={os.environ[NVCC_ENV]!r} is not an executable")
        return found
    found = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")
    if not found:
        raise CudaBuildError("nvcc not found (not on the PATH, not /usr/local/cuda/bin/nvcc; set $NVCC): the CUDA "
                             "kernels need the CUDA 13 toolkit to build")
    return found


def sources() -> list[Path]:
    """The ``.cu`` files compiled into the library and the headers they include (they all enter the stamp)."""
    if not SOURCE_DIR.is_dir():
        raise CudaBuildError(f"CUDA sources not found at {SOURCE_DIR}: the library builds from a source checkout")
    return sorted(SOURCE_DIR.glob("*.cu")) + sorted(SOURCE_DIR.glob("*.cuh"))


def _stamp(files: list[Path], flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256(" ".join(flags).encode())
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def serialised_wgmma(log: str) -> dict[str, str]:
    """The kernels whose wgmma ptxas serialised, by name, with its reason, from nvcc's output under ``-Xptxas -v``."""
    return {name: reason for reason, name in SERIALISED.findall(log)}


def _run_nvcc(args: list[str]) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode:
        text = done.stderr + done.stdout
        hint = ""
        if "cuda_runtime.h" in text or "cuda_fp8" in text:
            hint = " (the CUDA headers are missing: is this nvcc's toolkit complete?)"
        raise CudaBuildError(f"nvcc failed{hint}: {' '.join(args)}\n{text[-4000:]}")
    return done.stderr + done.stdout


def build(out_dir: str | os.PathLike = BUILD_DIR, force: bool = False, defines: tuple[str, ...] = ()) -> Path:
    """Build ``out_dir/libdm_attn_sm90.so`` unless its stamp matches the sources and flags (then no nvcc is needed,
    e.g. for a carried build); return its path. ``defines``: macros for a diagnostic build (``DM_DQ_CLOCK``: the
    dQ-in-dK/dV kernels count where they wait, tools/device/dq_clock.py), into its own ``out_dir``."""
    files = sources()
    out = Path(out_dir) / LIBRARY
    stamp_file = out.with_name(out.name + ".stamp")
    flags = (*NVCC_FLAGS, *(f"-D{name}" for name in defines))
    stamp = _stamp(files, flags)
    if not force and out.exists() and stamp_file.exists() and stamp_file.read_text().strip() == stamp:
        return out
    nvcc = find_nvcc()
    with atomic_path(out) as tmp:
        log = _run_nvcc([nvcc, *flags, "-o", str(tmp), *map(str, (f for f in files if f.suffix == ".cu"))])
        if serial := serialised_wgmma(log):
            raise CudaBuildError("ptxas serialised every wgmma of " + "; ".join(
                f"{name} ({reason})" for name, reason in sorted(serial.items())) + ": keep no wgmma group pending "
                "across a loop's back edge (kernels/CUDA_BACKWARD.md, M2 as measured)")
    write_text(stamp_file, stamp + "\n")
    return out


PTX_FLAGS = ("-std=c++17", "-O3", ARCH, "-ptx")


def ptx(out_dir: str | os.PathLike) -> Path:
    """The PTX of the library's sources (one file per ``.cu``, compiled side by side, concatenated), for the
    instruction counts: ``out_dir/all.ptx``, reused while its stamp matches the sources (so the library's folder can
    keep it beside the library)."""
    files = sources()
    path = Path(out_dir) / "all.ptx"
    stamp_file = path.with_name(path.name + ".stamp")
    stamp = _stamp(files, PTX_FLAGS)
    if path.exists() and stamp_file.exists() and stamp_file.read_text().strip() == stamp:
        return path
    nvcc = find_nvcc()
    units = [f for f in files if f.suffix == ".cu"]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        targets = [Path(tmp) / f"{cu.stem}.ptx" for cu in units]
        list(pool.map(lambda job: _run_nvcc([nvcc, *PTX_FLAGS, "-o", str(job[1]), str(job[0])]), zip(units, targets)))
        write_text(path, "\n".join(t.read_text() for t in targets))
    write_text(stamp_file, stamp + "\n")
    return path


def needed_libraries(library: str | os.PathLike) -> list[str]:
    """The shared libraries ``library`` names as NEEDED (readelf; empty where readelf is missing)."""
    if not shutil.which("readelf"):
        return []
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(BUILD_DIR), help=f"output folder (default {BUILD_DIR})")
    parser.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    parser.add_argument("--define", action="append", default=[], metavar="MACRO",
                        help="a macro of a diagnostic build (DM_DQ_CLOCK), into its own --out folder")
    args = parser.parse_args(argv)
    if args.define and Path(args.out).resolve() == BUILD_DIR.resolve():
        parser.error(f"--define builds a diagnostic library: give it its own --out, not {BUILD_DIR}")
    try:
        path = build(args.out, force=args.force, defines=tuple(args.define))
    except CudaBuildError as err:
        print(f"dm-cuda-build: error: {err}", file=sys.stderr)
        return 1
    print(f"{path} ({path.stat().st_size} bytes; needs {', '.join(needed_libraries(path)) or 'nothing listed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
