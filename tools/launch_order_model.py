"""A model of how the CUDA dK/dV + dQ kernel's CTAs fill the GPU: which launch order of (key block, kv head) leaves
how much of the SMs idle at the grid's tail, and how long the ordered dQ adds wait for their turns.

The model: one CTA an SM (`ws3xfdt` holds one), `sms` of them; the block scheduler starts the CTAs in launch order,
each on the first SM to free. A CTA of key block k walks its query tiles (64 queries each; causal: tiles 2k .. last,
128 keys a CTA) at ``tile_us`` a tile after ``cta_us`` of its own (prologue, epilogue, the scheduler's gap). Each
tile's dQ product goes to the query tile's FP32 scratch by one of the CTA's two reducers (every other tile each, one
add at a time): the add starts once the product is formed and, ordered, once the add before it in the tile's order of
key blocks has completed; it reads the product in ``read_us`` (which frees the buffer: the consumers run at most
``slack`` tiles ahead) and its writes complete ``write_us`` later. Calibrated on session 35's clock build
(`benchmarks/results/h100_kernel_2026-12-05_s35/`, call 4, H100, `ws3xfdt` at causal N = 8K, B·H = 64): 4,096 CTAs,
266,240 tiles, the CTAs' reducer windows summing to 466.8 ms, so ≈ 1.70 µs a tile once ≈ 2.6 µs a CTA is taken out;
span 3.72 ms; the SMs idle 5.0% of it, 3.0% in its last tenth (the tail: this model's idle share, which counts the
CTAs' own prologues and epilogues as busy). Without ``--tile-cv`` and ``--write-cv`` it has no variance: a turn
comes exactly when it can.

Orders (`--orders`, ORDERS: launch, walk, adds):
  spt       what runs now (ordered): per section of kv heads (cuda_lib.ordered_section_heads: 4 at 8K), key blocks
            from the last (causal: the shortest first), the section's heads interleaved; each CTA walks its tiles
            upward from the diagonal; the adds into a query tile in decreasing key blocks;
  lpt       ordered, key blocks from the first (the longest first), each CTA walking its tiles downward to its
            diagonal, the adds in increasing key blocks (the same sections: L2's, which this model leaves out);
  lpt_up    lpt's launch and adds with upward walks: what a walk against the adds' order costs;
  any       the unordered form's launch (blockIdx order: each head's key blocks from the first, heads in turn), adds
            in any order;
  any_lpt   lpt's launch, adds in any order.
lpt and any_lpt were the CUDA form `ws3xfdtl` (ordered and not), and `ws3xfdtlq` finished dQ in lpt's kernel; both
were removed after session 38 measured them on the H100 (kernels/NOTES.md): ws3xfdtl 0.0% of the kernel ordered and
−0.3% in any order, where this model put −1.5% to +5.4% and −2.6%; ws3xfdtlq +7.2%. Their code is c86cf36's.
Every ordered add may wait only on a CTA launched earlier (else a launch larger than the GPU could deadlock); the
model asserts it of every wait.

Beside the model, a line-for-line port of factored.cuh's query-tile schedules and of Walk's merge of a CTA's two
halves (``half_schedule``, ``cta_walk``; the decreasing order and Walk's merge by the larger start are ports of
c86cf36's factored.cuh, since removed with ws3xfdtl), by which tests/test_launch_order_model.py checks, without a GPU,
what the removed forms relied on: the downward walk is the upward one reversed, every query tile is added into by key
blocks 0 to its last, and tiles 2k and 2k + 1 end block k's downward walk.

    python tools/launch_order_model.py [--n 8192] [--bh 64] [--sms 132] [--section 4] [--orders spt lpt]
"""

from __future__ import annotations

import argparse
import functools
import heapq
from dataclasses import dataclass

import numpy as np

ORDERS = {"spt": ("last", "up", "decreasing"), "lpt": ("first", "down", "increasing"),
          "lpt_up": ("first", "up", "increasing"), "any": ("grid", "up", "any"), "any_lpt": ("first", "up", "any")}
"""Each order's launch (key blocks from the last or the first, sections of heads interleaved; or blockIdx order), its
walks over query tiles, and the order of the adds into a query tile by key block."""


# A port of kernels/cuda/factored.cuh's query-tile schedules of one 64-key half (Schedule: Triton's order;
# IncreasingSchedule; DecreasingSchedule, removed with ws3xfdtl: c86cf36's) and of Walk's merge of a CTA's two halves,
# line for line, so that the walks the ordered forms rely on can be checked without a GPU
# (tests/test_launch_order_model.py).
BLOCK = 64  # kBlockM = kBlockN: queries a tile, keys a half


