"""Where the dQ-in-dK/dV forms wait: one launch of each form with the diagnostic library (``dm-cuda-build --out
build/cuda_clock --define DM_DQ_CLOCK``, carried), its per-CTA counters (``kernels/cuda/dkdv_factored.cu``,
``DqClock``) read back and summed.

Per form: the launch's span (first reducer start to last reducer end, globaltimer), the CTAs' summed time, and the
shares of it the reducer spent waiting for tiles' turns, for the consumers' products, for its adds to read the dQ
buffer and for its last add's writes;
the consumers' waits for the reducer (``dq_empty``) and for each other (``ds_full``); how many turns were not reached at
the first poll; then the turn waits by key block (in eighths of the sequence) and by launch position (in tenths).
Forms (``--forms``; all by default): any order, ordered with the launch order only (sync 3, the control), ordered
(sync 0), its count alone (7), its wait's read alone (8), the dispatch before session 30's ``ws3xf`` (``ws3x``:
ordered, sync 11), its persistent form (``persistent``: ws3xp, whose reducers' counters have a row per key block, in
the order taken, instead of one per CTA: its consumers' counters are not kept) and the dQ warpgroup form
(``dq_group``: ws3xfd, ordered, sync 11), where ``peer`` is the consumers' wait for the dQ warpgroup to release dŜ and
``group_full``, ``group_empty`` and ``group_ms_sum`` are the dQ warpgroup's waits for both consumers' dŜ and for the
reducers to read its product (shares of its time, as the consumers' are of theirs) and its loop's time, and the same
with dK and dV by tensor stores (``dq_group_tma``: ws3xfdt, the default since session 35). The counters
cost a few instructions per tile (the reducer's registers are few), so the times are not the plain library's; the
shares are what to read.

Beside them, how full the GPU was over the launch (``occupancy``: CTAs resident over its span, the SMs' idle share and
its part in the grid's tail). ``--occupancy FILE.npy ...`` prints that for saved counters, without a GPU.

Usage (repo root, on the H200): ``DELTAMATCH_CUDA_LIB=build/cuda_clock/libdm_attn_sm90.so python3
tools/device/dq_clock.py --out DIR`` (writes DIR/clock_<form>.npy: the raw (CTAs, 16) counters, and DIR/clock.jsonl).
"""

import argparse
import ctypes
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SLOTS = ("where", "start_ns", "end_ns", "start_clk", "end_clk", "turn_clk", "full_clk", "count_clk", "read_clk", "tiles",
         "spun", "turn_max_clk", "empty_clk0", "empty_clk1", "peer_clk0", "peer_clk1", "stage_clk0", "stage_clk1",
         "loop_clk0", "loop_clk1", "cta_ns", "epilogue_ns", "exit_ns")
"""The counters of a CTA as ``ClockSlot`` lays them out: reducer 0's (with ``where`` and the consumers'), then reducer
1's the same way (``where`` and the consumers' slots unused there)."""
REDUCER = ("start_ns", "end_ns", "start_clk", "end_clk", "turn_clk", "full_clk", "count_clk", "read_clk", "tiles",
           "spun")
"""The counters both reducers keep, summed per CTA (``turn_max_clk``, the longest wait, is their maximum)."""


FORMS = (("any", "ws3", False, 0), ("order_only", "ws3", True, 3), ("ordered", "ws3", True, 0),
         ("count_only", "ws3", True, 7), ("read_only", "ws3", True, 8), ("ws3x", "ws3x", True, 11),
         ("persistent", "ws3xp", True, 11), ("dq_group", "ws3xfd", True, 11),
         ("dq_group_tma", "ws3xfdt", True, 11))
"""(form, dK/dV variant, ordered, dq_sync) of each launch."""


def read(lib, ctas: int, slots: int) -> np.ndarray:
    buf = np.zeros((ctas, slots), dtype=np.uint64)
    err = lib.dm_dq_clock_read(buf.ctypes.data_as(ctypes.POINTER(ctypes.c_ulonglong)), ctypes.c_int(buf.size))
    if err:
        raise RuntimeError(f"dm_dq_clock_read: CUDA error {err}")
    return buf


