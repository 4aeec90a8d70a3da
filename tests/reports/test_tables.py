"""Tables from synthetic pipeline outputs, checked against the numbers the fixture wrote (recomputed here)."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from deltamatch.reports import tables
from deltamatch.reports.cli import main
from deltamatch.reports.inputs import load_evals, load_recorded_kernel, load_summaries, run_tag
from deltamatch.reports.paper import load_paper

SCALE_OF = {"tiny": "1.67B"}
ALIASES = {"dm_ruler_8k": "ruler_8k"}


@pytest.fixture(scope="module")
def root():
    return Path(__file__).resolve().parents[2]


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
    # ours at tiny, the paper's at 1.67B: no difference, and the reason instead
    assert np.isnan(val.loc["matched", "difference"]) and val.loc["matched", "difference_note"] == \
        "not comparable (scale)"
    same = tables.main_table(load_summaries(list(runs["summary"])), load_evals([e["path"] for e in evals]), paper,
                             {"tiny": "tiny"}, ALIASES)
    assert same[same["metric"] == "val_ce"]["difference"].isna().all()  # nothing of the paper at "tiny" either
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


def test_kernel_table_without_and_with_hopper(paper):
    check = pd.DataFrame([{"name": "fwd", "fp8_wgmma_dots": 2, "matmuls": 2}])
    table = tables.kernel_table(check, None, None, {"hopper": False, "device": None}, paper)
    assert "no Hopper GPU" in table[table["section"] == "status"]["status"].item()
    claims = table[table["section"] == "paper"]
    assert claims["ours"].isna().all() and set(claims["paper_scale"]) == {"H100"}  # the paper's statements, alone
    bench = pd.DataFrame([{"method": m, "head_dim": 128, "seq_len": 8192, "causal": True, "fwd_bwd_ms": ms}
                          for m, ms in (("sdpa_cudnn_bf16", 2.0), ("sdpa_flash_bf16", 1.5), ("matched", 1.6))])
    table = tables.kernel_table(check, bench, None, {"hopper": True, "device": "H200"}, paper)
    assert "status" not in set(table["section"])
    latency = table[table["section"] == "latency"].set_index("method")
    assert latency.loc["matched", "speedup_vs_cudnn_bf16"] == pytest.approx(2.0 / 1.6)
    assert set(latency["source"]) == {"measured by this run on H200"}
    claims = table[table["section"] == "paper"].set_index("metric")
    # the paper: Delta-Matching's fwd+bwd above cuDNN BF16's (ratio ≥ 1) and below FlashAttention-3's (ratio ≤ 1)
    cudnn = claims.loc["fwd_bwd_ms_over_sdpa_cudnn_bf16_hd128"]
    assert cudnn["ours"] == pytest.approx(1.6 / 2.0) and cudnn["paper"] == 1.0 and cudnn["at_least"]
    assert np.isnan(cudnn["difference"]) and cudnn["seq_len"] == 8192  # a bound, on another GPU: no difference
    assert cudnn["difference_note"] == "not comparable (scale)"
    assert cudnn["paper_scale"] == "H100" and cudnn["our_scale"] == "H200"
    fa3 = claims.loc["fwd_bwd_ms_over_fa3_bf16_hd128"]
    assert fa3["bound"] and np.isnan(fa3["ours"]) and "FlashAttention-3" in fa3["note"]  # no FA3-class row here
    assert fa3["ours_note"] == "not measured: the FA3-class baseline (fa4_cute_bf16, flash-attn-4) did not run"
    assert "speedup_vs_fa3_class" not in latency
    flash = claims.loc["fwd_bwd_ms_over_sdpa_flash_bf16_hd128"]
    assert flash["ours"] == pytest.approx(1.6 / 1.5) and np.isnan(flash["paper"])


def test_the_fa3_class_baseline_stands_for_flashattention3(paper):
    """Where the bench timed flash-attn-4's CuTe-DSL kernels (``fa4_cute_bf16``), the paper's FlashAttention-3 claim
    gets our number (matched's fwd+bwd time over theirs, per shape) with a note naming what ran, and every method's
    latency row its speedup over them."""
    check = pd.DataFrame([{"name": "fwd", "fp8_wgmma_dots": 2, "matmuls": 2}])
    bench = pd.DataFrame([{"method": m, "head_dim": 128, "seq_len": n, "causal": True, "fwd_bwd_ms": ms * n / 8192}
                          for n in (8192, 16384)
                          for m, ms in (("sdpa_cudnn_bf16", 2.0), ("fa4_cute_bf16", 1.8), ("matched", 3.6),
                                        ("matched_factored", 2.4))])
    table = tables.kernel_table(check, bench, None, {"hopper": True, "device": "H200"}, paper)
    latency = table[(table["section"] == "latency") & (table["seq_len"] == 8192)].set_index("method")
    assert latency.loc["matched_factored", "speedup_vs_fa3_class"] == pytest.approx(1.8 / 2.4)
    assert latency.loc["fa4_cute_bf16", "speedup_vs_fa3_class"] == pytest.approx(1.0)
    claims = table[(table["section"] == "paper") & (table["metric"] == "fwd_bwd_ms_over_fa3_bf16_hd128")]
    assert sorted(claims["seq_len"]) == [8192, 16384] and claims["ours"].to_numpy() == pytest.approx([2.0, 2.0])
    assert set(claims["ours_note"]) == {tables.FA3_CLASS_NOTE} and set(claims["paper"]) == {1.0}


def test_kernel_memory_beside_the_papers_ds_workspace(paper):
    """The kernel repository's backward (its README, not the paper's text) keeps an N×N E4M3 dS workspace, B·H·N²
    bytes (1 GiB at B=1, H=16, N=8192); ours is the
    whole backward's peak extra memory, beside that workspace as stated and by its formula at our shapes."""
    stated = paper[(paper["artefact"] == "kernel") & (paper["metric"] == "ds_workspace_gib_b1_h16_n8192")]
    assert stated["value"].item() == tables.ds_workspace_gib(1, 16, 8192) == 1.0
    check = pd.DataFrame([{"name": "fwd", "fp8_wgmma_dots": 2, "matmuls": 2}])
    memory = pd.DataFrame([{"method": m, "seq_len": n, "heads": 16, "head_dim": 128, "causal": True,
                            "peak_extra_backward_gib": gib}
                           for m, n, gib in (("matched", 16384, 0.25), ("stale", 16384, 0.3), ("matched", 8192, 0.1))])
    table = tables.kernel_table(check, None, memory, {"hopper": True, "device": "H200"}, paper)
    rows = table[(table["section"] == "paper") & (table["metric"] == "backward_extra_gib")].set_index("seq_len")
    assert rows.loc[16384, "paper"] == 4.0 and rows.loc[16384, "ours"] == 0.25 and rows.loc[16384, "at_least"]
    assert rows.loc[8192, "paper"] == 1.0 and rows.loc[8192, "ours"] == 0.1 and "as stated" in rows.loc[8192, "note"]
    assert set(rows["our_scale"]) == {"H200"} and set(rows["paper_scale"]) == {"H100"}
    assert all(n.startswith("kernel repository (not the paper)") for n in rows["note"])
    assert stated["source"].item() == "kernel repository README"


