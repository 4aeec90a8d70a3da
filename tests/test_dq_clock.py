"""tools/device/dq_clock.py: the shares of the dQ-in-dK/dV forms' waits, from counters laid out as the kernel writes
them (kernels/cuda/dkdv_factored.cu, ClockSlot); and the diagnostic build's guard (kernels/cuda_build.py)."""

from pathlib import Path

import numpy as np
import pytest

from repo_script import load_script

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_script("tools/device/dq_clock.py")


def test_slots_follow_the_kernels_enum():
    """The script's names in order are the enum's (kWhere = 0 .. kPeerClk1, then kReducerSlots), read from the CUDA
    source."""
    source = (ROOT / "kernels" / "cuda" / "dkdv_factored.cu").read_text()
    enum = source.split("enum ClockSlot : int {", 1)[1].split("};", 1)[0]
    names = [item.split("=")[0].strip() for line in enum.splitlines() for item in line.split("//", 1)[0].split(",")
             if item.strip()]
    assert names[-1] == "kReducerSlots"
    assert [name[1:].lower() for name in names[:-1]] == [slot.replace("_", "") for slot in _module().SLOTS]


def test_summary_shares_and_distributions():
    """Two CTAs of 1 ms each at 2 cycles per ns, their two reducers alike: the reducers' shares are their counters over
    2 x 4e6 cycles, the consumers' theirs over as much (two consumers), by hand."""
    dq_clock = _module()
    n = len(dq_clock.SLOTS)
    raw = np.zeros((3, 2 * n), dtype=np.uint64)  # the third CTA ran no tile (a padded grid): left out
    for i, (block, turn, full, spun) in enumerate(((3, 400_000, 200_000, 5), (0, 1_200_000, 0, 7))):
        raw[i, 0] = block | (i << 16) | (7 << 32)
        raw[i, 1], raw[i, 2] = 10_000_000, 11_000_000  # ns
        raw[i, 3], raw[i, 4] = 0, 2_000_000  # cycles: 2 per ns
        raw[i, 5], raw[i, 6], raw[i, 7], raw[i, 8] = turn, full, 100_000, 20_000
        raw[i, 9], raw[i, 10], raw[i, 11] = 10, spun, turn // 2
        raw[i, 12], raw[i, 13], raw[i, 14], raw[i, 15] = 300_000, 100_000, 40_000, 0
        raw[i, 16], raw[i, 17], raw[i, 18], raw[i, 19] = 80_000, 120_000, 1_800_000, 1_800_000
        raw[i, n + 1:n + 12] = raw[i, 1:12]  # reducer 1: the same times and counts
    got = dq_clock.summary(raw, blocks=4)
    assert got["ctas"] == 2 and got["tiles"] == 40 and got["ghz"] == 2.0
    assert got["span_ms"] == 1.0 and got["cta_ms_sum"] == 2.0
    assert got["turn"] == pytest.approx(2 * 1_600_000 / 8e6) and got["full"] == pytest.approx(0.05)
    assert got["count"] == pytest.approx(0.05) and got["read"] == pytest.approx(0.01)
    # per consumer: both CTAs wait 300k + 100k (empty) and 40k + 0 (peer) cycles over two consumers
    assert got["empty"] == pytest.approx(2 * 400_000 / 4e6 / 2) and got["peer"] == pytest.approx(2 * 40_000 / 4e6 / 2)
    assert got["stage"] == pytest.approx(2 * 200_000 / 8e6) and got["consumer_ms_sum"] == pytest.approx(1.8)
    assert got["spun"] == 24 and got["turn_max_us"] == 300.0
    # block 3 is in the last eighth of 4 blocks (3 * 8 // 4 = 6), block 0 in the first: µs per CTA, both reducers
    assert got["turn_us_by_block_eighth"][0] == 1200.0 and got["turn_us_by_block_eighth"][6] == 400.0
    assert got["turn_us_by_block_eighth"][1] is None
    assert got["spun_by_launch_tenth"][0] == 10 and got["spun_by_launch_tenth"][3] == 14


