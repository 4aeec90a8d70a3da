"""Figures and the rendered page from synthetic pipeline outputs: the numbers beside each figure are recomputed here
from the records the fixture wrote, and the page says what it must (scale, no Hopper GPU, the paper beside ours)."""

import base64
import html as htmllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from deltamatch.reports.cli import main
from deltamatch.reports.inputs import bench_provenance

RECORDED = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

STEPS_TAIL = 0.1


def _png(path):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def _expected_final_loss(records):
    by_step = {}
    for r in records:
        if r["kind"] == "train":
            by_step[r["step"]] = r["loss"]  # later records of a step replace earlier ones (resumed run)
    losses = [by_step[s] for s in sorted(by_step)]
    tail = max(1, int(len(losses) * STEPS_TAIL))
    return float(np.mean(losses[-tail:]))


def test_figure1_numbers(synthetic, tmp_path):
    runs = synthetic["runs"][synthetic["runs"]["variant"] == "base"]
    png, values = tmp_path / "f1.png", tmp_path / "f1.csv"
    assert main(["figure", "figure1_loss", "--runs", *runs["summary"], "--scale-of", "tiny=1.67B",
                 "--out", str(png), "--values", str(values)]) == 0
    assert _png(png)
    table = pd.read_csv(values).set_index(["method", "metric"])
    for method in ("bf16", "stale"):
        expected = np.mean([_expected_final_loss(r) for r in runs[runs["method"] == method]["records"]])
        assert table.loc[(method, "final_train_loss"), "ours"] == pytest.approx(expected)
    assert table.loc[("stale", "final_train_loss"), "paper"] == 1.89
    assert table.loc[("stale", "final_train_loss"), "paper_scale"] == "1.67B"
    assert table.loc[("stale", "final_train_loss"), "our_scale"] == "tiny"


def test_figure4_and_figure5_numbers(synthetic, tmp_path):
    runs = synthetic["runs"][synthetic["runs"]["variant"] == "base"]
    assert main(["figure", "figure4_gain", "--runs", *runs["summary"], "--out", str(tmp_path / "f4.png"),
                 "--values", str(tmp_path / "f4.csv"), "--scale-of", "tiny=1.67B"]) == 0
    f4 = pd.read_csv(tmp_path / "f4.csv").set_index(["method", "metric"])
    stale = runs[runs["method"] == "stale"]["records"]
    last_k = [[r for r in recs if r["kind"] == "gain" and r["layer"] == 7][-1]["k_gain_max"] for recs in stale]
    assert f4.loc[("stale", "k_gain_max"), "ours"] == pytest.approx(np.mean(last_k))
    assert f4.loc[("stale", "k_gain_max"), "paper"] == 5.5
    assert main(["figure", "figure5_scales", "--runs", *runs["summary"], "--out", str(tmp_path / "f5.png"),
                 "--values", str(tmp_path / "f5.csv")]) == 0
    f5 = pd.read_csv(tmp_path / "f5.csv")
    assert set(f5[f5["ours"].isna()]["paper_scale"]) == {"569M", "5.29B"}  # the paper's scales, not ours: kept apart
    f5 = f5.dropna(subset=["ours"]).set_index(["method", "metric"])
    gains = [max(max(r["q_gain_max"], r["k_gain_max"]) for r in recs if r["kind"] == "gain") for recs in stale]
    assert f5.loc[("stale", "gain_max"), "ours"] == pytest.approx(np.mean(gains))
    assert _png(tmp_path / "f4.png") and _png(tmp_path / "f5.png")


