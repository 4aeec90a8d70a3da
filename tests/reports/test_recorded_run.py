"""A GPU pipeline run recorded earlier (benchmarks/results/h200_pipeline/<date>) in its own section of the report,
checked against the recorded files read independently (json, csv, statistics), not through the report's own loaders."""

import csv
import json
import shutil
import statistics
from pathlib import Path

import pandas as pd
import pytest

from deltamatch.reports.cli import main
from deltamatch.reports.inputs import load_recorded_run

ROOT = Path(__file__).resolve().parents[2]
RECORDED_RUN = ROOT / "benchmarks" / "results" / "h200_pipeline" / "2026-12-01"
METHODS = ["bf16", "stale", "consistent", "matched", "cudnn_fp8"]


def _runs_dir(method):
    return RECORDED_RUN / "results" / "runs" / "base" / "569M" / method / "s0"


def test_the_run_table_is_what_the_recorded_files_say(tmp_path):
    out = tmp_path / "recorded_run.csv"
    assert main(["table", "recorded_run", "--recorded-run", str(RECORDED_RUN), "--out", str(out)]) == 0
    table = pd.read_csv(out).set_index("method")
    assert list(table.index) == METHODS  # the registry's method order
    expected_backend = {"bf16": "sdpa", "stale": "triton", "consistent": "triton", "matched": "triton",
                        "cudnn_fp8": "cudnn"}
    for method in METHODS:
        summary = json.loads((_runs_dir(method) / "summary.json").read_text())
        records = [json.loads(line) for line in (_runs_dir(method) / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in records if r["kind"] == "train"]
        row = table.loc[method]
        assert row["attention_backend"] == expected_backend[method] and row["gdn_backend"] == "fla"
        assert row["val_ce"] == pytest.approx(summary["final_val_loss"], rel=1e-12)
        assert row["steps"] == summary["steps"] == len(train)
        assert row["tokens_per_s"] == pytest.approx(statistics.median(r["tokens_per_s"] for r in train[10:]))
        assert row["peak_gib"] == pytest.approx(max(r["peak_mem_bytes"] for r in train) / 2**30)
        assert row["final_train_loss"] == pytest.approx(statistics.mean(r["loss"] for r in train[-6:]))
        assert row["wall_s"] == pytest.approx(summary["wall_s"])
        gains = [r for r in records if r["kind"] == "gain"]
        last = max(gains, key=lambda r: (r["layer"], r["step"]))
        assert row["key_gain_last_layer"] == pytest.approx(last["k_gain_max"])
    assert table["source"].str.contains("recorded on NVIDIA H200 on 2026-12-01 at commit b77f2be").all()
    assert table["source"].str.endswith("not measured by this run").all()


def test_the_probe_table_stands_beside_the_papers_table9(tmp_path):
    out = tmp_path / "probes.csv"
    assert main(["table", "recorded_probes", "--recorded-run", str(RECORDED_RUN), "--out", str(out)]) == 0
    table = pd.read_csv(out)
    with open(RECORDED_RUN / "results" / "probes" / "base" / "569M" / "bf16" / "s0.csv") as fh:
        probed = list(csv.DictReader(fh))
    last = [r for r in probed if r["layer"] == "15"]
    for row in last:
        ours = table[(table["layers"] == "last") & (table["method"] == row["delta"])
                     & (table["metric"] == "before_cast")]
        assert ours["ours"].item() == pytest.approx(float(row["before_cast"]))
    stale = table[(table["layers"] == "all_but_last") & (table["method"] == "stale")
                  & (table["metric"] == "before_cast")]
    assert stale["paper"].item() == pytest.approx(1.1e-2) and stale["paper_scale"].item() == "1.67B"
    assert stale["ours"].item() == pytest.approx(statistics.mean(
        float(r["before_cast"]) for r in probed if r["delta"] == "stale" and r["layer"] != "15"))


def test_the_page_gives_the_section_its_label_once(synthetic):
    root = synthetic["root"]
    assert main(["all", "--results", str(root), "--recorded-run", str(RECORDED_RUN)]) == 0
    page = (root / "report" / "report.md").read_text()
    section = page.split("## Recorded GPU run (not measured by this run)", 1)[1].split("\n## ", 1)[0]
    label = "recorded on NVIDIA H200 on 2026-12-01 at commit b77f2be (config/h200.yaml), not measured by this run"
    assert section.count(label) == 1 and "| source" not in section  # said once, above the section, not per row
    assert "![recorded_run](figures/recorded_run.png)" in section and "cudnn" in section
    assert (root / "report" / "figures" / "recorded_run.png").stat().st_size > 10_000
    # this run's own tables and the claims never take the recorded numbers
    main_table = pd.read_csv(root / "report" / "tables" / "main_1p67b.csv")
    measured = main_table.dropna(subset=["ours"])
    assert set(measured["our_scale"]) == {"tiny"} and set(measured["method"]) == {"bf16", "stale", "matched"}
    claims = pd.read_csv(root / "report" / "claims.csv")
    assert "569M" not in set(claims["our_scale"].dropna()) and "H200" not in set(claims["our_scale"].dropna())


@pytest.mark.parametrize("damage, named", [
    (lambda d: (d / "provenance.json").unlink(), "provenance.json"),
    (lambda d: (d / "provenance.json").write_text(json.dumps({"date": "2026-12-01", "gpu": "H200"})),
     "['commit', 'config', 'command']"),
    (lambda d: shutil.rmtree(d / "results" / "runs"), "no runs/<variant>/<size>/<method>/s<seed>/summary.json"),
])
def test_a_damaged_recorded_run_is_refused_naming_what_is_missing(tmp_path, capsys, damage, named):
    copy = tmp_path / "recorded"
    shutil.copytree(RECORDED_RUN, copy)
    damage(copy)
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        load_recorded_run(copy)
    assert main(["table", "recorded_run", "--recorded-run", str(copy), "--out", str(tmp_path / "x.csv")]) == 2
    assert named in capsys.readouterr().err and not (tmp_path / "x.csv").exists()


def test_the_option_is_required():
    assert main(["figure", "recorded_run", "--out", "x.png", "--values", "x.csv"]) == 2


def test_the_run_table_of_this_pipelines_runs_leaves_out_what_a_cpu_does_not_record(synthetic, tmp_path):
    """The synthetic runs: CPU-like records (no MFU, zero peak memory) and summaries without ``backends``."""
    runs = [str(p) for p in sorted(synthetic["root"].glob("runs/*/*/*/s*/summary.json"))]
    out = tmp_path / "runs.csv"
    assert main(["table", "runs", "--runs", *runs, "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert len(table) == len(runs) and "mfu_percent" not in table and "peak_gib" not in table
    assert set(table["attention_backend"]) == {"not recorded"}
    one = table[(table["variant"] == "base") & (table["method"] == "stale") & (table["seed"] == 1)].iloc[0]
    records = [json.loads(line) for line in (Path(runs[0]).parents[2] / "stale" / "s1" / "metrics.jsonl")
               .read_text().splitlines()]
    train = {r["step"]: r for r in records if r["kind"] == "train"}  # a resumed step: its last record counts
    assert one["final_train_loss"] == pytest.approx(statistics.mean(train[s]["loss"] for s in sorted(train)[-4:]))
    last = max((r for r in records if r["kind"] == "gain"), key=lambda r: (r["layer"], r["step"]))
    assert one["key_gain_last_layer"] == pytest.approx(last["k_gain_max"])