def test_the_dq_warpgroups_counters_are_read_from_reducer_1s_consumer_slots():
    """ws3xfd's dQ warpgroup keeps its waits for dŜ (ds_full), for the reducers (dq_empty) and its loop in reducer 1's
    consumer slots: one CTA of 1 ms at 2 cycles per ns, its dQ warpgroup waiting 500k and 200k of its 2M cycles and
    looping 1.8M; the other forms leave them zero."""
    dq_clock = _module()
    n = len(dq_clock.SLOTS)
    raw = np.zeros((1, 2 * n), dtype=np.uint64)
    raw[0, 1], raw[0, 2], raw[0, 3], raw[0, 4], raw[0, 9] = 10_000_000, 11_000_000, 0, 2_000_000, 4
    raw[0, n + 1:n + 5] = raw[0, 1:5]
    assert dq_clock.summary(raw, blocks=1)["group_full"] == 0.0
    raw[0, n + dq_clock.SLOTS.index("peer_clk0")] = 500_000
    raw[0, n + dq_clock.SLOTS.index("empty_clk0")] = 200_000
    raw[0, n + dq_clock.SLOTS.index("loop_clk0")] = 1_800_000
    got = dq_clock.summary(raw, blocks=1)
    assert got["group_full"] == pytest.approx(0.25) and got["group_empty"] == pytest.approx(0.1)
    assert got["group_ms_sum"] == pytest.approx(0.9) and got["peer"] == 0.0


def test_transitions_between_ctas_on_an_sm():
    """Two CTAs on SM 5, one on SM 6 (ns): CTA 0 starts at 0, its reducers run 1,000-9,000, its consumers' epilogues
    8,800-9,500 and 8,900-9,300; CTA 1 (SM 5) starts at 12,500 (3,000 after CTA 0's last epilogue), reducers
    13,500-20,000, epilogues 19,000-19,600 (one consumer: its other half has no key); CTA 2 (SM 6) starts at 0,
    reducers 2,000-7,000, epilogues 7,000-7,500 and 7,000-7,700. Medians: prologue 1,000, after the reducers 500,
    epilogue 600 (of 700, 400, 600, 500, 700), launch gap 3,000; a build without the counters gives nothing."""
    dq_clock = _module()
    n = len(dq_clock.SLOTS)
    col = {name: i for i, name in enumerate(dq_clock.SLOTS)}
    raw = np.zeros((3, 2 * n), dtype=np.uint64)
    assert dq_clock.transitions(raw) == {}
    ctas = ((5, 0, (1_000, 9_000), ((8_800, 9_500), (8_900, 9_300))),
            (5, 12_500, (13_500, 20_000), ((19_000, 19_600), (0, 0))),
            (6, 0, (2_000, 7_000), ((7_000, 7_500), (7_000, 7_700))))
    for i, (sm, start, (r0, r1), epilogues) in enumerate(ctas):
        raw[i, 0] = np.uint64(i) | np.uint64(sm) << np.uint64(32)
        raw[i, col["cta_ns"]] = start
        raw[i, col["start_ns"]], raw[i, col["end_ns"]] = r0, r1
        raw[i, n + col["start_ns"]], raw[i, n + col["end_ns"]] = r0, r1
        for r, (b, e) in enumerate(epilogues):
            raw[i, r * n + col["epilogue_ns"]], raw[i, r * n + col["exit_ns"]] = b, e
    raw[:, col["cta_ns"]] += 1  # 0 reads as "no counter": a real globaltimer is never 0
    got = dq_clock.transitions(raw)
    assert got == dict(prologue_us=1.0, after_reducers_us=0.5, epilogue_us=0.6, launch_gap_us=3.0)


def test_occupancy_of_a_launch_with_a_tail():
    """Two SMs over 200 ns: CTA 0 (reducer 1 unused: one tile) 0-100, CTA 2 0-90 (its reducers' earliest start and
    latest end), CTA 1 100-200; a fourth ran no tile. Resident: 2 for 0-90, 1 after; so the halves hold 1.9 and 1.0 on
    average, the SMs are idle half the time for 110 ns (0.275 of their time) and half of the last 20 ns."""
    dq_clock = _module()
    n = len(dq_clock.SLOTS)
    raw = np.zeros((4, 2 * n), dtype=np.uint64)
    raw[0, 1], raw[0, 2] = 1_000, 1_100  # globaltimer ns
    raw[1, 1], raw[1, 2], raw[1, n + 1], raw[1, n + 2] = 1_100, 1_200, 1_120, 1_180
    raw[2, 1], raw[2, 2], raw[2, n + 1], raw[2, n + 2] = 1_010, 1_060, 1_000, 1_090
    got = dq_clock.occupancy(raw, sms=2, parts=2, samples=200)
    assert got["resident_by_part"] == [pytest.approx(1.9), pytest.approx(1.0)]
    assert got["idle_share"] == pytest.approx(0.275)
    assert got["idle_share_last_tenth"] == pytest.approx(0.05)


def test_a_diagnostic_build_needs_its_own_folder(capsys):
    from deltamatch.kernels import cuda_build

    with pytest.raises(SystemExit):
        cuda_build.main(["--define", "DM_DQ_CLOCK"])
    assert "its own --out" in capsys.readouterr().err