def _recorded(folder, gpu="NVIDIA H200", date="2026-11-29 10:12 UTC", commit="6452f11"):
    """A folder as dm-kernel-bench --memory writes it (kernels/bench.py: CSV, and Markdown with the header line)."""
    folder.mkdir(parents=True, exist_ok=True)
    bench = pd.DataFrame([{"method": m, "head_dim": 128, "seq_len": 4096, "batch": 4, "heads": 16, "causal": True,
                           "fwd_ms": ms / 3, "fwd_bwd_ms": ms}
                          for m, ms in (("sdpa_cudnn_bf16", 2.0), ("matched", 3.0))])
    memory = pd.DataFrame([{"method": "matched", "seq_len": 16384, "heads": 16, "head_dim": 128, "causal": True,
                            "peak_extra_backward_gib": 0.25}])
    header = f"date {date}, commit {commit}, GPU {gpu}, torch 2.11.0+cu130; B·H = 64, bf16 inputs"
    profile = pd.DataFrame([{"method": m, "kernel": k, "calls_per_step": 1.0, "ms_per_step": ms}
                            for m, k, ms in (("matched", "_attn_bwd_dkdv", 2.0), ("matched", "_attn_fwd", 0.5),
                                             ("matched", "_attn_bwd_delta", 0.4), ("matched", "_attn_bwd_dq", 0.9),
                                             ("matched", "_quant_pass_kernel", 0.1),
                                             ("sdpa_cudnn_bf16", "cudnn_flash_bprop", 1.5))])
    for name, frame, title in (("kernel_bench", bench, "Kernel benchmark"),
                               ("kernel_memory", memory, "Backward memory"),
                               ("kernel_profile", profile, "Kernel time per step")):
        frame.to_csv(folder / f"{name}.csv", index=False)
        (folder / f"{name}.md").write_text(f"# {title}\n\n{header}\n\n" + frame.to_markdown(index=False) + "\n")
    return bench, memory


