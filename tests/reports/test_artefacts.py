"""The artefact registry (reports/artefacts.py) is the one list of the report's tables and figures: dm-report, the page
and the workflow read it; adding a table is its builder and one entry."""

import pandas as pd
import pytest

from deltamatch.reports import artefacts, builders
from deltamatch.reports.cli import main
from deltamatch.reports.render import sections

PAGE_ORDER = ["main_1p67b", "scale", "figure1_loss", "figure4_gain", "figure5_scales", "context_gap", "gains",
              "table9_probes", "ablations", "runs", "sweep", "kernel_latency", "recorded_run"]


def test_every_entry_has_its_builder_and_the_page_follows_the_registry():
    for artefact in artefacts.ARTEFACTS:
        assert callable(getattr(builders, artefact.builder)), artefact.builder
    page = sections()
    assert list(page) == PAGE_ORDER
    assert page["figure1_loss"].parts == ("figure1_final",) and page["kernel_latency"].parts == ("kernel",)
    assert page["sweep"].parts == ()  # the sweep figure shares its section's stem
    assert page["recorded_run"].parts == ("recorded_run_probes",)  # its figure shares the section's stem
    assert all(s.title for s in page.values())


def test_the_config_key_enables_an_artefact():
    probes, kernel = artefacts.by_stem("table", "table9_probes"), artefacts.by_stem("figure", "kernel")
    assert artefacts.enabled(probes, {"probe": {"enabled": True}})
    assert not artefacts.enabled(probes, {"probe": {"enabled": False}}) and not artefacts.enabled(kernel, {})
    assert artefacts.enabled(artefacts.by_stem("table", "main_1p67b"), {})


def test_a_table_added_to_the_registry_reaches_the_cli_and_the_page(synthetic, monkeypatch, tmp_path):
    toy = artefacts.Artefact("toy_counts", "table", "toy_counts", ("runs",), "all", command="toy",
                             title="Toy counts", about="Runs per method.", claim_key="toy")
    monkeypatch.setattr(artefacts, "ARTEFACTS", (*artefacts.ARTEFACTS, toy))
    monkeypatch.setattr(builders, "toy_counts", lambda i, paper: i.runs.groupby("method").size().reset_index(name="n"),
                        raising=False)
    runs = [str(p) for p in sorted(synthetic["root"].glob("runs/base/*/*/s*/summary.json"))]
    out = tmp_path / "toy_counts.csv"
    assert main(["table", "toy", "--runs", *runs, "--out", str(out)]) == 0
    counts = pd.read_csv(out).set_index("method")["n"]
    assert counts.to_dict() == {m: 2 for m in ("bf16", "matched", "stale")}  # the synthetic folder: 3 methods x 2 seeds
    assert main(["all", "--results", str(synthetic["root"])]) == 0  # dm-report all builds every entry it can
    page = (synthetic["root"] / "report" / "report.md").read_text()
    assert "## Toy counts" in page and "Runs per method." in page
    assert (synthetic["root"] / "report" / "tables" / "toy_counts.csv").is_file()


def test_a_missing_input_is_named(capsys):
    assert main(["table", "probes", "--out", "x.csv"]) == 2
    assert "table probes needs --probes and --size" in capsys.readouterr().err


@pytest.mark.parametrize("fields, problem", [
    (dict(kind="chart"), "kind"),
    (dict(inputs=("runs", "logs")), "unknown"),
    (dict(runs=None), "exactly when it reads runs"),
])
def test_a_malformed_entry_is_refused(fields, problem):
    base = dict(name="x", kind="table", builder="x", inputs=("runs",), runs="all")
    with pytest.raises(ValueError, match=problem):
        artefacts.Artefact(**{**base, **fields})
