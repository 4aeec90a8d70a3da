"""tools/launch_order_model.py: the launch orders of the dK/dV + dQ kernel that it models wait only on CTAs launched
earlier (an order that does not is caught), and its tail at the reference shape is the one session 35's clock build
measured."""

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
    about 3% of the span in its last tenth, as the H100's clock build measured (3.0%, session 35); launched the
    longest first with all heads interleaved (lpt, ws3xfdtl) the tail is under 1% and the span shorter. With sections
    of 4 heads lpt's first wave holds 33 blocks of a head walking in step, and the chain of their turns costs more than
    the tail saves."""
    m = _model()
    shape, costs = m.Shape(), m.Costs()
    spt = m.simulate(shape, costs, "spt", section=4)
    lpt = m.simulate(shape, costs, "lpt", section=64)
    assert 0.025 < spt["idle_last_tenth"] < 0.035
    assert lpt["idle_last_tenth"] < 0.01 and lpt["span_ms"] < spt["span_ms"]
    assert m.simulate(shape, costs, "lpt", section=4)["span_ms"] > spt["span_ms"]


def test_spread_in_the_tiles_and_the_adds_keeps_the_longest_first_launch_ahead():
    """Each tile's time and each add's writes spread (lognormal, 10% and 30%, seeded): the pairs of a head's blocks that
    walk in step under lpt wait on each other's adds more, but its span stays below spt's."""
    m = _model()
    costs = m.Costs(tile_cv=0.1, write_cv=0.3, seed=1)
    spt = m.simulate(m.Shape(), costs, "spt", section=4)
    lpt = m.simulate(m.Shape(), costs, "lpt", section=64)
    assert lpt["turn_ms_sum"] > 0 and lpt["span_ms"] < spt["span_ms"]
