"""tools/device/step_gaps.py: the idle time before each kernel of a step and its host-bound part, read from a Chrome
trace laid out as torch.profiler writes it (kernel and launch events joined by their correlation id)."""

import pytest

from repo_script import load_script


def _module():
    return load_script("tools/device/step_gaps.py")


def _trace(steps):
    """steps: per step, a list of (kernel, launch_ts, launch_dur, kernel_ts, kernel_dur[, host op before launch])."""
    events, corr = [], 0
    for step in steps:
        for name, lts, ldur, kts, kdur, *op in step:
            corr += 1
            events.append(dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=lts, dur=ldur,
                               args=dict(correlation=corr)))
            events.append(dict(ph="X", cat="kernel", name=f"void {name}(float*)", ts=kts, dur=kdur,
                               args=dict(correlation=corr)))
            if op:
                events.append(dict(ph="X", cat="cpu_op", name=op[0], ts=lts - 5, dur=4))
    events.append(dict(ph="X", cat="gpu_user_annotation", name="step", ts=0, dur=1e6))  # not a kernel
    return dict(traceEvents=events)


def test_gaps_split_device_idle_from_host_lateness():
    """Two identical steps of three kernels: b's launch returns 30 µs after a ends (host-bound, 30 of its 40 µs gap),
    c's launch was queued long before (its 5 µs gap is the device's own)."""
    base = 0.0
    steps = []
    for _ in range(2):
        steps.append([("a", base, 2, base + 10, 100),                      # a: 10 .. 110
                      ("b", base + 130, 10, base + 150, 50, "aten::empty"),  # launch ends 140: 30 µs after a
                      ("c", base + 20, 2, base + 205, 20)])                 # queued early; b ends 200
        base += 1000.0
    df = _module().gaps(_trace(steps), iters=2)
    assert list(df["kernel"]) == ["a", "b", "c"]
    assert df["dur_us"].tolist() == pytest.approx([100, 50, 20])
    # a's gap: none in step 1, 1010 - 225 = 785 in step 2: mean 392.5; all before its launch returned (1002)? no:
    # launch of step 2's a ends at 1002, 777 µs after c ended at 225
    assert df["gap_us"].tolist() == pytest.approx([392.5, 40, 5])
    assert df["host_late_us"].tolist() == pytest.approx([388.5, 30, 0])
    assert "aten::empty" in df.loc[1, "host_ops"]
    # by step: in step 1 b's launch is 30 µs late; in step 2 a's is 777 (after step 1's c) and b's 30 again
    assert [s["host_late_us"] for s in df.attrs["by_step"]] == pytest.approx([30, 777 + 30])
    assert [s["gap_us"] for s in df.attrs["by_step"]] == pytest.approx([45, 785 + 45])
    assert [s["launch_span_us"] for s in df.attrs["by_step"]] == pytest.approx([130, 130])
    total = _module().summary(df)
    assert total["kernels_ms"] == pytest.approx(0.17)
    assert total["host_late_ms"] == pytest.approx((388.5 + 30) / 1e3)


def test_gaps_refuse_steps_that_differ_and_traces_without_kernels():
    gaps = _module().gaps
    with pytest.raises(ValueError, match="do not split into 2 equal steps"):
        gaps(_trace([[("a", 0, 1, 5, 1), ("b", 1, 1, 7, 1), ("c", 2, 1, 9, 1)]]), iters=2)
    with pytest.raises(ValueError, match="no kernel"):
        gaps(dict(traceEvents=[]), iters=1)


def test_host_calls_rank_the_runtime_calls_of_a_step():
    """A synchronisation that takes 3 ms once a step ranks above the launches (2 µs each, five a step)."""
    events = [dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=10 * i, dur=2) for i in range(10)]
    events += [dict(ph="X", cat="cuda_runtime", name="cudaStreamSynchronize", ts=500 + i, dur=3000) for i in range(2)]
    events.append(dict(ph="X", cat="cpu_op", name="aten::empty", ts=1, dur=99))  # not a runtime call
    df = _module().host_calls(dict(traceEvents=events), iters=2)
    assert df["call"].tolist() == ["cudaStreamSynchronize", "cudaLaunchKernel"]
    assert df["calls"].tolist() == pytest.approx([1, 5])
    assert df["us"].tolist() == pytest.approx([3000, 10])
    assert df["max_us"].tolist() == pytest.approx([3000, 2])
