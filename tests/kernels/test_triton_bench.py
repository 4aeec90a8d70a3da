"""The kernel benchmark's FLOP convention and its refusals (the timing itself needs a GPU: benchmarks/)."""

import pytest
import torch

from deltamatch.kernels import bench


def test_flop_convention_is_flashattention_s():
    fwd = bench.flops(2, 3, 1024, 128, causal=False, bwd=False)
    assert fwd == 4 * 2 * 3 * 1024**2 * 128
    assert bench.flops(2, 3, 1024, 128, causal=True, bwd=False) == fwd / 2
    assert bench.flops(2, 3, 1024, 128, causal=False, bwd=True) == 3.5 * fwd  # backward 2.5× forward


def test_unknown_method_is_named(tmp_path):
    with pytest.raises(ValueError, match="flashinfer"):
        bench.main(["--out", str(tmp_path), "--methods", "matched", "flashinfer"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_to_run_without_cuda(tmp_path):
    with pytest.raises(ValueError, match="CUDA"):
        bench.run(bench.BenchConfig(), str(tmp_path), ["matched"], memory=False)