def test_whole_report_page(synthetic, tmp_path):
    root = synthetic["root"]
    assert main(["all", "--results", str(root), "--scale-of", "tiny=1.67B", "--alias", "dm_ruler_8k=ruler_8k",
                 "--scale-note", "Embedded default: tiny models on a CPU."]) == 0
    report = root / "report"
    html = htmllib.unescape((report / "index.html").read_text())
    markdown = (report / "report.md").read_text()
    for page in (html, markdown):
        assert "Embedded default: tiny models on a CPU." in page
        assert "NOT measured at the paper's scale" in page and "ours at tiny beside the paper's 1.67B" in page
        assert "No Hopper GPU" in page
        for title in ("Main table", "Scale table", "Figure 1", "Figure 4", "Figure 5", "Table 9", "Ablations",
                      "Kernel", "Random-head sweep", "Citation"):
            assert title in page
    # the HTML stands alone: every figure embedded as a data URI, the same bytes as the PNG beside it
    png = (report / "figures" / "figure1_loss.png").read_bytes()
    assert f'src="data:image/png;base64,{base64.b64encode(png).decode()}"' in html
    assert 'src="figures/' not in html and "](figures/sweep.png)" in markdown
    # the main table's BF16 row: the paper's 1.4178 beside our mean; tiny against 1.67B gives no difference
    main_table = pd.read_csv(report / "tables" / "main_1p67b.csv")
    row = main_table[(main_table["method"] == "bf16") & (main_table["metric"] == "val_ce")].iloc[0]
    line = next(ln for ln in markdown.splitlines() if "| bf16" in ln and "val_ce" in ln)
    assert "1.4178" in line and f"{row['ours']:.5g}" in line and "not comparable (scale)" in line
    assert "≈ 5.5" in markdown  # approximate paper values are marked
    assert "—" not in markdown.split("## Citation")[0]  # no cell hides what is missing behind a dash
    # the claims table comes first, then the contents, then the sections: training before the sweep and the kernel
    order = [markdown.index(h) for h in ("## Claims", "- [Main table]", "## Main table", "## Figure 1",
                                         "## Random-head sweep", "## Kernel")]
    assert order == sorted(order)
    claims = pd.read_csv(report / "claims.csv").set_index("id")
    assert claims.loc["cudnn_spike", "verdict"] == "not measured here"
    assert claims.loc["ds_workspace", "source"] == "kernel repository README"


def test_runs_without_gain_records_fail_naming_the_setting(synthetic, tmp_path, capsys):
    run = synthetic["runs"].iloc[0]
    path = tmp_path / "results/x/runs/base/tiny/bf16/s0"
    path.mkdir(parents=True)
    (path / "summary.json").write_text(open(run["summary"]).read().replace('"stale"', '"bf16"'))
    lines = [line for line in open(run["summary"].replace("summary.json", "metrics.jsonl")) if '"gain"' not in line]
    (path / "metrics.jsonl").write_text("".join(lines))
    assert main(["figure", "figure4_gain", "--runs", str(path / "summary.json"), "--out", str(tmp_path / "f.png"),
                 "--values", str(tmp_path / "f.csv")]) == 2
    assert "metrics.probe_every" in capsys.readouterr().err and not (tmp_path / "f.png").exists()


def test_figure5_stands_beside_the_papers_569m_through_its_own_mapping(synthetic):
    """The paper's Figure 5 numbers are at 569M and 5.29B; the main mapping (tiny -> 1.67B) joins none of them, the
    Figure 5 mapping (tiny -> 569M) puts ours beside the 569M ones, labelled with our scale."""
    root = synthetic["root"]
    assert main(["all", "--results", str(root), "--scale-of", "tiny=1.67B", "--figure5-scale-of", "tiny=569M"]) == 0
    f5 = pd.read_csv(root / "report" / "figures" / "figure5_scales.csv")
    both = f5.dropna(subset=["ours", "paper"]).set_index(["method", "metric"])
    assert set(both["paper_scale"]) == {"569M"} and set(both["our_scale"]) == {"tiny"}
    assert both.loc[("stale", "final_train_loss"), "paper"] == 1.57 and both.loc[("stale", "gain_max"), "paper"] == 1.7
    assert f5[f5["paper_scale"] == "5.29B"]["ours"].isna().all()
    f1 = pd.read_csv(root / "report" / "figures" / "figure1_loss.csv")
    assert set(f1.dropna(subset=["ours"])["paper_scale"]) == {"1.67B"}  # the other figures keep the main mapping
    page = (root / "report" / "report.md").read_text()
    assert "ours at tiny beside the paper's 569M" in page