def test_kernel_table_falls_back_to_recorded_measurements(synthetic, tmp_path, paper):
    """No Hopper GPU ran the bench: the recorded files stand in, every row saying where, when and at which commit."""
    recorded = tmp_path / "recorded"
    bench, _ = _recorded(recorded, gpu="NVIDIA H200", commit="abc1234")
    kernel = synthetic["root"] / "kernel"
    out = tmp_path / "kernel.csv"
    assert main(["table", "kernel", "--check", str(kernel / "check.jsonl"), "--bench", str(kernel / "bench"),
                 "--recorded", str(recorded), "--out", str(out)]) == 0
    table = pd.read_csv(out)
    label = "recorded on NVIDIA H200 on 2026-11-29 10:12 UTC at commit abc1234, not measured by this run"
    latency = table[table["section"] == "latency"].set_index("method")
    assert latency.loc["matched", "fwd_bwd_ms"] == 3.0 and set(latency["source"]) == {label}
    assert set(table[table["section"] == "memory"]["source"]) == {label}
    profile = table[table["section"] == "profile"]
    assert set(profile["source"]) == {label} and len(profile) == 6
    assert label in table[table["section"] == "status"]["status"].item()
    assert "no Hopper GPU" in table[table["section"] == "status"]["status"].item()
    claim = table[(table["section"] == "paper") & (table["metric"] == "fwd_bwd_ms_over_sdpa_cudnn_bf16_hd128")]
    assert claim["ours"].item() == pytest.approx(1.5) and claim["our_scale"].item() == "NVIDIA H200"
    assert claim["source"].item() == label
    # without --recorded: nothing but the statement that nothing was measured
    assert main(["table", "kernel", "--check", str(kernel / "check.jsonl"), "--bench", str(kernel / "bench"),
                 "--out", str(out)]) == 0
    assert "latency" not in set(pd.read_csv(out)["section"])
    # a Hopper GPU that measured wins over the recorded files
    (kernel / "bench" / "hardware.json").write_text('{"hopper": true, "device": "NVIDIA H100", "capability": "sm90"}')
    bench.assign(fwd_bwd_ms=bench["fwd_bwd_ms"] * 2).to_csv(kernel / "bench" / "kernel_bench.csv", index=False)
    assert main(["table", "kernel", "--check", str(kernel / "check.jsonl"), "--bench", str(kernel / "bench"),
                 "--recorded", str(recorded), "--out", str(out)]) == 0
    latency = pd.read_csv(out).query("section == 'latency'").set_index("method")
    assert latency.loc["matched", "fwd_bwd_ms"] == 6.0
    assert set(latency["source"]) == {"measured by this run on NVIDIA H100"}


def test_recorded_measurements_need_their_provenance(tmp_path):
    folder = tmp_path / "recorded"
    _recorded(folder)
    (folder / "kernel_bench.md").write_text("# Kernel benchmark\n\nsome numbers\n")
    with pytest.raises(ValueError, match="kernel_bench.md: no 'date"):
        load_recorded_kernel(folder)
    assert load_recorded_kernel(tmp_path) is None  # no kernel_bench.csv: nothing recorded


def test_the_repos_recorded_h200_measurements_parse(root):
    recorded = load_recorded_kernel(root / "benchmarks" / "results")
    for key in ("bench", "memory"):
        provenance = recorded["provenance"][key]
        assert provenance["gpu"] and provenance["date"] and re.fullmatch(r"[0-9a-f]{7,40}", provenance["commit"])
        assert not recorded[key].empty


