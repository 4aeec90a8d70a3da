"""tools/delta_pv_probe.py: the sweep's measures for each δ, matched's reassociated forms among them, run reduced."""

import pandas as pd

from repo_script import load_script


def _tool():
    return load_script("tools/delta_pv_probe.py")


def test_the_probe_prints_and_writes_every_delta_and_the_exact_p_form_equals_matched(tmp_path, capsys):
    tool = _tool()
    out = tmp_path / "pv.csv"
    assert tool.main(["--seeds", "1", "--tokens", "96", "--spreads", "4", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert set(table["delta"]) == set(tool.KINDS) and set(table["method"]) == set(tool.METHODS)
    assert len(table) == len(tool.KINDS) * len(tool.METHODS) * 2  # two input families, one spread
    printed = capsys.readouterr().out
    assert all(kind in printed for kind in tool.KINDS)
    for (family, method), rows in table.groupby(["inputs", "method"]):
        by = rows.set_index("delta")
        # P exact: matched's δ up to FP32 order, so the same residual after the cast and the same gradients
        assert by.loc["pv_fp32", "rowsum_before_cast"] < 1e-6, (family, method)
        assert abs(by.loc["pv_fp32", "rowsum_after_cast"] / by.loc["matched", "rowsum_after_cast"] - 1) < 1e-3
        # the operand's rounding shows before the cast, below stale's
        assert by.loc["matched", "rowsum_before_cast"] < by.loc["pv_tf32", "rowsum_before_cast"]
        assert by.loc["pv_tf32", "rowsum_before_cast"] < by.loc["pv_bf16", "rowsum_before_cast"]
        assert by.loc["pv_bf16", "rowsum_before_cast"] < by.loc["stale", "rowsum_before_cast"]
