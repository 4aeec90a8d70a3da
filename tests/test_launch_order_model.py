"""tools/launch_order_model.py: the launch orders of the dK/dV + dQ kernel that it models wait only on CTAs launched
earlier (an order that does not is caught), its tail at the reference shape is the one session 35's clock build
measured, and its port of the kernels' query-tile walks has the properties ws3xfdtl and ws3xfdtlq relied on (both
removed after session 38's measurements; their code is c86cf36's)."""

import pytest

from repo_script import load_script


def _model():
    return load_script("tools/launch_order_model.py")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("order", ["spt", "lpt", "lpt_up", "any", "any_lpt"])
def test_every_ordered_add_waits_on_a_cta_launched_earlier(order, causal):
    """Few SMs (so most CTAs start after others finish), a ragged N, sections that leave a smaller last one: every
    turn a CTA waits for belongs to a CTA started before it, and every query tile gets one add from each key block that
    reaches it."""
    m = _model()
    shape = m.Shape(n=1000, bh=5, causal=causal)
    for section in (1, 2, 5):
        out = m.simulate(shape, m.Costs(), order, section, sms=7)
        assert out["span_ms"] > 0 and 0 <= out["idle_share"] < 1


def test_adds_against_the_launch_order_are_caught():
    """Launched the shortest first with the adds in increasing key blocks, block 1 would wait on block 0, which starts
    last: the model refuses it."""
    m = _model()
    with pytest.raises(AssertionError, match="not yet started"):
        m.simulate(m.Shape(n=1024, bh=2), m.Costs(), ("last", "down", "increasing"), section=2, sms=4)


def test_the_tail_is_the_clock_builds_and_the_longest_first_launch_shortens_it():
    """At causal N = 8K, B·H = 64 on 132 SMs the order that runs (spt, sections of 4 kv heads) leaves the SMs idle
    about 3% of the span in its last tenth, as the H100's clock build measured (3.0%, session 35). Launched the longest
    first in the same sections, the tail is under 1% and, with no spread in the times, the span shorter, ordered (lpt,
    turns counted once read, as sync 11) or in any order (any_lpt against the blockIdx launch)."""
    m = _model()
    shape, costs = m.Shape(), m.Costs()
    spt = m.simulate(shape, costs, "spt", section=4)
    lpt = m.simulate(shape, costs, "lpt", section=4)
    assert 0.025 < spt["idle_last_tenth"] < 0.035
    assert lpt["idle_last_tenth"] < 0.01 and lpt["span_ms"] < spt["span_ms"]
    assert m.simulate(shape, costs, "any_lpt", section=4)["span_ms"] < m.simulate(shape, costs, "any", 4)["span_ms"]


def test_spread_and_counts_once_written_turn_the_ordered_longest_first_launch_into_a_loss():
    """The blocks of a head that start together under lpt (33 of each of 4 heads in the first wave at 8K) walk in step,
    each waiting on the one below: with each tile's time and each add's writes spread (lognormal, 10% and 30%, seeded)
    the chain adds up their delays and lpt's span passes spt's, as it does when each turn waits for the writes (sync
    0); in any order there is no chain, and any_lpt stays ahead."""
    m = _model()
    shape, spread = m.Shape(), m.Costs(tile_cv=0.1, write_cv=0.3, seed=1)
    assert m.simulate(shape, spread, "lpt", 4)["span_ms"] > m.simulate(shape, spread, "spt", 4)["span_ms"]
    written = m.Costs(count_once_read=False)
    assert m.simulate(shape, written, "lpt", 4)["span_ms"] > m.simulate(shape, written, "spt", 4)["span_ms"]
    assert m.simulate(shape, spread, "any_lpt", 4)["span_ms"] < m.simulate(shape, spread, "any", 4)["span_ms"]


CASES = [(n, causal) for n in (64, 100, 128, 130, 300, 1000, 1024, 4096) for causal in (True, False)]


@pytest.mark.parametrize("n, causal", CASES)
def test_the_downward_walk_is_the_upward_one_reversed(n, causal):
    """The port of factored.cuh's schedules and Walk: at every key block, the removed ws3xfdtl's walk (c86cf36's
    DecreasingSchedule, the halves merged by the larger start) is IncreasingSchedule's walk backwards, position by
    position (the tile, which halves read it, their masked flags), and each half reads the same tiles with the same
    masks as in Triton's order."""
    m = _model()
    blocks = -(-n // 128)
    for block in range(blocks):
        up, down = m.cta_walk(block, n, causal, "increasing"), m.cta_walk(block, n, causal, "decreasing")
        assert down == up[::-1] and up
        for half in (0, 1):
            start_n = 128 * block + 64 * half
            if start_n >= n:
                continue
            tiles = {order: sorted(m.half_schedule(start_n, n, causal, order))
                     for order in ("triton", "increasing", "decreasing")}
            assert tiles["triton"] == tiles["increasing"] == tiles["decreasing"]


@pytest.mark.parametrize("n, causal", CASES)
def test_every_query_tile_is_added_into_by_blocks_zero_to_its_last(n, causal):
    """The ordered adds of ws3xfdtl (removed; c86cf36's) waited, in increasing key blocks, for a count equal to the
    block, and ws3xfdtlq's CTA of block k cast query tiles 2k and 2k + 1 as their last adder: so the blocks whose walks
    reach a query tile must be 0 .. its last (causal: tile // 2; else the last block), and tiles 2k, 2k + 1 (below N)
    must end block k's downward walk."""
    m = _model()
    blocks, tiles = -(-n // 128), -(-n // 64)
    walks = {block: [pos[0] // 64 for pos in m.cta_walk(block, n, causal, "decreasing")] for block in range(blocks)}
    for tile in range(tiles):
        adders = sorted(block for block, walk in walks.items() if tile in walk)
        last = min(blocks - 1, tile // 2) if causal else blocks - 1
        assert adders == list(range(last + 1)) == list(m.Shape(n=n, causal=causal).adders(tile)), (tile, adders)
    if causal:
        for block, walk in walks.items():
            own = [t for t in (2 * block, 2 * block + 1) if t < tiles]
            assert sorted(walk[-len(own):]) == own, (block, walk)
