"""The CUDA library without a GPU: nvcc builds it for sm_90a, each kernel's SASS holds the QGMMA it declares, the
loader says why it cannot run, the A-fragment permutation's algorithm is right (a model of the register shuffle), and
the emulated exponential is within its stated error (a model of its FP32 steps, its coefficients read from the source),
and so is the δ pass's bound on max P from the forward's row max (the same kind of model).

One build per module (about 25 s of nvcc), into a temporary folder with its PTX beside it; skipped with the reason
where nvcc is missing.
"""

import ctypes
import json
import re
from pathlib import Path

import pytest
import torch

from deltamatch.kernels import check, cuda_build, cuda_check, cuda_lib


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    try:
        cuda_build.find_nvcc()
    except cuda_build.CudaBuildError as err:
        pytest.skip(str(err))
    return cuda_build.build(tmp_path_factory.mktemp("cuda"))


def test_the_library_needs_only_libc(library):
    needed = cuda_build.needed_libraries(library)
    assert needed, "readelf listed nothing"
    assert not [n for n in needed if not n.startswith(("libc.so", "ld-linux", "libm.so", "libdl.so", "libpthread",
                                                        "librt.so"))], needed  # cudart, libstdc++, libgcc: static


@pytest.fixture(scope="module")
def rows(library):
    """The SASS check's rows for the library (its PTX built beside it, once: dm-kernel-check below reuses it)."""
    return cuda_check.analyse_library(library, cuda_build.ptx(library.parent).read_text())


def test_every_kernel_has_the_declared_qgmma_and_no_spills(rows):
    assert [r["name"] for r in rows] == sorted(k.name for k in cuda_build.KERNELS)
    for r in rows:
        assert r["ok"], r
    qgmma = {r["name"]: r["qgmma_forms"] for r in rows}
    assert qgmma["dm_wgmma_rs_n128_swizzle128"] == {"QGMMA.64x128x32.F32.E4M3.E4M3": 4}
    assert qgmma["dm_quant_e4m3"] == {}
    assert qgmma["dm_dpt_tile_n64"] == {"QGMMA.64x64x32.F32.E4M3.E4M3": 4}
    for name in ("dm_dv_factored_promoted", "dm_dv_factored_unpromoted"):  # one loop body: S (SS), then dV (RS)
        assert qgmma[name] == {"QGMMA.64x64x32.F32.E4M3.E4M3": 4, "QGMMA.64x128x32.F32.E4M3.E4M3": 2}


def test_the_tile_loops_hold_what_each_form_changed(rows):
    """The rows' tile loops (``cuda_check.tile_loop``) where a form's change is a count: the δ pass's
    ``cuda_lib.DELTA_ROW_MAX`` forms drop the per-element max P (64 FMNMX a thread and tile, 128 in its two-tile loop)
    and keep every wgmma and exponential of the form without it; the emulated exponentials take 8, 16 or 32 of a
    tile's 64 MUFU off (every 8th, 4th or 2nd 8-key chunk; the forward's loop holds its masked and unmasked bodies, so
    twice that, as the δ pass's two tiles); the kernels without a loop over tiles have none."""
    by_name = {r["name"]: r for r in rows}

    def mix(name):
        return by_name[name]["loop_mix"]

    for with_max, without in (("w4pm", "w4p"), ("w4pme8", "w4pe8"), ("w4pme4", "w4pe4")):
        ours, theirs = mix(f"dm_delta_wide_{with_max}"), mix(f"dm_delta_wide_{without}")
        assert ours["FMNMX"] == theirs["FMNMX"] - 128, (with_max, ours, theirs)
        assert ours["MUFU"] == theirs["MUFU"] and ours["QGMMA"] == theirs["QGMMA"] == 16, (with_max, ours, theirs)
        assert by_name[f"dm_delta_wide_{with_max}"]["loop_instructions"] < by_name[f"dm_delta_wide_{without}"][
            "loop_instructions"]
    for every, fewer in ((8, 16), (4, 32), (2, 64)):
        assert mix(f"dm_delta_wide_w4pe{every}")["MUFU"] == mix("dm_delta_wide_w4p")["MUFU"] - fewer
        assert mix(f"dm_fwd_wide_w4pe{every}_promoted")["MUFU"] == mix("dm_fwd_wide_w4p_promoted")["MUFU"] - fewer
    assert by_name["dm_quant_e4m3"]["loop_instructions"] is None and by_name["dm_quant_e4m3"]["loop_mix"] is None


def test_the_tile_loop_is_the_innermost_with_a_wgmma_and_no_exit():
    """``cuda_check.tile_loop`` on SASS written here: of the backward branches, the smallest range holding a QGMMA — not a
    TMA retry loop (none), not the outer loop (larger), and not the jump back from an out-of-line barrier wait placed
    after the EXIT, whose range is the smallest of the three that hold a QGMMA."""
    wait = "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR7], R0"
    sass = "\n".join(f"        /*{a:04x}*/                   {text} ;" for a, text in [
        (0x00, "UTMALDG.2D [UR4], [UR16]"), (0x10, "@P0 BRA.U.ANY 0x0"),  # a retry loop: no QGMMA
        (0x20, "FADD R4, R4, R5"), (0x30, "FADD R4, R4, R5"), (0x40, "FADD R4, R4, R5"), (0x50, "FADD R4, R4, R5"),
        (0x60, wait), (0x70, "@!P0 BRA 0xe0"),  # the wait's retry, out of line
        (0x80, "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR24], RZ, !UPT"), (0x90, "MUFU.EX2 R1, R2"),
        (0xa0, "FMNMX R3, R3, R1, !PT"), (0xb0, "@P1 BRA 0x20"),  # the tile loop: 0x20 .. 0xa0, 9 instructions
        (0xc0, "@!P2 BRA 0x0"),  # the outer loop
        (0xd0, "EXIT"), (0xe0, wait), (0xf0, "@!P0 BRA 0xe0"), (0x100, "BRA 0x80")])  # back after the wait: 8
    size, mix = cuda_check.tile_loop(sass)
    assert size == 9 and (mix["QGMMA"], mix["FADD"], mix["MUFU"], mix["FMNMX"], mix["LDS"]) == (1, 4, 1, 1, 0), mix
    assert cuda_check.tile_loop(sass.replace("QGMMA", "HGMMA")) == (None, None)