def test_page_labels_recorded_kernel_numbers_and_bounds(synthetic):
    root = synthetic["root"]
    assert main(["all", "--results", str(root), "--scale-of", "tiny=1.67B", "--recorded", str(RECORDED)]) == 0
    provenance = bench_provenance(RECORDED / "kernel_bench.md")
    label = (f"recorded on {provenance['gpu']} on {provenance['date']} at commit {provenance['commit']}, "
             "not measured by this run")
    for page in ((root / "report" / "report.md").read_text(),
                 htmllib.unescape((root / "report" / "index.html").read_text())):
        assert "No Hopper GPU" in page and label in page
        assert f"ours at {provenance['gpu']} beside the paper's H100" in page
        assert "≥ 0.99" in page and "a few channels' share" in page  # Figure 4: a lower bound, another statistic
        assert "≤ 1" in page and "≥ 1" in page  # the kernel's latency statements as bounds on the ratio
    kernel = pd.read_csv(root / "report" / "tables" / "kernel_latency.csv")
    assert set(kernel[kernel["section"] == "latency"]["source"]) == {label}
    # the recorded kernel profile: one line per method, its step's GPU time and its longest kernels
    profile = pd.read_csv(RECORDED / "kernel_profile.csv")
    page = (root / "report" / "report.md").read_text()
    assert "GPU time of one fwd+bwd by kernel" in page
    for method, kernels in profile.groupby("method"):
        longest = kernels.sort_values("ms_per_step").iloc[-1]
        assert f"{longest['kernel']} {longest['ms_per_step']:.3f}" in page
        assert f"{kernels['ms_per_step'].sum():.3f}".rstrip("0") in page


def test_gains_are_read_in_the_step_window(synthetic, tmp_path):
    """Figures 4/5 read gains at / over the first --gain-window steps (the paper's 6,000), and say which step."""
    runs = synthetic["runs"][synthetic["runs"]["variant"] == "base"]
    assert main(["figure", "figure4_gain", "--runs", *runs["summary"], "--gain-window", "20", "--out",
                 str(tmp_path / "f4.png"), "--values", str(tmp_path / "f4.csv"), "--scale-of", "tiny=1.67B"]) == 0
    f4 = pd.read_csv(tmp_path / "f4.csv").set_index(["method", "metric"])
    stale = runs[runs["method"] == "stale"]["records"]
    at20 = [[r for r in recs if r["kind"] == "gain" and r["layer"] == 7 and r["step"] == 20][0]["k_gain_max"]
            for recs in stale]
    assert f4.loc[("stale", "k_gain_max"), "ours"] == pytest.approx(np.mean(at20))
    assert f4.loc[("stale", "k_gain_max"), "window"] == "step 20 (window 20 of 40 steps)"
    assert main(["figure", "figure5_scales", "--runs", *runs["summary"], "--gain-window", "25", "--out",
                 str(tmp_path / "f5.png"), "--values", str(tmp_path / "f5.csv")]) == 0
    f5 = pd.read_csv(tmp_path / "f5.csv").dropna(subset=["ours"]).set_index(["method", "metric"])
    upto = [max(max(r["q_gain_max"], r["k_gain_max"]) for r in recs if r["kind"] == "gain" and r["step"] <= 25)
            for recs in stale]
    assert f5.loc[("stale", "gain_max"), "ours"] == pytest.approx(np.mean(upto))
    # the default window is longer than these runs: read at the end, and said so
    assert main(["figure", "figure4_gain", "--runs", *runs["summary"], "--out", str(tmp_path / "g.png"),
                 "--values", str(tmp_path / "g.csv")]) == 0
    assert set(pd.read_csv(tmp_path / "g.csv")["window"].dropna()) == {"step 40 (run end, within window 6000)"}
    assert main(["figure", "figure4_gain", "--runs", *runs["summary"], "--gain-window", "0", "--out",
                 str(tmp_path / "h.png"), "--values", str(tmp_path / "h.csv")]) == 2


def test_gain_table_covers_every_variant(synthetic, tmp_path):
    runs = synthetic["runs"]
    out = tmp_path / "gains.csv"
    assert main(["table", "gains", "--runs", *runs["summary"], "--gain-window", "30", "--out", str(out)]) == 0
    table = pd.read_csv(out).set_index(["variant", "size", "method"])
    assert set(table.index.get_level_values("variant")) == {"base", "nope"}
    recs = runs[(runs["variant"] == "nope") & (runs["method"] == "stale")]["records"]
    expected = np.mean([[r for r in rs if r["kind"] == "gain" and r["layer"] == 7 and r["step"] == 30][0]["k_gain_max"]
                        for rs in recs])
    assert table.loc[("nope", "tiny", "stale"), "k_gain_max"] == pytest.approx(expected)
    assert table.loc[("nope", "tiny", "stale"), "read_at"] == "step 30 of 40"