def spans(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each CTA's first reducer start and last reducer end (globaltimer ns; reducer 0 always runs, reducer 1 only
    where the CTA has a second tile: 0 otherwise)."""
    n = len(SLOTS)
    first = np.minimum(raw[:, 1], np.where(raw[:, n + 1] > 0, raw[:, n + 1], raw[:, 1])).astype(np.float64)
    return first, np.maximum(raw[:, 2], raw[:, n + 2]).astype(np.float64)


def summary(raw: np.ndarray, blocks: int) -> dict:
    """The shares and distributions the module docstring names, from one launch's counters (rows in blockIdx order,
    which is launch order)."""
    n = len(SLOTS)
    col = {name: raw[:, i].astype(np.float64) for i, name in enumerate(SLOTS)}
    for name in REDUCER:  # both reducers' summed
        col[name] = col[name] + raw[:, n + SLOTS.index(name)].astype(np.float64)
    col["turn_max_clk"] = np.maximum(raw[:, SLOTS.index("turn_max_clk")], raw[:, n + SLOTS.index("turn_max_clk")])
    live = col["tiles"] > 0
    where = raw[:, 0]
    block = (where & 0xFFFF).astype(np.int64)
    first, last = spans(raw)
    reducer_ns = col["end_ns"] - col["start_ns"]  # both reducers' time: the denominator of every share
    clk_per_ns = (col["end_clk"] - col["start_clk"])[live].sum() / reducer_ns[live].sum()
    total_clk = reducer_ns[live].sum() * clk_per_ns

    def share(*names):  # of the reducers' time for theirs; for the consumers' (two, as many), of theirs
        return round(float(sum(col[name][live].sum() for name in names) / total_clk), 4)

    out = dict(ctas=int(live.sum()), tiles=int(col["tiles"].sum()), ghz=round(float(clk_per_ns), 3),
               span_ms=round(float((last[live].max() - first[live].min()) / 1e6), 4),
               cta_ms_sum=round(float((last - first)[live].sum() / 1e6), 3),
               turn=share("turn_clk"), full=share("full_clk"), count=share("count_clk"), read=share("read_clk"),
               empty=share("empty_clk0", "empty_clk1"), peer=share("peer_clk0", "peer_clk1"),
               stage=share("stage_clk0", "stage_clk1"),
               consumer_ms_sum=round(float((col["loop_clk0"] + col["loop_clk1"])[live].sum() / clk_per_ns / 2e6), 3),
               spun=int(col["spun"].sum()), turn_max_us=round(float(col["turn_max_clk"].max() / clk_per_ns / 1e3), 2))
    # the dQ warpgroup's (ws3xfd): in reducer 1's consumer slots, one warpgroup a CTA (zero in the other forms)
    group = {name: raw[:, n + SLOTS.index(name)].astype(np.float64)
             for name in ("peer_clk0", "empty_clk0", "loop_clk0")}
    out.update(group_full=round(float(2 * group["peer_clk0"][live].sum() / total_clk), 4),
               group_empty=round(float(2 * group["empty_clk0"][live].sum() / total_clk), 4),
               group_ms_sum=round(float(group["loop_clk0"][live].sum() / clk_per_ns / 1e6), 3))
    # turn waits by key block (eighths of the sequence) and by launch position (tenths), as µs per CTA
    eighth = np.minimum(block * 8 // max(blocks, 1), 7)
    out["turn_us_by_block_eighth"] = [round(float(col["turn_clk"][live & (eighth == e)].mean() / clk_per_ns / 1e3), 2)
                                      if (live & (eighth == e)).any() else None for e in range(8)]
    pos = np.arange(len(raw)) * 10 // len(raw)
    out["turn_us_by_launch_tenth"] = [round(float(col["turn_clk"][live & (pos == t)].mean() / clk_per_ns / 1e3), 2)
                                      if (live & (pos == t)).any() else None for t in range(10)]
    out["spun_by_launch_tenth"] = [int(col["spun"][live & (pos == t)].sum()) for t in range(10)]
    return out


def transitions(raw: np.ndarray) -> dict:
    """Where a CTA's time outside its reducers' window goes (medians over CTAs, µs; builds with ``cta_ns``): from its
    first moment to the reducers' start (``prologue_us``), from the reducers' end to its consumers' last epilogue end
    (``after_reducers_us``), the consumers' epilogues themselves (``epilogue_us``), and on each SM from one CTA's end
    (its last reducer or epilogue) to the next CTA's first moment (``launch_gap_us``: the block scheduler's)."""
    n = len(SLOTS)

    def both(name):  # reducer 0's and reducer 1's slot (the consumers' epilogue times: consumer 0's, consumer 1's)
        return raw[:, SLOTS.index(name)].astype(np.int64), raw[:, n + SLOTS.index(name)].astype(np.int64)

    def median_us(x):
        return round(float(np.median(x)) / 1e3, 2)

    cta = both("cta_ns")[0]
    live = cta > 0
    if not live.any():
        return {}
    first, last = (x.astype(np.int64) for x in spans(raw))
    epilogue, exit_ = both("epilogue_ns"), both("exit_ns")
    end = np.maximum(last, np.maximum(*exit_))
    took = np.concatenate([(e - b)[b > 0] for b, e in zip(epilogue, exit_)])
    sm = (raw[:, 0] >> np.uint64(32)).astype(np.int64)
    gaps = []
    for one in np.unique(sm[live]):
        idx = np.where((sm == one) & live)[0]
        order = idx[np.argsort(cta[idx])]
        gaps.append(cta[order[1:]] - end[order[:-1]])
    return dict(prologue_us=median_us((first - cta)[live]), after_reducers_us=median_us((end - last)[live]),
                epilogue_us=median_us(took), launch_gap_us=median_us(np.concatenate(gaps)))


def occupancy(raw: np.ndarray, sms: int, parts: int = 20, samples: int = 2000) -> dict:
    """How full the GPU was over one launch: the CTAs resident at `samples` evenly spaced instants of the launch's span
    (a CTA from its first reducer's start to its last reducer's end, globaltimer), their mean in each of `parts` equal
    parts of the span, and the share of the SMs' time (`sms` CTAs resident at once, one a SM) with none, overall and in
    the span's last tenth (the grid's tail); the rest falls between a CTA's end and the next one's start on an SM (its
    launch, its prologue before the reducers start, its epilogue after their last add)."""
    first, last = spans(raw)
    live = last > 0
    first, last = first[live], last[live]
    t0, t1 = first.min(), last.max()
    at = t0 + (np.arange(samples) + 0.5) * (t1 - t0) / samples
    resident = ((first[:, None] <= at) & (last[:, None] > at)).sum(axis=0)
    idle = np.clip(sms - resident, 0, None) / sms
    tail = samples - samples // 10
    return dict(resident_by_part=[round(float(p.mean()), 1) for p in np.array_split(resident, parts)],
                idle_share=round(float(idle.mean()), 4),
                idle_share_last_tenth=round(float(idle[tail:].sum() / samples), 4))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for clock_<form>.npy and clock.jsonl")
    parser.add_argument("--occupancy", nargs="+", metavar="NPY",
                        help="no launch: print occupancy() of saved counters (clock_<form>_<rep>.npy) and stop")
    parser.add_argument("--sms", type=int, default=132, help="SMs of the GPU that ran them (occupancy)")
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--bh", type=int, default=64)
    parser.add_argument("--forms", nargs="+", choices=[f[0] for f in FORMS], help="forms to launch (default: all)")
    parser.add_argument("--repeats", type=int, default=2, help="launches read per form (each after a warm-up)")
    parser.add_argument("--diag", nargs="+", type=int, default=[0], metavar="BITS",
                        help="dm_dq_diag settings to launch each form under (timing only, the results wrong): bit 1 "
                             "skips the split-promotion consumers' dV product (ws3xfd, ws3xfs), bit 2 their dK product, "
                             "bit 4 the reducers' adds into dq_acc")
    args = parser.parse_args(argv)
    if args.occupancy:
        for path in args.occupancy:
            print(json.dumps(dict(file=path, **occupancy(np.load(path), args.sms))))
        return 0
    if not args.out:
        parser.error("--out is required to launch")
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_quant import padded_len

    import cuda_dv_bench as bench

    lib = cuda_lib._library()
    if not hasattr(lib, "dm_dq_clock_read"):
        sys.exit(f"{cuda_lib.library_path()} has no dm_dq_clock_read: build the diagnostic library (dm-cuda-build "
                 f"--out build/cuda_clock --define DM_DQ_CLOCK) and set {cuda_lib.LIBRARY_ENV} to it")
    lib.dm_dq_clock_read.restype = lib.dm_dq_clock_clear.restype = lib.dm_dq_clock_slots.restype = ctypes.c_int
    slots = lib.dm_dq_clock_slots()
    os.makedirs(args.out, exist_ok=True)
    h = 16
    fused = bench.dqdkdv_launcher(bench.operands(args.bh // h, h, args.n, 128, causal=True))
    blocks = padded_len(args.n) // 128
    ctas = blocks * args.bh

    if args.diag != [0] and not hasattr(lib, "dm_dq_diag_set"):
        sys.exit(f"{cuda_lib.library_path()} has no dm_dq_diag_set: rebuild the diagnostic library")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for form, variant, ordered, sync in FORMS:
        if args.forms and form not in args.forms:
            continue
        launch = fused(variant, ordered, 0, sync)
        for rep in range(args.repeats):
            for diag in args.diag:  # the settings interleaved, so a drift in the clocks meets each alike
                if hasattr(lib, "dm_dq_diag_set") and lib.dm_dq_diag_set(ctypes.c_int(diag)):
                    raise RuntimeError("dm_dq_diag_set failed")
                for _ in range(3):
                    launch()
                torch.cuda.synchronize()
                if lib.dm_dq_clock_clear():
                    raise RuntimeError("dm_dq_clock_clear failed")
                launch()
                torch.cuda.synchronize()
                raw = read(lib, ctas, slots)
                name = form if diag == 0 else f"{form}_diag{diag}"
                np.save(os.path.join(args.out, f"clock_{name}_{rep}.npy"), raw)
                row = dict(form=name, rep=rep, diag=diag, **summary(raw, blocks), **transitions(raw),
                           **occupancy(raw, sms))
                rows.append(row)
                print(json.dumps(row), flush=True)
    if hasattr(lib, "dm_dq_diag_set"):
        lib.dm_dq_diag_set(ctypes.c_int(0))
    with open(os.path.join(args.out, "clock.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