def test_the_dv_kernel_fits_two_ctas_per_sm(rows):
    """Registers and shared memory of the M2 dV kernels (recorded in CUDA_BACKWARD.md): at most 255 registers with
    no spills (the check above), and few enough for two 128-thread CTAs per SM, the overlap this kernel relies on."""
    by_name = {r["name"]: r for r in rows}
    for name in ("dm_dv_factored_promoted", "dm_dv_factored_unpromoted"):
        assert by_name[name]["registers"] * 128 * 2 <= 65536, by_name[name]
        assert by_name[name]["shared_bytes"] * 2 <= 227 * 1024, by_name[name]


def test_an_up_to_date_build_is_kept_and_needs_no_nvcc(library, monkeypatch):
    before = library.stat().st_mtime_ns
    monkeypatch.setenv(cuda_build.NVCC_ENV, "/nonexistent/nvcc")  # a carried build/cuda on a machine without nvcc
    assert cuda_build.build(library.parent) == library and library.stat().st_mtime_ns == before


def test_the_ptx_is_reused_while_its_stamp_matches_the_sources(rows, library, monkeypatch, tmp_path):
    """dm-kernel-check --cuda keeps the PTX beside the library; a stale stamp compiles every .cu again."""
    calls = []
    monkeypatch.setattr(cuda_build, "_run_nvcc", lambda cmd: calls.append(cmd) or Path(cmd[cmd.index("-o") + 1])
                        .write_text(f"// {Path(cmd[-1]).name}\n"))
    assert cuda_build.ptx(library.parent) == library.parent / "all.ptx" and calls == []  # built by `rows`
    stale = tmp_path / "all.ptx.stamp"
    stale.write_text("an older source tree\n")
    (tmp_path / "all.ptx").write_text("old")
    text = cuda_build.ptx(tmp_path).read_text()
    units = sorted(f.name for f in cuda_build.sources() if f.suffix == ".cu")
    assert sorted(Path(cmd[-1]).name for cmd in calls) == units
    assert all(f"// {name}" in text for name in units) and "old" not in text


def test_dm_kernel_check_cuda_prints_the_rows(library, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cuda_build, "BUILD_DIR", library.parent)  # up to date there: no rebuild
    assert check.main(["--cuda", "--out", str(tmp_path / "rows.jsonl")]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["name"] for r in printed} == {k.name for k in cuda_build.KERNELS}
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == len(printed)


@pytest.mark.parametrize("row, kernel, problem", [
    (dict(qgmma_forms={"QGMMA.64x64x32.F32.E4M3.E4M3": 3}, fp8_wgmma=4), "dm_wgmma_ss_n64_swizzle128", "SASS: QGMMA"),
    (dict(qgmma_forms={"QGMMA.64x128x32.F32.E4M3.E4M3": 4}, fp8_wgmma=4), "dm_wgmma_ss_n64_swizzle128", "SASS"),
    (dict(fp8_wgmma=2), "dm_wgmma_ss_n64_swizzle128", "PTX: 2"),
    (dict(other_mma=1), "dm_wgmma_ss_n64_swizzle128", "not FP8 wgmma"),
    (dict(spill_bytes=16), "dm_wgmma_ss_n64_swizzle128", "stack/local"),
    (dict(qgmma_forms={}, fp8_wgmma=0), "dm_quant_e4m3", None),
    (dict(), "dm_unknown", "not declared"),
    (dict(qgmma_forms={"QGMMA.64x64x32.F32.E4M3.E4M3": 4, "QGMMA.64x128x32.F32.E4M3.E4M3": 2}, fp8_wgmma=6),
     "dm_dv_factored_promoted", None),
    (dict(qgmma_forms={"QGMMA.64x64x32.F32.E4M3.E4M3": 8, "QGMMA.64x128x32.F32.E4M3.E4M3": 4}, fp8_wgmma=12),
     "dm_dv_factored_promoted", "SASS: QGMMA"),  # e.g. the loop body duplicated
    (dict(qgmma_forms={"QGMMA.64x64x32.F32.E4M3.E4M3": 4, "QGMMA.64x128x32.F32.E4M3.E4M3": 2}, fp8_wgmma=4),
     "dm_dv_factored_unpromoted", "PTX: 4"),
])
def test_check_names_what_disagrees(row, kernel, problem):
    good = dict(qgmma_forms={"QGMMA.64x64x32.F32.E4M3.E4M3": 4}, fp8_wgmma=4, other_mma=0, spill_bytes=0,
                registers=64, sass_registers=60)
    declared = {k.name: k for k in cuda_build.KERNELS}.get(kernel)
    found = cuda_check.problems({**good, **row}, declared, in_sass=True)
    assert (found == []) if problem is None else (problem in found[0]), found


SERIALISING = r"""
#include "wgmma.cuh"
// A non-wgmma write to an accumulator between the wgmma of one group: ptxas serialises the kernel's wgmma (C7511).
extern "C" __global__ void __launch_bounds__(128, 1) dm_serialised(const uint8_t* a, float* out) {
  __shared__ __align__(1024) uint8_t tile[64 * 128];
  for (int i = threadIdx.x; i < 64 * 128; i += 128) tile[i] = a[i];
  dm::fence_async_shared();
  __syncthreads();
  float d[32] = {};
  dm::wgmma_fence();
  for (int k = 0; k < 4; ++k) {
    dm::WgmmaE4M3<64>::ss(d, dm::KMajor128<dm::Swizzle::k128B>::desc(tile, k),
                          dm::KMajor128<dm::Swizzle::k128B>::desc(tile, k), k > 0);
    d[0] += 1.0f;
  }
  dm::wgmma_commit();
  dm::wgmma_wait<0>();
  for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] = d[i];
}
"""


def test_a_build_whose_wgmma_ptxas_serialises_is_refused(library, monkeypatch, tmp_path):
    """The trap of kernels/CUDA_BACKWARD.md (M2 as measured): ptxas serialises a kernel's wgmma silently, and only
    ``-Xptxas -v`` says so; the build reads that note and refuses the library, naming the kernel."""
    sources = tmp_path / "cuda"
    sources.mkdir()
    (sources / "wgmma.cuh").write_bytes((cuda_build.SOURCE_DIR / "wgmma.cuh").read_bytes())
    (sources / "serialised.cu").write_text(SERIALISING)
    monkeypatch.setattr(cuda_build, "SOURCE_DIR", sources)
    with pytest.raises(cuda_build.CudaBuildError, match=r"ptxas serialised every wgmma of dm_serialised \(due to"):
        cuda_build.build(tmp_path / "out")
    assert not (tmp_path / "out" / cuda_build.LIBRARY).exists()  # nothing half-built is left