def test_kernel_figure_from_the_recorded_bench(tmp_path):
    """The kernel figure is drawn from the kernel table's latency rows; its numbers are the reference shape."""
    import json

    from deltamatch.reports.builders import kernel_from_files

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "hardware.json").write_text(json.dumps({"hopper": False, "device": None}))
    (tmp_path / "check.jsonl").write_text(json.dumps({"name": "fwd", "fp8_wgmma_dots": 2, "matmuls": 2}) + "\n")
    table = kernel_from_files(str(tmp_path / "check.jsonl"), str(tmp_path / "bench"), None, str(RECORDED))
    table.to_csv(tmp_path / "kernel.csv", index=False)
    assert main(["figure", "kernel", "--kernel-table", str(tmp_path / "kernel.csv"), "--out", str(tmp_path / "k.png"),
                 "--values", str(tmp_path / "k.csv")]) == 0
    assert _png(tmp_path / "k.png")
    numbers = pd.read_csv(tmp_path / "k.csv").set_index("method")
    bench = pd.read_csv(RECORDED / "kernel_bench.csv")
    ref = bench[(bench["head_dim"] == 128) & (bench["seq_len"] == 8192) & bench["causal"]].set_index("method")
    assert numbers.loc["matched", "fwd_bwd_tflops"] == pytest.approx(ref.loc["matched", "fwd_bwd_tflops"])
    assert set(numbers.index) == set(ref.index)


def test_context_gap_over_steps(tmp_path):
    """Each method's validation-loss gap to BF16 at every logged validation step; the first step above 0.01."""
    import json

    gaps = {"bf16": 0.0, "stale": 0.004, "matched": 0.0}
    paths = []
    for method, base in gaps.items():
        run = tmp_path / "results/x/runs/context_64k/tiny" / method / "s0"
        run.mkdir(parents=True)
        records = [{"kind": "val", "step": s, "loss": 3.0 - s / 1000 + base * s / 100} for s in (100, 200, 300, 400)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run / "summary.json").write_text(json.dumps({"final_val_loss": records[-1]["loss"], "method": method,
                                                      "size": "tiny", "seed": 0}))
        paths.append(str(run / "summary.json"))
    assert main(["figure", "context_gap", "--runs", *paths, "--out", str(tmp_path / "c.png"),
                 "--values", str(tmp_path / "c.csv")]) == 0
    assert _png(tmp_path / "c.png")
    numbers = pd.read_csv(tmp_path / "c.csv").set_index("method")
    assert numbers.loc["stale", "first_step_gap_above_0.01"] == 300  # 0.004 * 300 / 100 = 0.012 > 0.01
    assert numbers.loc["stale", "gap_at_last_step"] == pytest.approx(0.016)
    assert np.isnan(numbers.loc["matched", "first_step_gap_above_0.01"]) and numbers.loc["stale", "paper"] == 19000


def test_figure4_effects_reads_the_stale_delta_of_the_last_attention_layer(tmp_path):
    import json

    paths, expected = [], {}
    rng = np.random.default_rng(1)
    for method in ("bf16", "stale"):
        run = tmp_path / "results/x/runs/base/tiny" / method / "s0"
        run.mkdir(parents=True)
        records, shares = [], []
        for step in (10, 20, 30):
            for layer in (3, 7):
                for delta in ("stale", "consistent", "matched"):
                    record = {"kind": "residual", "step": step, "layer": layer, "delta": delta, "before_cast": 0.1}
                    if delta != "matched":
                        s = float(rng.uniform(0.3, 0.7))
                        record.update(sharpened=s, flattened=1 - s, push=[0.5, -0.5],
                                      push_consistency_per_channel=[0.2, 0.8], push_consistency=0.5)
                        if delta == "stale" and layer == 7:
                            shares.append(s)
                    records.append(record)
        expected[method] = np.mean(shares)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run / "summary.json").write_text(json.dumps({"final_val_loss": 3.0, "method": method, "size": "tiny",
                                                      "seed": 0}))
        paths.append(str(run / "summary.json"))
    assert main(["figure", "figure4_effects", "--runs", *paths, "--out", str(tmp_path / "e.png"),
                 "--values", str(tmp_path / "e.csv")]) == 0
    assert _png(tmp_path / "e.png")
    numbers = pd.read_csv(tmp_path / "e.csv").set_index("method")
    for method, share in expected.items():
        assert numbers.loc[method, "sharpened"] == pytest.approx(share)
    assert set(numbers["push_read_at_step"]) == {30} and set(numbers["delta"]) == {"stale"}
