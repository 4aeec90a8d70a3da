"""Tables from synthetic pipeline outputs, checked against the numbers the fixture wrote (recomputed here)."""

import numpy as np
import pandas as pd
import pytest

from deltamatch.reports import tables
from deltamatch.reports.cli import main
from deltamatch.reports.inputs import load_evals, load_summaries, run_tag
from deltamatch.reports.paper import load_paper

SCALE_OF = {"tiny": "1.67B"}
ALIASES = {"dm_ruler_8k": "ruler_8k"}


@pytest.fixture(scope="module")
def paper():
    return load_paper()[0]


def _base(synthetic):
    runs = synthetic["runs"]
    return runs[runs["variant"] == "base"], [e for e in synthetic["evals"] if e["variant"] == "base"]


def test_paper_values_cover_the_issue_list(paper):
    main = paper[paper["artefact"] == "main"].set_index(["method", "metric"])["value"]
    assert main[("bf16", "val_ce")] == 1.4178 and main[("matched", "val_ce")] == 1.4162
    assert main[("stale", "val_ce")] == 1.8970 and main[("cudnn_fp8", "val_ce")] == 1.6105
    assert main[("consistent", "val_ce")] == 1.4667 and main[("matched", "ruler_8k")] == 47.8
    table9 = paper[paper["artefact"] == "table9"]
    assert set(table9["method"]) == {"stale", "consistent", "matched"} and len(table9) == 7
    assert set(paper["artefact"]) >= {"main", "scale", "table9", "figure1", "figure4", "figure5", "ablations"}


def test_run_tag_reads_the_layout():
    assert run_tag("results/x/runs/nope/1.67B/matched/s1/summary.json", "runs") == {
        "variant": "nope", "size": "1.67B", "method": "matched", "seed": 1}
    with pytest.raises(ValueError, match="layout"):
        run_tag("somewhere/summary.json", "runs")


def test_main_table_means_differences_and_paper_rows(synthetic, paper):
    runs, evals = _base(synthetic)
    table = tables.main_table(load_summaries(list(runs["summary"])), load_evals([e["path"] for e in evals]),
                              paper, SCALE_OF, ALIASES)
    val = table[table["metric"] == "val_ce"].set_index("method")
    expected = runs.groupby("method")["val_ce"].mean()
    for method in expected.index:
        assert val.loc[method, "ours"] == pytest.approx(expected[method])
        assert val.loc[method, "seeds"] == 2 and val.loc[method, "our_scale"] == "tiny"
    assert val.loc["matched", "difference"] == pytest.approx(expected["matched"] - 1.4162)
    # the paper's cuDNN row stays, with nothing of ours beside it
    assert val.loc["cudnn_fp8", "paper"] == 1.6105 and np.isnan(val.loc["cudnn_fp8", "ours"])
    assert set(table["paper_scale"]) == {"1.67B"}
    # lm-eval's fractions appear in percent, RULER under the paper's name
    ruler = table[(table["metric"] == "ruler_8k")].set_index("method")
    mean_ruler = np.mean([e["result"]["tasks"]["dm_ruler_8k"]["8192"] for e in evals if e["method"] == "matched"])
    assert ruler.loc["matched", "ours"] == pytest.approx(100 * mean_ruler)
    assert ruler.loc["matched", "paper"] == 47.8
    ppl = table[table["metric"] == "heldout:word_perplexity"].set_index("method")
    mean_ppl = np.mean([e["result"]["tasks"]["heldout"]["word_perplexity"] for e in evals if e["method"] == "bf16"])
    assert ppl.loc["bf16", "ours"] == pytest.approx(mean_ppl)
    avg = table[table["metric"] == "offline_avg"].set_index("method")
    assert avg.loc["stale", "ours"] == pytest.approx(
        100 * np.mean([e["result"]["average"] for e in evals if e["method"] == "stale"]))
    assert list(val.index[:3]) == ["bf16", "stale", "consistent"]  # the registry's order


def test_main_table_refuses_two_sizes(synthetic, paper):
    summaries = load_summaries(list(synthetic["runs"]["summary"]))
    summaries.loc[0, "size"] = "569M"
    with pytest.raises(ValueError, match="one size"):
        tables.main_table(summaries, load_evals([]), paper, SCALE_OF, ALIASES)


def test_ablation_gaps_are_to_bf16_of_the_same_variant(synthetic, paper):
    runs = synthetic["runs"]
    table = tables.ablation_table(load_summaries(list(runs["summary"])),
                                  load_evals([e["path"] for e in synthetic["evals"]]), paper, SCALE_OF, ALIASES)
    gaps = table[(table["metric"] == "ce_gap_to_bf16") & table["ours"].notna()].set_index(["variant", "method"])
    means = runs.groupby(["variant", "method"])["val_ce"].mean()
    for variant in ("base", "nope"):
        for method in ("stale", "matched"):
            assert gaps.loc[(variant, method), "ours"] == pytest.approx(means[(variant, method)] - means[(variant, "bf16")])
    # the paper's NoPE gap is at 1.67B: our tiny NoPE stands beside it through scale_of
    assert gaps.loc[("nope", "stale"), "paper"] == 0.2362