def test_missing_nvcc_is_a_clear_error_when_a_build_is_needed(monkeypatch, tmp_path):
    monkeypatch.setenv(cuda_build.NVCC_ENV, "/nonexistent/nvcc")
    with pytest.raises(cuda_build.CudaBuildError, match="NVCC"):
        cuda_build.build(tmp_path)


def test_the_loader_gives_a_reason_instead_of_raising(library, tmp_path):
    lib, reason = cuda_lib.load(tmp_path / "missing.so")
    assert lib is None and "missing" in reason and "dm-cuda-build" in reason
    opened, why = cuda_lib._open(str(library))  # it dlopens without a GPU, its ABI version and struct size match
    assert opened is not None and why == ""
    assert opened.dm_dv_factored_params_size() == ctypes.sizeof(cuda_lib.DvFactoredParams)
    assert opened.dm_dk_factored_params_size() == ctypes.sizeof(cuda_lib.DkFactoredParams)
    assert opened.dm_dkdv_factored_params_size() == ctypes.sizeof(cuda_lib.DkdvFactoredParams)
    assert opened.dm_dq_factored_params_size() == ctypes.sizeof(cuda_lib.DqFactoredParams)
    ragged = cuda_lib.DqFactoredParams(n=100, h=3, h_kv=2, n_pad=128)  # 3 query heads on 2 kv heads
    assert opened.dm_dq_factored(ctypes.byref(ragged), 1, 0, 0, None) == 1
    assert opened.dm_dq_factored_d64(ctypes.byref(ragged), 1, 0, 0, None) == 1  # the D = 64 build: the same checks
    ragged.h = 2
    assert opened.dm_dq_factored(ctypes.byref(ragged), 1, len(cuda_lib.DQ_VARIANTS), 0, None) == 1  # no such variant
    assert opened.dm_dq_factored_d64(ctypes.byref(ragged), 1, len(cuda_lib.DQ_VARIANTS), 0, None) == 1
    assert opened.dm_fwd_factored_params_size() == ctypes.sizeof(cuda_lib.FwdFactoredParams)
    forward = cuda_lib.FwdFactoredParams(n=100, h=2, h_kv=2, n_pad=64)  # N_pad not a multiple of the CTA's 128 rows
    assert opened.dm_fwd_factored(ctypes.byref(forward), 1, 0, 0, None) == 1
    forward.n_pad = 128
    assert opened.dm_fwd_factored(ctypes.byref(forward), 1, len(cuda_lib.FWD_VARIANTS), 0, None) == 1
    assert opened.dm_fwd_wide(ctypes.byref(forward), None, 1, len(cuda_lib.FWD_WIDE_VARIANTS), 0, None) == 1
    forward.n_pad = 64
    assert opened.dm_fwd_wide(ctypes.byref(forward), None, 1, 0, 0, None) == 1
    assert opened.dm_fwd_wide_d64(ctypes.byref(forward), None, 1, 1, 0, None) == 1  # the D = 64 build's same checks
    forward.n_pad = 128
    for i, variant in enumerate(cuda_lib.FWD_WIDE_VARIANTS):  # D = 128's numbering; those not built at 64 refused
        if variant not in cuda_lib.FWD_WIDE_D64_VARIANTS:
            assert opened.dm_fwd_wide_d64(ctypes.byref(forward), None, 1, i, 0, None) == 1, variant
    assert opened.dm_fwd_wide_d64(ctypes.byref(forward), None, 1, len(cuda_lib.FWD_WIDE_VARIANTS), 0, None) == 1
    assert opened.dm_delta_factored_params_size() == ctypes.sizeof(cuda_lib.DeltaFactoredParams)
    delta = cuda_lib.DeltaFactoredParams(n=100, h=3, h_kv=2, n_pad=128)  # 3 query heads on 2 kv heads
    assert opened.dm_delta_factored(ctypes.byref(delta), 0, 0, None) == 1
    delta.h = 2
    assert opened.dm_delta_factored(ctypes.byref(delta), len(cuda_lib.DELTA_VARIANTS), 0, None) == 1
    assert opened.dm_delta_wide(ctypes.byref(delta), None, len(cuda_lib.DELTA_WIDE_VARIANTS), 0, None) == 1
    # the row-max variants take the forward's row maxima, and only they: refused before any CUDA call either way
    some = ctypes.c_void_p(256)
    for i, variant in enumerate(cuda_lib.DELTA_WIDE_VARIANTS):
        assert opened.dm_delta_wide(ctypes.byref(delta), None if variant in cuda_lib.DELTA_ROW_MAX else some, i, 0,
                                    None) == 1, variant
    delta.n_pad = 64  # N_pad not a multiple of the CTA's 128 queries
    assert opened.dm_delta_wide(ctypes.byref(delta), None, 0, 0, None) == 1
    assert opened.dm_delta_wide_d64(ctypes.byref(delta), None, 1, 0, None) == 1  # the D = 64 build: the same shapes
    delta.n_pad, delta.h = 128, 3
    assert opened.dm_delta_wide_d64(ctypes.byref(delta), None, 1, 0, None) == 1
    delta.h = 2
    for i, variant in enumerate(cuda_lib.DELTA_WIDE_VARIANTS):  # D = 128's numbering: those not built at 64 refused,
        row_max = some if variant in cuda_lib.DELTA_ROW_MAX else None  # and the row maxima as at D = 128
        if variant not in cuda_lib.DELTA_WIDE_D64_VARIANTS:
            assert opened.dm_delta_wide_d64(ctypes.byref(delta), row_max, i, 0, None) == 1, variant
        else:
            assert opened.dm_delta_wide_d64(ctypes.byref(delta), some if row_max is None else None, i, 0, None) == 1
    assert opened.dm_delta_wide_d64(ctypes.byref(delta), None, len(cuda_lib.DELTA_WIDE_VARIANTS), 0, None) == 1
    bad = cuda_lib.DvFactoredParams(n=0, h=2, h_kv=2, n_pad=128)  # refused before any CUDA call
    assert opened.dm_dv_factored(ctypes.byref(bad), 1, 0, 0, None) == 1  # cudaErrorInvalidValue
    good = cuda_lib.DvFactoredParams(n=100, h=2, h_kv=2, n_pad=128)
    assert opened.dm_dv_factored(ctypes.byref(good), 1, len(cuda_lib.DV_VARIANTS), 0, None) == 1  # no such variant
    fused = cuda_lib.DkdvFactoredParams(n=100, h=2, h_kv=2, n_pad=64)  # N_pad not a multiple of the CTA's 128 keys
    assert opened.dm_dkdv_factored(ctypes.byref(fused), 1, 0, 0, None) == 1
    fused.n_pad = 128
    assert opened.dm_dkdv_factored(ctypes.byref(fused), 0, len(cuda_lib.DKDV_VARIANTS), 0, None) == 1
    assert opened.dm_dkdv_factored(ctypes.byref(fused), 1, cuda_lib.DKDV_VARIANTS.index("ws3s"), 0, None) == 1
    for variant in cuda_lib.DKDV_DQ_ONLY:  # built with dQ only
        assert opened.dm_dkdv_factored(ctypes.byref(fused), 1, cuda_lib.DKDV_VARIANTS.index(variant), 0, None) == 1
    # the D = 64 build: ws3 and ws4 without dQ (and the shapes every launch takes)
    assert opened.dm_dkdv_factored_d64(ctypes.byref(fused), 1, len(cuda_lib.DKDV_D64_VARIANTS), 0, None) == 1
    fused.n_pad = 64
    assert opened.dm_dkdv_factored_d64(ctypes.byref(fused), 1, 0, 0, None) == 1
    fused.n_pad = 128
    fused.dq_acc = 16  # with dQ: promoted only, and not in the ws3s form (refused before any CUDA call)
    assert opened.dm_dkdv_factored_d64(ctypes.byref(fused), 1, 0, 0, None) == 1  # no dQ at D = 64
    assert opened.dm_dkdv_factored(ctypes.byref(fused), 0, 0, 0, None) == 1
    assert opened.dm_dkdv_factored(ctypes.byref(fused), 0, cuda_lib.DKDV_VARIANTS.index("ws3x"), 0, None) == 1
    assert opened.dm_dkdv_factored(ctypes.byref(fused), 1, cuda_lib.DKDV_VARIANTS.index("ws3s"), 0, None) == 1
    # the persistent form: ordered adds only (no dq_sem, which also holds its count of key blocks taken)
    assert opened.dm_dkdv_factored(ctypes.byref(fused), 1, cuda_lib.DKDV_VARIANTS.index("ws3xp"), 0, None) == 1
    fused.dq_sem = 16  # ordered adds need a section of at least one kv head
    assert opened.dm_dkdv_factored(ctypes.byref(fused), 1, 0, 0, None) == 1
    if not torch.cuda.is_available():
        lib, reason = cuda_lib.load(library)
        assert lib is None and "no CUDA GPU" in reason