def test_sweep_table_puts_table9_beside_ours(synthetic, paper):
    sweep = synthetic["sweep"]
    table = tables.sweep_table(sweep, paper)
    ours = table.dropna(subset=["ours"]).set_index(["metric", "inputs", "spread", "method"])
    for row in sweep.itertuples():
        assert ours.loc[(row.metric, row.inputs, row.spread, row.method), "ours"] == pytest.approx(row.value)
    assert len(ours) == len(sweep) and set(ours["our_scale"]) == {"random heads"}
    stale = ours.xs(("rowsum_before_cast", "stale"), level=["metric", "method"])
    assert (stale["paper"] == 1.1e-2).all() and len(stale) == 4  # beside every input family and spread
    matched = ours.xs(("rowsum_after_cast", "matched"), level=["metric", "method"])
    assert (matched["paper"] == 2.7e-3).all() and set(matched["paper_scale"]) == {"1.67B"}
    assert ours.xs("dk_colsum", level="metric")["paper"].isna().all()  # no paper value: none invented
    # the paper's consistent-dO values stay although this sweep ran no consistent-dO
    alone = table[table["ours"].isna()].set_index(["metric", "method"])
    assert alone.loc[("rowsum_before_cast", "consistent"), "paper"] == 2.5e-3
    assert list(table["metric"].drop_duplicates()[:2]) == ["rowsum_before_cast", "rowsum_after_cast"]


def test_main_table_checks_every_commonsense_task_within_one_point(synthetic, paper, tmp_path):
    runs, evals = _base(synthetic)
    rng = np.random.default_rng(1)
    accs = {(m, s): {t: rng.uniform(0.3, 0.7) for t in ("piqa", "boolq", "arc_easy")}
            for m in ("bf16", "stale", "matched") for s in (0, 1)}
    paths = []
    for (method, seed), tasks in accs.items():
        path = tmp_path / "results" / "evals" / "base" / "tiny" / method / f"s{seed}" / "commonsense.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"suite": "commonsense", "average": float(np.mean(list(tasks.values()))),
                                    "tasks": {**{t: {"acc": a} for t, a in tasks.items()},
                                              "wikitext": {"word_perplexity": 30.0 + seed}},
                                    "metric_per_task": {t: "acc" for t in tasks}}))
        paths.append(str(path))
    table = tables.main_table(load_summaries(list(runs["summary"])),
                              load_evals([e["path"] for e in evals] + paths), paper, SCALE_OF, ALIASES)
    row = table[table["metric"] == "commonsense_max_task_gap_to_bf16"].set_index("method").loc["matched"]
    expected = max(abs(np.mean([accs["matched", s][t] for s in (0, 1)]) - np.mean([accs["bf16", s][t] for s in (0, 1)]))
                   for t in ("piqa", "boolq", "arc_easy"))
    assert row["ours"] == pytest.approx(100 * expected)  # in points, as the paper's "one point"
    assert row["paper"] == 1.0 and row["bound"] and row["seeds"] == 2 and row["our_scale"] == "tiny"
    assert "within one point" in row["note"]
    # without commonsense evals the paper's claim stands alone
    alone = tables.main_table(load_summaries(list(runs["summary"])), load_evals([e["path"] for e in evals]), paper,
                              SCALE_OF, ALIASES)
    assert np.isnan(alone[alone["metric"] == "commonsense_max_task_gap_to_bf16"]["ours"].item())


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
    """The tiny default has one attention layer: it appears once (as ``last``), not also as ``all_but_last`` and
    ``layer 7``; the paper's all_but_last rows stand alone, saying why ours is missing."""
    probes = synthetic["probes"]
    single = probes[probes["layer"] == 7]
    table = tables.probe_table(single, "tiny", paper, SCALE_OF)
    ours = table[table["ours"].notna()]
    assert set(ours["layers"]) == {"last"} and set(ours["layer_ids"]) == {"7"}
    assert len(ours) == 9  # 3 δ kinds x 3 measures, each once
    rows = table.set_index(["layers", "method", "metric"])
    value = single[single["delta"] == "matched"]["before_cast"].item()
    assert rows.loc[("last", "matched", "before_cast"), "ours"] == pytest.approx(value)
    alone = rows.loc[("all_but_last", "matched", "before_cast")]
    assert np.isnan(alone["ours"]) and alone["paper"] == 1.4e-7
    assert alone["ours_note"] == "not measured: the tiny model has one attention layer (layer 7)"