def test_scale_table_maps_our_sizes(synthetic, paper):
    runs, evals = _base(synthetic)
    table = tables.scale_table(load_summaries(list(runs["summary"])), load_evals([e["path"] for e in evals]),
                               paper, SCALE_OF, ALIASES)
    row = table[(table["paper_scale"] == "1.67B") & (table["method"] == "stale") & (table["metric"] == "val_ce")]
    assert row["ours"].item() == pytest.approx(runs[runs["method"] == "stale"]["val_ce"].mean())
    assert row["paper"].item() == 1.8970
    big = table[table["paper_scale"] == "5.29B"]
    assert big["ours"].isna().all() and len(big) == 7


def test_probe_table_summaries(synthetic, paper):
    probes = synthetic["probes"]
    table = tables.probe_table(probes, "tiny", paper, SCALE_OF)
    rows = table.set_index(["layers", "method", "metric"])
    early = probes[probes["layer"] < 11]
    assert rows.loc[("all_but_last", "stale", "before_cast"), "ours"] == pytest.approx(
        early[early["delta"] == "stale"]["before_cast"].mean())
    assert rows.loc[("all_but_last", "stale", "before_cast"), "paper"] == 1.1e-2
    last = probes[(probes["layer"] == 11) & (probes["delta"] == "stale")]["before_cast"].item()
    assert rows.loc[("last", "stale", "before_cast"), "ours"] == pytest.approx(last)
    assert rows.loc[("last", "stale", "before_cast"), "paper"] == 4.7e-2
    assert rows.loc[("layer 7", "matched", "after_cast"), "ours"] == pytest.approx(
        probes[(probes["layer"] == 7) & (probes["delta"] == "matched")]["after_cast"].item())


def test_kernel_table_without_and_with_hopper():
    check = pd.DataFrame([{"name": "fwd", "fp8_wgmma_dots": 2, "matmuls": 2}])
    table = tables.kernel_table(check, None, None, {"hopper": False, "device": None})
    assert "no Hopper GPU" in table[table["section"] == "status"]["status"].item()
    bench = pd.DataFrame([{"method": m, "head_dim": 128, "seq_len": 8192, "causal": True, "fwd_bwd_ms": ms}
                          for m, ms in (("sdpa_cudnn_bf16", 2.0), ("matched", 1.6))])
    table = tables.kernel_table(check, bench, None, {"hopper": True, "device": "H200"})
    assert "status" not in set(table["section"])
    latency = table[table["section"] == "latency"].set_index("method")
    assert latency.loc["matched", "speedup_vs_cudnn_bf16"] == pytest.approx(2.0 / 1.6)


def test_sweep_table_is_the_pivot(synthetic):
    sweep = synthetic["sweep"]
    table = tables.sweep_table(sweep).set_index(["inputs", "spread", "method"])
    one = sweep[(sweep["inputs"] == "outlier") & (sweep["spread"] == 2.0) & (sweep["method"] == "stale")]
    for metric, value in zip(one["metric"], one["value"]):
        assert table.loc[("outlier", 2.0, "stale"), metric] == pytest.approx(value)


def test_cli_table_and_errors(synthetic, tmp_path, capsys):
    runs, evals = _base(synthetic)
    out = tmp_path / "main.csv"
    assert main(["table", "main", "--runs", *runs["summary"], "--evals", *[e["path"] for e in evals],
                 "--scale-of", "tiny=1.67B", "--alias", "dm_ruler_8k=ruler_8k", "--out", str(out)]) == 0
    written = pd.read_csv(out)
    assert {"method", "metric", "paper", "ours", "difference", "paper_scale", "our_scale", "seeds"} <= set(written)
    assert main(["table", "main", "--runs", str(tmp_path / "nope.json"), "--out", str(out)]) == 2
    assert "missing input file" in capsys.readouterr().err
    assert main(["table", "main", "--runs", *runs["summary"], "--scale-of", "tiny", "--out", str(out)]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_probe_table_with_one_attention_layer(synthetic, paper):
    probes = synthetic["probes"]
    single = probes[probes["layer"] == 7]
    rows = tables.probe_table(single, "tiny", paper, SCALE_OF).set_index(["layers", "method", "metric"])
    value = single[single["delta"] == "matched"]["before_cast"].item()
    assert rows.loc[("all_but_last", "matched", "before_cast"), "ours"] == pytest.approx(value)
    assert rows.loc[("last", "matched", "before_cast"), "ours"] == pytest.approx(value)