def half_schedule(start_n: int, n: int, causal: bool, order: str) -> list[tuple[int, bool]]:
    """(first query, masked) of each tile half `start_n` reads, in `order`: "triton", "increasing" or "decreasing"."""
    full_end = (n // BLOCK) * BLOCK
    lo = diag_end = 0
    if causal:
        lo = start_n
        diag_end = max(lo, min(start_n + BLOCK, full_end))
    tail = max(full_end, lo)
    if start_n + BLOCK > n:  # the ragged last key block: every tile masked
        diag_end = tail = full_end = lo
    unmasked = (full_end - diag_end + BLOCK - 1) // BLOCK if full_end > diag_end else 0
    hi = n - (tail - diag_end)
    tiles = unmasked + ((hi - lo + BLOCK - 1) // BLOCK if hi > lo else 0)
    out = []
    if order == "triton":
        for it in range(tiles):
            if it < unmasked:
                out.append((diag_end + BLOCK * it, False))
            else:
                m = lo + BLOCK * (it - unmasked)
                out.append((m if m < diag_end else m + (tail - diag_end), True))
        return out
    diag = (diag_end - lo) // BLOCK
    for it in range(tiles):
        if it < diag:
            start = lo + BLOCK * it
        elif it < diag + unmasked:
            start = diag_end + BLOCK * (it - diag)
        else:
            start = tail + BLOCK * (it - diag - unmasked)
        out.append((start, it < diag or it >= diag + unmasked))
    return out[::-1] if order == "decreasing" else out


def cta_walk(block: int, n: int, causal: bool, order: str) -> list[tuple[int, bool, bool, bool, bool]]:
    """The positions of a 128-key CTA's walk (Walk: the two halves merged, by the smaller start or, decreasing, the
    larger): (first query, half 0 reads it, half 1 reads it, half 0's masked flag, half 1's)."""
    start_n = block * 2 * BLOCK
    halves = [half_schedule(start_n, n, causal, order),
              half_schedule(start_n + BLOCK, n, causal, order) if start_n + BLOCK < n else []]
    i, out = [0, 0], []
    while i[0] < len(halves[0]) or i[1] < len(halves[1]):
        none = float("-inf") if order == "decreasing" else float("inf")
        m = [h[k][0] if k < len(h) else none for h, k in zip(halves, i)]
        start = max(m) if order == "decreasing" else min(m)
        use = [x == start for x in m]
        out.append((start, use[0], use[1], use[0] and halves[0][i[0]][1], use[1] and halves[1][i[1]][1]))
        i = [k + u for k, u in zip(i, use)]
    return out


@functools.lru_cache(maxsize=None)
def upward_tiles(block: int, n: int, causal: bool) -> list[int]:
    """The query tiles of cta_walk's increasing walk of key block `block` (a model's walks, cached: 64 distinct at 8K)."""
    return [start // BLOCK for start, *_ in cta_walk(block, n, causal, "increasing")]


@dataclass(frozen=True)
class Shape:
    n: int = 8192
    bh: int = 64
    causal: bool = True

    @property
    def blocks(self) -> int:
        return -(-self.n // (2 * BLOCK))

    @property
    def tiles(self) -> int:
        return -(-self.n // BLOCK)

    def walk(self, block: int) -> list[int]:
        """The query tiles key block `block` reads, upward: the port's walk (IncreasingSchedule's)."""
        return upward_tiles(block, self.n, self.causal)

    def adders(self, tile: int) -> range:
        """The key blocks whose adds reach query tile `tile` (causal: up to its diagonal's)."""
        return range(min(self.blocks - 1, tile // 2) + 1 if self.causal else self.blocks)


@dataclass(frozen=True)
class Costs:
    tile_us: float = 1.70
    cta_us: float = 2.6
    read_us: float = 1.0
    write_us: float = 2.3
    slack: int = 2
    count_once_read: bool = True
    """When an add counts itself, the next add's turn: once its read is done (dq_sync 11, what runs) or its writes."""
    count_us: float = 0.5
    """From an add's count to the next adder seeing it (a release and an acquire through L2)."""
    tile_cv: float = 0.0
    """Spread of each tile's time (its coefficient of variation, lognormal; 0: every tile ``tile_us``)."""
    write_cv: float = 0.0
    """Spread of each add's write time (L2's reduction under load)."""
    seed: int = 0


def launch_order(shape: Shape, launch: str, section: int) -> list[tuple[int, int]]:
    """(key block, head) in launch order."""
    blocks, heads = shape.blocks, shape.bh
    if launch == "grid":
        return [(k, h) for h in range(heads) for k in range(blocks)]
    out = []
    for first in range(0, heads, section):
        members = range(first, min(first + section, heads))
        ks = range(blocks - 1, -1, -1) if launch == "last" else range(blocks)
        out += [(k, h) for k in ks for h in members]
    return out


def simulate(shape: Shape, costs: Costs, order: str | tuple[str, str, str], section: int, sms: int = 132) -> dict:
    """Span, the SMs' idle share (overall and in the span's last tenth), the CTAs resident in the span's last three
    twentieths and the turn waits of one launch; ``order`` a name of ORDERS or its (launch, walk, adds)."""
    launch, walk_dir, adds = ORDERS[order] if isinstance(order, str) else order
    done: dict[tuple[int, int, int], float] = {}  # (head, query tile, key block): when the next adder sees its count

    def before(k: int, j: int) -> int | None:
        """The key block whose add into query tile j comes right before block k's (None: k's comes first)."""
        blocks = shape.adders(j)
        if adds == "increasing":
            return k - 1 if k > blocks.start else None
        return k + 1 if k + 1 < blocks.stop else None

    # A CTA's whole run is computed when it starts: every add it waits for belongs to a CTA started earlier (asserted),
    # whose adds are then known.
    rng = np.random.default_rng(costs.seed)

    def spread(mean: float, cv: float, size: int) -> np.ndarray:  # lognormal with that mean and coefficient of variation
        if cv <= 0:
            return np.full(size, mean)
        sigma = np.sqrt(np.log1p(cv * cv))
        return mean * rng.lognormal(-sigma * sigma / 2, sigma, size)

    free = [(0.0, sm) for sm in range(sms)]
    heapq.heapify(free)
    starts, ends, waits = [], [], []
    for k, h in launch_order(shape, launch, section):
        t0, sm = heapq.heappop(free)
        walk = shape.walk(k)[::-1] if walk_dir == "down" else shape.walk(k)
        t = t0 + costs.cta_us / 2
        read, written, wait = [], [], 0.0
        tile_us = spread(costs.tile_us, costs.tile_cv, len(walk))
        write_us = spread(costs.write_us, costs.write_cv, len(walk))
        for i, j in enumerate(walk):
            if i >= costs.slack:  # the consumers wait for the buffer of the add `slack` tiles back to be read
                t = max(t, read[i - costs.slack])
            t += tile_us[i]
            ready = max(t, written[i - 2] if i >= 2 else 0.0)  # this tile's reducer, done with its last add
            prev = before(k, j) if adds != "any" else None
            if prev is not None:
                turn = done.get((h, j, prev))
                assert turn is not None, f"block {k} of head {h} waits on block {prev} for tile {j}, not yet started"
                wait += max(0.0, turn - ready)
                ready = max(ready, turn)
            read.append(ready + costs.read_us)
            written.append(read[-1] + write_us[i])
            done[h, j, k] = (read if costs.count_once_read else written)[-1] + costs.count_us
        end = max(max(written, default=t), t) + costs.cta_us / 2
        starts.append(t0)
        ends.append(end)
        waits.append(wait)
        heapq.heappush(free, (end, sm))
    starts, ends = np.array(starts), np.array(ends)
    span = ends.max()
    at = (np.arange(2000) + 0.5) * span / 2000
    resident = ((starts[:, None] <= at) & (ends[:, None] > at)).sum(axis=0)
    idle = np.clip(sms - resident, 0, None) / sms
    return dict(order=order if isinstance(order, str) else "/".join(order), span_ms=round(float(span) / 1e3, 3),
                idle_share=round(float(1 - (ends - starts).sum() / (sms * span)), 4),
                idle_last_tenth=round(float(idle[1800:].sum() / 2000), 4),
                tail_resident=[round(float(x.mean()), 1) for x in np.array_split(resident, 20)[-3:]],
                turn_ms_sum=round(float(np.sum(waits)) / 1e3, 2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--bh", type=int, default=64, help="kv heads (B·H_kv)")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--section", type=int, nargs="+", default=[4, 64],
                        help="kv heads a section (each order is run at each)")
    parser.add_argument("--non-causal", action="store_true")
    parser.add_argument("--tile-us", type=float, default=Costs.tile_us)
    parser.add_argument("--cta-us", type=float, default=Costs.cta_us)
    parser.add_argument("--read-us", type=float, default=Costs.read_us)
    parser.add_argument("--write-us", type=float, default=Costs.write_us)
    parser.add_argument("--count-once-written", action="store_true", help="turns after the writes (dq_sync 0)")
    parser.add_argument("--count-us", type=float, default=Costs.count_us)
    parser.add_argument("--tile-cv", type=float, default=0.0, help="spread of a tile's time (coefficient of variation)")
    parser.add_argument("--write-cv", type=float, default=0.0, help="spread of an add's write time")
    parser.add_argument("--seeds", type=int, default=1, help="runs with spread, each printed")
    parser.add_argument("--orders", nargs="+", default=list(ORDERS), choices=list(ORDERS))
    args = parser.parse_args(argv)
    shape = Shape(n=args.n, bh=args.bh, causal=not args.non_causal)
    for seed in range(args.seeds):
        costs = Costs(tile_us=args.tile_us, cta_us=args.cta_us, read_us=args.read_us, write_us=args.write_us,
                      count_once_read=not args.count_once_written, count_us=args.count_us, tile_cv=args.tile_cv,
                      write_cv=args.write_cv, seed=seed)
        for order in args.orders:
            for section in args.section:
                print(dict(seed=seed, section=section, **simulate(shape, costs, order, section, args.sms)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