def test_the_wrappers_check_their_inputs_before_needing_the_library():
    codes = torch.zeros(64, 128, dtype=torch.uint8)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        cuda_lib.wgmma_ss_tile(codes, codes)
    with pytest.raises(ValueError, match="dtype torch.float32"):
        cuda_lib.wgmma_rs_tile(codes.float(), codes)
    with pytest.raises(ValueError, match="N in"):
        cuda_lib.wgmma_ss_tile(codes, codes[:32])
    with pytest.raises(ValueError, match="expected torch.float32"):
        cuda_lib.quantize_e4m3(codes)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        cuda_lib.dpt_tile(codes, codes, 1.0, 1.0)


def _dv_inputs(b=1, h=2, h_kv=1, n=100, n_pad=128, d=128, **options):
    return dict(q8=torch.zeros(b, h, n_pad, d, dtype=torch.uint8), k8=torch.zeros(b, h_kv, n_pad, d, dtype=torch.uint8),
                do8t=torch.zeros(b, h, d, n_pad, dtype=torch.uint8), sq=torch.ones(b, h, n_pad // 128),
                sk=torch.ones(b, h_kv, n_pad // 64), sdoc=torch.ones(b, h, d), lse2=torch.zeros(b, h, n_pad), n=n,
                causal=True, qk_scale=0.1, **options)


@pytest.mark.parametrize("change, message", [
    (dict(d=64), "built for D = 128"),
    (dict(h=3, h_kv=2), "not a multiple"),
    (dict(n=200), "expected 0 < n <= N_pad"),
    (dict(), "expected a CUDA tensor"),
    (dict(variant="pipe9"), "variant 'pipe9'"),
    (dict(variant="tma3x3"), "unpromoted only"),
])
def test_the_dv_wrapper_checks_its_inputs_before_needing_the_library(change, message):
    with pytest.raises(ValueError, match=message):
        cuda_lib.dv_factored(**_dv_inputs(**change))


def test_the_dk_wrapper_checks_its_inputs_before_needing_the_library():
    dv = _dv_inputs()
    b, h, n_pad, d = dv["q8"].shape
    common = dict(q8=dv["q8"], k8=dv["k8"], v8=dv["k8"], do8=dv["q8"], q8t=dv["do8t"], sq=dv["sq"], sk=dv["sk"],
                  sv=dv["sk"], sdo=dv["sq"], sqc=dv["sdoc"], rs=dv["lse2"], lse2=dv["lse2"], delta=dv["lse2"], n=100,
                  causal=True, qk_scale=0.1, softmax_scale=0.08)
    with pytest.raises(ValueError, match="the CUDA dK kernel is built for D = 128"):
        cuda_lib.dk_factored(**{**common, "q8": torch.zeros(b, h, n_pad, 64, dtype=torch.uint8)})
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        cuda_lib.dk_factored(**common)
    fused = dict(common, do8t=dv["do8t"], sdoc=dv["sdoc"], k8t=torch.zeros(b, 1, d, n_pad, dtype=torch.uint8),
                 skc=torch.ones(b, 1, d))
    fused.pop("q8t")
    with pytest.raises(ValueError, match="variant 'ws4' is not built with dQ"):
        cuda_lib.dqdkdv_factored(**fused, q8t=dv["do8t"], variant="ws4")
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        cuda_lib.dqdkdv_factored(**fused, q8t=dv["do8t"])
    for ordered, heads in ((True, 0), (False, 2)):
        with pytest.raises(ValueError, match="section_heads"):
            cuda_lib.dqdkdv_factored(**fused, q8t=dv["do8t"], ordered=ordered, section_heads=heads)


@pytest.mark.parametrize("b, h, h_kv, n_pad", [(4, 16, 16, 8192), (1, 32, 8, 8192), (2, 4, 4, 1024), (1, 2, 2, 2**20),
                                               (3, 12, 12, 4096)])
def test_the_ordered_launch_interleaves_the_most_kv_heads_that_fit_in_l2(b, h, h_kv, n_pad):
    """A power of two of kv heads, no more than the launch has, whose query heads' tiles and FP32 dQ scratch fit in
    the L2 share (or one head, when a single one does not): FA3's swizzle."""
    heads = cuda_lib.ordered_section_heads(b, h, h_kv, n_pad)
    per_kv_head = (h // h_kv) * n_pad * (8 * 128 + 12)  # four E4M3 code tiles and FP32 dQ (D bytes each), 3 floats
    assert heads >= 1 and heads & (heads - 1) == 0 and heads <= b * h_kv
    assert heads == 1 or heads * per_kv_head <= cuda_lib.L2_BYTES
    assert 2 * heads > b * h_kv or 2 * heads * per_kv_head > cuda_lib.L2_BYTES


def _acc_to_a_fragment(words: list[int]) -> list[int]:
    """kernels/cuda/wgmma.cuh ``acc_to_a_fragment`` for the 32 lanes of a warp (the shuffle and the byte permute)."""
    out = []
    for lane in range(32):
        q, quad = lane % 4, lane & ~3
        first, second = words[quad | (2 * q) % 4], words[quad | (2 * q + 1) % 4]
        low, high = (0, 1) if q < 2 else (2, 3)  # __byte_perm 0x5410 / 0x7632
        byte = [(w >> (8 * i)) & 0xFF for w in (first, second) for i in range(4)]  # __byte_perm's numbering
        out.append(byte[low] | byte[high] << 8 | byte[4 + low] << 16 | byte[4 + high] << 24)
    return out


def test_the_permutation_turns_accumulator_order_into_the_a_fragment():
    """A code per (row g, column c) of a 16-wide half row: 16 g + c. Lane (g, q) holds columns {2q, 2q+1, 8+2q, 9+2q}
    in accumulator order (CuTe's CLayout_64xN) and must end with 4q .. 4q+3 (ALayout_64x32)."""
    def word(codes):
        return sum(c << (8 * i) for i, c in enumerate(codes))

    lanes = [(lane // 4, lane % 4) for lane in range(32)]
    acc = [word([16 * g + 2 * q, 16 * g + 2 * q + 1, 16 * g + 8 + 2 * q, 16 * g + 9 + 2 * q]) for g, q in lanes]
    assert _acc_to_a_fragment(acc) == [word([16 * g + 4 * q + i for i in range(4)]) for g, q in lanes]


def test_the_dq_sync_bound_is_the_kernels_last():
    """``cuda_lib.DQ_SYNC_MAX`` is the last value of ``DqSync`` in the kernel's source."""
    source = (Path(cuda_build.SOURCE_DIR) / "dkdv_factored.cu").read_text()
    enum = source.split("enum DqSync : int {", 1)[1].split("};", 1)[0]
    assert max(int(value) for value in re.findall(r"=\s*(\d+)", enum)) == cuda_lib.DQ_SYNC_MAX


@pytest.mark.parametrize("sync, env", [(13, None), (-1, None), (None, "14"), (None, "fast")])
def test_an_unknown_dq_sync_is_refused_by_name(sync, env, monkeypatch):
    """dqdkdv_factored's ``sync`` (or $DELTAMATCH_KERNEL_DQ_SYNC) outside DqSync's 0 .. 12: a ValueError before any
    launch, so it needs no GPU."""
    if env is None:
        monkeypatch.delenv(cuda_lib.DQ_SYNC_ENV, raising=False)
    else:
        monkeypatch.setenv(cuda_lib.DQ_SYNC_ENV, env)
    t = torch.empty(0)
    with pytest.raises(ValueError, match=r"(sync = -?\d+ .*DELTAMATCH_KERNEL_DQ_SYNC|DELTAMATCH_KERNEL_DQ_SYNC = "
                                         r"'fast').*0 \.\. 12"):
        cuda_lib.dqdkdv_factored(*[t] * 17, 64, True, 1.0, 1.0, sync=sync)


@pytest.mark.parametrize("value", ["0", "-2", "four"])
def test_a_bad_section_size_from_the_environment_is_refused_by_name(value, monkeypatch):
    """$DELTAMATCH_KERNEL_DQ_SECTION_HEADS (a benchmark's control: the kv heads the ordered launch interleaves) that is
    not a positive integer: a ValueError naming it, before any launch."""
    monkeypatch.setenv(cuda_lib.DQ_SECTION_ENV, value)
    t = torch.empty(0)
    with pytest.raises(ValueError, match=rf"DELTAMATCH_KERNEL_DQ_SECTION_HEADS = '{value}': expected a positive integer"):
        cuda_lib.dqdkdv_factored(*[t] * 17, 64, True, 1.0, 1.0, sync=11)


def test_a_dq_only_dkdv_form_without_dq_is_refused_by_name():
    """The dK/dV forms built with dQ only (``DKDV_DQ_ONLY``: ``ws3x``, dŜ's tile by lane exchange) asked for without
    dQ, and a form without dQ asked for with it: a ValueError naming the other entry point, before any launch."""
    t = torch.empty(0)
    with pytest.raises(ValueError, match=r"variant 'ws3x' is built with dQ only: call dqdkdv_factored"):
        cuda_lib.dkdv_factored(*[t] * 15, 100, True, 1.0, 1.0, variant="ws3x")
    expected = r"\('ws3', 'ws3x', 'ws3xp', 'ws3xf', 'ws3xfs', 'ws3xfd', 'ws3xfdp', 'ws3xfdt'\)"
    with pytest.raises(ValueError, match=r"variant 'ws4' is not built with dQ: expected one of " + expected):
        cuda_lib.dqdkdv_factored(*[t] * 17, 100, True, 1.0, 1.0, variant="ws4", sync=11)


@pytest.mark.parametrize("acc", ["shape", "dtype", "strides"])
def test_a_wrong_dq_acc_is_refused_by_name(acc):
    """dqdkdv_factored's ``dq_acc`` (the FP32 sums a caller reads, tools/device/dq_stress.py) must be Q̂'s (B, H, N_pad,
    D) in FP32, contiguous, on its device: anything else is a ValueError naming it before any launch (no GPU)."""
    q8 = torch.empty((1, 2, 128, 128), dtype=torch.uint8)
    bad = {"shape": torch.empty((1, 2, 256, 128)), "dtype": torch.empty((1, 2, 128, 128), dtype=torch.float64),
           "strides": torch.empty((1, 2, 128, 128)).transpose(2, 3)}[acc]
    t = torch.empty(0)
    with pytest.raises(ValueError, match=r"dq_acc: .*expected a contiguous torch.float32 \(1, 2, 128, 128\)"):
        cuda_lib.dqdkdv_factored(q8, *[t] * 16, 100, True, 1.0, 1.0, dq_acc=bad)


def _ex2_poly_model(x: "np.ndarray", degree: int) -> "np.ndarray":
    """``factored.cuh``'s ex2_poly step by step in FP32, with its coefficients read from the source: the clamp at −127
    (NaN kept), round(x) by the 1.5·2^23 shifter, the polynomial by Horner's rule with each FMA rounded once (an FP32
    product is exact in FP64), and 2^j built in the exponent field from the shifter's bits."""
    import numpy as np

    source = (cuda_build.SOURCE_DIR / "factored.cuh").read_text()
    body = source[source.index("__device__ __forceinline__ float ex2_poly("):]
    branch = body[body.index("if constexpr (DEGREE == 3)"):body.index("// t's bits")]
    branch = branch.split("} else {")[0 if degree == 3 else 1]
    coefficients = [np.float32(c) for c in re.findall(r"(-?\d+\.\d+(?:e-?\d+)?)f", branch)]
    assert len(coefficients) == degree + 1, branch
    # Horner's rule as written: fmaf(fmaf(c_d, f, c_{d-1}), f, ...): the first literal is the highest power
    shifter = np.float32(12582912.0)
    f32 = np.float32
    xc = np.where(np.isnan(x), x, np.maximum(x, f32(-127.0))).astype(f32)
    t = (xc + shifter).astype(f32)
    f = (xc - (t - shifter).astype(f32)).astype(f32)
    p = np.full_like(f, coefficients[0])
    for c in coefficients[1:]:
        p = (p.astype(np.float64) * f + c).astype(f32)  # one rounding, as fmaf's
    scale = ((t.view(np.uint32) << np.uint32(23)) + np.uint32(0x3F800000)).astype(np.uint32).view(f32)
    return (p * scale).astype(f32)


@pytest.mark.parametrize("degree, bound", [(3, 7.6e-5), (5, 2.5e-7)])
def test_the_emulated_exponential_is_within_its_stated_error(degree, bound):
    """The emulated 2^x (``factored.cuh`` ``ex2_poly``, which the ``w4pe*`` forward and δ variants take for a share of
    their elements) against FP64's exp2 over the range the kernels feed it (the forward's x ≤ log2(448), the δ pass's
    ≤ 0; down to where FP32 stops being normal): within the relative error its comment states (degree 3: 7.5e-5,
    degree 5: 2.3e-7 evaluated in FP32), and the edges as ex2.approx.ftz has them: −inf and anything below −126.5 give
    +0, NaN stays NaN."""
    import numpy as np

    x = np.linspace(-126.0, 8.81, 400_001, dtype=np.float32)
    got = _ex2_poly_model(x, degree).astype(np.float64)
    relative = np.abs(got / np.exp2(x.astype(np.float64)) - 1)
    assert relative.max() <= bound, f"degree {degree}: {relative.max():.3e} at x = {x[relative.argmax()]}"
    edges = _ex2_poly_model(np.array([-np.inf, -1e30, -127.0, -126.6, np.nan, 0.0], dtype=np.float32), degree)
    assert (edges[:4] == 0).all() and np.isnan(edges[4]) and abs(edges[5] - 1) <= bound


def _p_max_bound_model(m: "np.ndarray", lse2: "np.ndarray", ex2) -> "np.ndarray":
    """``factored.cuh``'s p_max_bound step by step in FP32 (numpy's float32 arithmetic rounds each operation once, as
    the kernel's ``__f*_rn``), its constants read from the source; ``ex2``: what ex2.approx gives for the bound's own
    exponent."""
    import numpy as np

    source = (cuda_build.SOURCE_DIR / "factored.cuh").read_text()
    log2_448 = np.float32(re.search(r"constexpr float kLog2Of448 = ([\d.]+)f;", source).group(1))
    body = source[source.index("__device__ __forceinline__ float p_max_bound("):]
    body = body[:body.index("\n}")]
    (slack_factor,) = (np.float32(c) for c in re.findall(r"(\d+\.\d+(?:e-?\d+)?)f\);", body))
    f32 = np.float32
    y = ((m + log2_448).astype(f32) - lse2).astype(f32)
    slack = (((np.abs(m) + np.abs(y)).astype(f32) + f32(16.0)).astype(f32) * slack_factor).astype(f32)
    return ex2((y + slack).astype(f32)).astype(f32)


def _round_to_f32(x: "fractions.Fraction") -> "np.float32":
    """x rounded once to FP32, to nearest with ties to even (float() then float32 could round twice)."""
    import fractions

    import numpy as np

    g = np.float32(float(x))
    candidates = [np.nextafter(g, np.float32(-np.inf)), g, np.nextafter(g, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(fractions.Fraction(float(c)) - x), int(c.view(np.uint32)) & 1))


def test_the_row_max_bound_is_above_every_p_of_its_row():
    """``p_max_bound`` (the δ pass's max P in ``cuda_lib.DELTA_ROW_MAX``'s variants, from the forward's row max m) on
    rows of scaled scores S_j c_j from 10⁻³ to 3·10³ in the log2 domain, with lse2 the row's log-sum-exp rounded and
    moved by up to 4 ulps (the bound must not rely on lse2 being the row's own): above the largest P the δ pass can form
    from the same S, c and lse2 — its exponent fma(S_j, c_j, −lse2) rounded once (exactly, by fractions), through
    ex2.approx (2 ulps, the CUDA guide's exp2f) or ex2_poly<5> (the model above) — with the bound's own ex2.approx at
    the low end of its 2 ulps; and above it by no more than the slack it states (2^-20 (|m| + |y| + 16) plus 2^-18). It
    fails with the slack factor an eighth of the source's (2^-24: then rows at |m| ≈ 20 break the bound; at a quarter
    the random rows do not reach the roundings' worst case, which the stated factor covers twice) or 8 times it
    (looser than stated)."""
    import fractions

    import numpy as np

    rng = np.random.default_rng(29)
    rows, keys = 4000, 6
    f32 = np.float32
    s = (rng.uniform(-3e5, 3e5, (rows, keys))).astype(f32)
    magnitude = rng.uniform(-3, 3.5, rows)  # the row's largest |S c|: 10^-3 .. 3·10^3
    c = (10 ** (magnitude[:, None] - np.log10(3e5)) * rng.uniform(0.5, 1.0, (rows, keys))).astype(f32)
    product = s.astype(np.float64) * c.astype(np.float64)  # exact: 24 + 24 bits
    top = product.max(1)
    lse_exact = top + np.log2(np.exp2(product - top[:, None]).sum(1))
    lse2 = lse_exact.astype(f32)
    lse2 = (lse2.view(np.int32) + rng.integers(-4, 5, rows).astype(np.int32)).view(f32)
    log2_448 = np.float32(8.807354922057604)
    m = ((s * c).astype(f32).max(1) - log2_448).astype(f32)  # the forward's m: fl(max_j fl(S_j c_j) − fl(log2 448))
    low = _p_max_bound_model(m, lse2, lambda u: np.exp2(u.astype(np.float64)) * (1 - 2.0**-22))
    y = ((m + log2_448).astype(f32) - lse2).astype(f32)
    j = product.argmax(1)
    for i in range(rows):
        exponent = _round_to_f32(fractions.Fraction(float(s[i, j[i]])) * fractions.Fraction(float(c[i, j[i]]))
                                 - fractions.Fraction(float(lse2[i])))
        largest = max(2.0 ** float(exponent) * (1 + 2.0**-22),
                      float(_ex2_poly_model(np.array([exponent], dtype=f32), 5)[0]))
        assert float(low[i]) >= largest, (i, float(m[i]), float(lse2[i]), float(low[i]) / largest - 1)
        stated = 2.0**-20 * (abs(float(m[i])) + abs(float(y[i])) + 16) + 2.0**-18
        assert float(low[i]) <= largest * (1 + stated), (i, float(low[i]) / largest - 1, stated)


def test_the_row_max_delta_variants_take_the_forwards_row_maxima_and_only_they(monkeypatch):
    """``cuda_lib.DELTA_ROW_MAX``'s δ variants read the row maxima the 128-key CUDA forward writes (``m2`` among the
    saved tensors): ``delta_wide`` refuses one without them, or another variant given them, and the backward asked for
    one after a forward that wrote none says which switch to set, each before any launch (no GPU)."""
    from deltamatch.kernels import triton_bwd

    dv = _dv_inputs()
    args = (dv["q8"], dv["k8"], dv["k8"], dv["q8"], dv["sq"], dv["sk"], dv["sk"], dv["sq"], dv["lse2"], 100, True, 0.1)
    for variant in cuda_lib.DELTA_ROW_MAX:
        with pytest.raises(ValueError, match=f"variant '{variant}' reads the forward's row maxima: row_max is None"):
            cuda_lib.delta_wide(*args, variant=variant)
    with pytest.raises(ValueError, match="variant 'w4p' takes no row_max"):
        cuda_lib.delta_wide(*args, variant="w4p", row_max=dv["lse2"])
    monkeypatch.setattr(triton_bwd, "cuda_delta_variant", lambda *a, **k: "w4pme8")
    monkeypatch.setenv(triton_bwd.CUDA_DELTA_SWITCH, "w4pme8")
    saved = dict(q8=dv["q8"], k8=dv["k8"], v8=dv["k8"], sq=dv["sq"], sk=dv["sk"], sv=dv["sk"], lse2=dv["lse2"], m2=None)
    shapes = ((1, 100, 2, 128), (1, 100, 1, 128))

    def backward():
        triton_bwd.attention_backward(saved, dv["q8"], None, dv["sq"], dv["lse2"], "matched_factored", True, 0.08, 100,
                                      shapes, (torch.bfloat16, torch.bfloat16), factored=dict(q=None))

    with pytest.raises(ValueError, match=r"DELTAMATCH_KERNEL_CUDA_DELTA=w4pme8 reads the forward's row maxima, "
                                         r"which only the CUDA forward over 128-key tiles writes "
                                         r"\(DELTAMATCH_KERNEL_CUDA_FWD"):
        backward()


def test_the_d64_delta_pass_runs_only_its_variants_and_only_where_it_can(monkeypatch):
    """The δ pass's D = 64 build (``dm_delta_wide_d64``): where the library cannot load (no GPU here) the backward takes
    Triton's pass at D = 64, and a variant asked for is an error that names the switch; so is a variant not built at
    D = 64; ``delta_wide`` refuses D = 64 codes with a variant not built there, and D = 128's entry refuses D = 64
    codes, each before any launch."""
    from deltamatch.kernels import triton_bwd

    monkeypatch.delenv(triton_bwd.CUDA_DELTA_SWITCH, raising=False)
    _, reason = cuda_lib.load()
    assert triton_bwd.cuda_delta_variant(64) == (None if reason else triton_bwd.CUDA_DELTA_DEFAULT)
    monkeypatch.setenv(triton_bwd.CUDA_DELTA_SWITCH, "w4pd")
    with pytest.raises(ValueError, match=r"DELTAMATCH_KERNEL_CUDA_DELTA='w4pd': expected one of \('w4p', 'w4pe8', "
                                         r"'w4pe4', 'w4pe2', 'w4pm', 'w4pme8', 'w4pme4'\)"):
        triton_bwd.cuda_delta_variant(64)
    monkeypatch.setenv(triton_bwd.CUDA_DELTA_SWITCH, "w4p")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_DELTA=w4p but the CUDA δ pass cannot run"):
            triton_bwd.cuda_delta_variant(64)
    dv = _dv_inputs(d=64)
    args = (dv["q8"], dv["k8"], dv["k8"], dv["q8"], dv["sq"], dv["sk"], dv["sk"], dv["sq"], dv["lse2"], 100, True, 0.1)
    for variant in ("w4", "w4pd", "w4t"):
        with pytest.raises(ValueError, match=f"variant '{variant}': at D = 64 the δ pass is built as"):
            cuda_lib.delta_wide(*args, variant=variant)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):  # the D = 64 entry's own checks, then the device
        cuda_lib.delta_wide(*args, variant="w4p")
    with pytest.raises(ValueError, match="head dim 64: the CUDA δ kernel is built for D = 128 only"):
        cuda_lib.delta_factored(*args)


def test_the_d64_forward_runs_only_its_variants_and_only_where_it_can(monkeypatch):
    """The forward's D = 64 build (``dm_fwd_wide_d64``), as the δ pass's: where the library cannot load, Triton's
    forward at D = 64, and a variant asked for is an error that names the switch; so is a variant not built at D = 64;
    ``fwd_wide`` refuses D = 64 codes with a variant not built there, and ``fwd_factored`` refuses them, each before
    any launch."""
    from deltamatch.kernels import triton_fwd

    monkeypatch.delenv(triton_fwd.CUDA_FWD_SWITCH, raising=False)
    _, reason = cuda_lib.load()
    assert triton_fwd.cuda_forward_variant(64, torch.bfloat16) == (None if reason else triton_fwd.CUDA_FWD_DEFAULT)
    monkeypatch.setenv(triton_fwd.CUDA_FWD_SWITCH, "w4pp")
    with pytest.raises(ValueError, match=r"DELTAMATCH_KERNEL_CUDA_FWD='w4pp': expected one of \('w4p', 'w4pe8', "
                                         r"'w4pe4', 'w4pe2'\)"):
        triton_fwd.cuda_forward_variant(64, torch.bfloat16)
    monkeypatch.setenv(triton_fwd.CUDA_FWD_SWITCH, "w4p")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_FWD=w4p but the CUDA forward cannot run"):
            triton_fwd.cuda_forward_variant(64, torch.bfloat16)
    dv = _dv_inputs(d=64)
    args = (dv["q8"], dv["k8"], dv["do8t"][:, :1], dv["sq"], dv["sk"], dv["sdoc"][:, :1], (1, 100, 2, 64), True, 0.1)
    with pytest.raises(ValueError, match="variant 'w4pp': at D = 64 the forward is built as"):
        cuda_lib.fwd_wide(*args, variant="w4pp")
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        cuda_lib.fwd_wide(*args, variant="w4p")
    with pytest.raises(ValueError, match="head dim 64: the CUDA forward kernel is built for D = 128 only"):
        cuda_lib.fwd_factored(*args)


def test_the_d64_dkdv_takes_its_variants_without_dq_only():
    """The dK/dV kernel's D = 64 build (``dm_dkdv_factored_d64``): ``dkdv_factored`` refuses D = 64 codes with a form
    not built there, ``dqdkdv_factored`` refuses them (no dQ at D = 64), each before any launch; a form built there
    gets as far as the device check (no GPU here)."""
    dv = _dv_inputs(d=64)
    q8, k8, q8t, sq, sk, lse2 = dv["q8"], dv["k8"], dv["do8t"], dv["sq"], dv["sk"], dv["lse2"]
    sqc, rs = dv["sdoc"], lse2
    args = (q8, k8, k8, q8, q8t, q8t, sq, sk, sk, sq, sqc, sqc, rs, lse2, lse2, 100, True, 0.1, 0.125)
    for variant in ("ws3s", "ws3x", "ws3xfdt"):
        with pytest.raises(ValueError, match=f"variant '{variant}': at D = 64 the dK/dV kernel is built as"):
            cuda_lib.dkdv_factored(*args, variant=variant, promote=False)
    with pytest.raises(ValueError, match="variant 'ws3xfdp' with dQ: at D = 64 the dK/dV kernel is built as"):
        cuda_lib.dqdkdv_factored(*args[:6], q8t, *args[6:12], sqc, *args[12:], variant="ws3xfdp")
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        cuda_lib.dkdv_factored(*args, variant="ws4")


class _Launched(Exception):
    pass


@pytest.mark.parametrize("default, without", [("w4pm", "w4p"), ("w4pme8", "w4pe8"), ("w4pme4", "w4pe4")])
def test_a_default_row_max_delta_pass_after_a_forward_without_them_takes_max_p_itself(monkeypatch, default, without):
    """With ``DELTAMATCH_KERNEL_CUDA_DELTA`` unset, a row-max default after a forward that wrote no row maxima (Triton's
    forward, ``DELTAMATCH_KERNEL_CUDA_FWD=0``) runs its form without them, the same δ, rather than an error; given
    them, it reads them (no GPU: the launch is stopped at ``delta_wide``)."""
    from deltamatch.kernels import triton_bwd

    dv = _dv_inputs()
    launched = []

    def delta_wide(*args, variant, row_max):
        launched.append((variant, row_max))
        raise _Launched

    monkeypatch.delenv(triton_bwd.CUDA_DELTA_SWITCH, raising=False)
    monkeypatch.setattr(triton_bwd, "cuda_delta_variant", lambda *a, **k: default)
    monkeypatch.setattr(cuda_lib, "delta_wide", delta_wide)
    m2 = torch.zeros(dv["lse2"].shape)
    for row_max in (None, m2):
        saved = dict(q8=dv["q8"], k8=dv["k8"], v8=dv["k8"], sq=dv["sq"], sk=dv["sk"], sv=dv["sk"], lse2=dv["lse2"],
                     m2=row_max)
        with pytest.raises(_Launched):
            triton_bwd.attention_backward(saved, dv["q8"], None, dv["sq"], dv["lse2"], "matched_factored", True, 0.08,
                                          100, ((1, 100, 2, 128), (1, 100, 1, 128)),
                                          (torch.bfloat16, torch.bfloat16), factored=dict(q=None))
    assert [v for v, _ in launched] == [without, default]
    assert launched[0][1] is None and launched[1][1] is m2