def test_probe_table_shows_each_layer_once_under_its_own_name(synthetic, paper):
    probes = synthetic["probes"]  # layers 3, 7, 11
    table = tables.probe_table(probes, "tiny", paper, SCALE_OF)
    per_layer = table[table["ours"].notna() & (table["layers"] != "all_but_last")]
    assert sorted(set(per_layer["layers"])) == ["last", "layer 3", "layer 7"]
    assert set(per_layer[per_layer["layers"] == "last"]["layer_ids"]) == {"11"}
    assert "layer 11" not in set(table["layers"])
    two = probes[probes["layer"] != 3]  # two layers: all_but_last is layer 7 alone, not repeated as "layer 7"
    assert set(tables.probe_table(two, "tiny", paper, SCALE_OF)["layers"]) == {"all_but_last", "last"}


def test_a_nan_in_any_seed_is_a_nan_with_its_reason(synthetic, paper):
    """A NaN eval metric of one seed makes the mean NaN (not the other seed's value) and says so."""
    runs, evals = _base(synthetic)
    summaries = load_summaries(list(runs["summary"]))
    long = load_evals([e["path"] for e in evals])
    hit = (long["method"] == "stale") & (long["seed"] == 0) & (long["metric"] == "heldout:word_perplexity")
    long.loc[hit, "value"] = float("nan")
    table = tables.main_table(summaries, long, paper, SCALE_OF, ALIASES).set_index(["method", "metric"])
    row = table.loc[("stale", "heldout:word_perplexity")]
    assert np.isnan(row["ours"]) and row["ours_note"] == "NaN in 1 of 2 runs' results"
    assert table.loc[("bf16", "heldout:word_perplexity"), "ours_note"] == ""


def test_difference_only_for_the_same_statistic_at_the_same_scale():
    frame = pd.DataFrame({"paper": [1.0, 1.0, 1.0, 1.0, None], "ours": [1.5, 1.5, 1.5, 1.5, 2.0],
                          "paper_scale": ["1.67B", "1.67B", "1.67B", "1.67B", "1.67B"],
                          "our_scale": ["1.67B", "tiny", "1.67B", "1.67B", "1.67B"],
                          "bound": [False, False, True, False, False], "note": ["", "", "", "another one", ""]})
    out = tables.comparable_difference(frame)
    assert out["difference"].iloc[0] == 0.5 and out["difference"].iloc[1:].isna().all()
    assert list(out["difference_note"]) == ["", "not comparable (scale)", "not comparable (bound)",
                                            "not comparable (statistic)", ""]


def test_a_run_that_stopped_on_a_nan_is_marked_in_the_tables(synthetic, paper, tmp_path):
    """A summary with ``diverged_at_step`` (dm-train's on_nonfinite: stop) shows up as its own row beside its CE."""
    runs, evals = _base(synthetic)
    paths = list(runs["summary"])
    stopped = json.loads(Path(paths[0]).read_text())
    stopped["diverged_at_step"] = 7
    folder = tmp_path / Path(paths[0]).relative_to(Path(paths[0]).parents[5])
    folder.parent.mkdir(parents=True)
    folder.write_text(json.dumps(stopped))
    summaries = load_summaries([str(folder), *paths[1:]])
    table = tables.main_table(summaries, load_evals([e["path"] for e in evals]), paper, SCALE_OF, ALIASES)
    marked = table[table["metric"] == "diverged_at_step"]
    assert list(marked["method"]) == [stopped["method"]] and list(marked["ours"]) == [7.0]
    assert list(marked["seeds"]) == [1]
    clean = tables.main_table(load_summaries(paths), load_evals([e["path"] for e in evals]), paper, SCALE_OF, ALIASES)
    assert "diverged_at_step" not in set(clean["metric"])
