"""The AOT build check: every one of the seven attention matmuls compiles to an FP8 (E4M3) wgmma for sm_90a."""

import json

import pytest

from deltamatch.kernels import check


@pytest.fixture(scope="module")
def rows():
    return {spec.name: check.analyse(spec, 128) for spec in check.kernel_specs(128, causal=True)}


# which of the spec's seven matmuls (kernels/README.md) each kernel computes
MATMULS = {"attn_fwd": {1, 2}, "attn_bwd_dkdv": {3, 4, 5, 7}, "attn_bwd_dk": {3, 4, 7}, "attn_bwd_dv": {3, 5},
           "attn_bwd_dq": {3, 4, 6}, "attn_bwd_delta_matched": {3, 4}, "quant_pass": set(),
           "quant_do_delta_pass": set()}


def test_each_of_the_seven_matmuls_is_an_fp8_wgmma(rows):
    assert set().union(*(MATMULS[name] for name in rows)) == set(range(1, 8))
    for name, r in rows.items():
        # every dot in the kernel is a warp-group dot on E4M3 operands, and nothing else issues an MMA
        assert r["dots"] == len(MATMULS[name]) * r["copies"], r
        assert r["fp8_wgmma_dots"] == r["dots"], r
        assert r["other_mma"] == 0, r
        assert (r["fp8_wgmma"] > 0) == (r["dots"] > 0), r
        assert r["qgmma"] == r["fp8_wgmma"], r  # one QGMMA in the SASS per wgmma.mma_async e4m3 in the PTX
        assert r["registers"] is not None and r["registers"] <= 255, r


@pytest.mark.parametrize("head_dim", [64, 256])
def test_other_head_dims_compile_to_fp8_wgmma(head_dim):
    for spec in check.kernel_specs(head_dim, causal=False):
        if spec.matmuls:
            r = check.analyse(spec, head_dim)
            assert r["fp8_wgmma_dots"] == r["dots"] == spec.matmuls * spec.copies and r["other_mma"] == 0, r


def test_cli_prints_one_json_object_per_kernel(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(check, "kernel_specs", lambda d, causal=True: check._kernel_specs(d, causal)[-1:])
    out = tmp_path / "check.jsonl"
    assert check.main(["--head-dims", "64", "--out", str(out)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in printed] == ["quant_do_delta_pass"]
    assert [json.loads(line) for line in out.read_text().splitlines()] == printed


def test_cli_rejects_unknown_head_dim():
    with pytest.raises(ValueError, match="head dim 96"):
        check.main(["--head-dims", "96"])
