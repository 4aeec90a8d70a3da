"""The claims table: every claim of paper_reported.yaml has a check; each verdict follows its stated rule from the
report's own tables (built here by hand with known numbers)."""

import pandas as pd
import pytest

from deltamatch.reports import claims as C
from deltamatch.reports.paper import load_paper


def _scale(rows):
    return pd.DataFrame([{"paper_scale": s, "metric": "val_ce", "method": m, "ours": v, "our_scale": s, "ours_note": ""}
                         for s, m, v in rows])


def test_every_claim_has_a_check_and_nothing_measured_says_so():
    _, claims, _ = load_paper()
    table = C.claims_table(claims, {})
    assert list(table["id"]) == list(claims["id"])
    assert set(table["verdict"]) == {C.NOT_MEASURED}
    assert (table["why"].str.len() > 0).all()
    bad = claims.assign(id="no_such_check")
    with pytest.raises(ValueError, match="no check"):
        C.claims_table(bad.head(1), {})


def test_parity_and_stale_growth_verdicts_follow_scale():
    tiny = _scale([("tiny", "bf16", 5.0), ("tiny", "matched", 5.005), ("tiny", "stale", 5.03)])
    ours, scale, verdict, _ = C.CHECKS["parity"]({"scale": tiny})
    assert verdict == C.SMALLER and scale == "tiny" and "+0.005" in ours
    far = _scale([("tiny", "bf16", 5.0), ("tiny", "matched", 5.03)])
    assert C.CHECKS["parity"]({"scale": far})[2] == C.NOT_SEEN
    # at the paper's scale the same gap is a contradiction, a gap within 0.0025 a reproduction
    assert C.CHECKS["parity"]({"scale": _scale([("1.67B", "bf16", 1.4), ("1.67B", "matched", 1.43)])})[2] == \
        C.CONTRADICTED
    assert C.CHECKS["parity"]({"scale": _scale([("1.67B", "bf16", 1.4), ("1.67B", "matched", 1.401)])})[2] == \
        C.REPRODUCED
    # one size: growth is not measured; two sizes, growing: consistent at the paper's scales -> reproduced
    assert C.CHECKS["stale_gap_grows"]({"scale": tiny})[2] == C.NOT_MEASURED
    two = _scale([("569M", "bf16", 1.52), ("569M", "stale", 1.54), ("1.67B", "bf16", 1.41), ("1.67B", "stale", 1.9)])
    assert C.CHECKS["stale_gap_grows"]({"scale": two})[2] == C.REPRODUCED


def test_table9_uses_the_summary_rows_and_skips_rows_not_measured():
    rows = [{"layers": "last", "method": m, "metric": "before_cast", "ours": v, "our_scale": "tiny", "ours_note": ""}
            for m, v in (("stale", 1e-2), ("consistent", 3e-3), ("matched", 1e-7))]
    rows += [{"layers": "all_but_last", "method": m, "metric": "before_cast", "ours": float("nan"), "our_scale": None,
              "ours_note": "not measured: the tiny model has one attention layer (layer 3)"}
             for m in ("stale", "consistent", "matched")]
    ours, scale, verdict, _ = C.CHECKS["table9_residuals"]({"table9_probes": pd.DataFrame(rows)})
    assert verdict == C.SMALLER and scale == "tiny checkpoint" and "matched 1.00e-07" in ours


def test_kernel_claims_name_the_hardware_and_what_is_not_benchmarked():
    kernel = pd.DataFrame([{"section": "paper", "metric": f"fwd_bwd_ms_over_{b}_hd128", "method": "matched",
                            "ours": r, "our_scale": "NVIDIA H200", "ours_note": "", "seq_len": 8192}
                           for b, r in (("sdpa_cudnn_bf16", 1.7), ("sdpa_flash_bf16", 1.1))])
    assert C.CHECKS["slower_than_cudnn"]({"kernel_latency": kernel})[2] == C.OTHER_HARDWARE
    ours, _, verdict, why = C.CHECKS["faster_than_fa3"]({"kernel_latency": kernel})
    assert verdict == C.NOT_MEASURED and "FlashAttention-3" in why and "1.1" in ours


def test_the_fa3_claim_is_read_from_the_fa3_class_baseline():
    """With the FA3-class baseline timed, the claim "faster than FlashAttention-3 BF16" reads matched's time over it
    at every shape (contradicted where any is ≥ 1), and names matched_factored's ratio beside it."""
    paper = [{"section": "paper", "metric": "fwd_bwd_ms_over_fa3_bf16_hd128", "method": "matched", "ours": r,
              "our_scale": "NVIDIA H200", "ours_note": "", "seq_len": n} for n, r in ((8192, 1.9), (16384, 1.7))]
    latency = [{"section": "latency", "method": "matched_factored", "head_dim": 128, "seq_len": n,
                "speedup_vs_fa3_class": s} for n, s in ((8192, 0.8), (16384, 0.86))]
    ours, scale, verdict, why = C.CHECKS["faster_than_fa3"]({"kernel_latency": pd.DataFrame(paper + latency)})
    assert verdict == C.CONTRADICTED and scale == "NVIDIA H200" and "flash-attn-4" in why
    assert "1.7" in ours and "1.9" in ours and "matched_factored (the CUDA kernels) 1.163–1.25×" in ours
    faster = [{**row, "ours": 0.9} for row in paper]
    assert C.CHECKS["faster_than_fa3"]({"kernel_latency": pd.DataFrame(faster)})[2] == C.OTHER_HARDWARE


def test_a_climb_is_read_against_bf16_on_the_same_batches():
    def fig(stale, bf16):
        return {"figure1_loss": pd.DataFrame([{"method": m, "metric": "train_loss_rise", "ours": v,
                                               "our_scale": "tiny", "ours_note": ""}
                                              for m, v in (("stale", stale), ("bf16", bf16))])}
    assert C.CHECKS["stale_climbs"](fig(0.12, 0.12))[2] == C.NOT_SEEN  # both "rise" by batch noise alone
    assert C.CHECKS["stale_climbs"](fig(0.30, 0.12))[2] == C.SMALLER


def test_the_verdicts_are_counted_above_the_table():
    from deltamatch.reports.render import verdict_summary

    frame = pd.DataFrame({"verdict": [C.NOT_MEASURED, C.SMALLER, C.NOT_MEASURED, C.NOT_SEEN]})
    assert verdict_summary(frame) == ("4 claims: 1 consistent at smaller scale, 1 not seen at smaller scale, "
                                      "2 not measured here.")
