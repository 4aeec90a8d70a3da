"""The paper's reported values (``paper_reported.yaml``), as a tidy frame the tables join against."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

PAPER_YAML = Path(__file__).with_name("paper_reported.yaml")
PAPER_COLUMNS = ["artefact", "scale", "variant", "method", "metric", "layers", "value", "approx", "bound", "at_least",
                 "note"]
# Flags on a paper value: read off a figure (≈), an upper bound the paper states (≤), a lower bound (≥).
FLAGS = ("approx", "bound", "at_least")


def load_paper(path: str | Path = PAPER_YAML) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Return (values, claims, citation). ``values`` has every column of PAPER_COLUMNS (missing fields filled)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"paper values file not found: {path}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in ("values", "claims", "citation"):
        if key not in data:
            raise ValueError(f"{path}: missing top-level key {key!r}")
    values = pd.DataFrame(data["values"])
    unknown = set(values.columns) - set(PAPER_COLUMNS)
    if unknown:
        raise ValueError(f"{path}: unknown fields {sorted(unknown)} in 'values'")
    defaults = {"variant": "base", "layers": "", "approx": False, "bound": False, "at_least": False, "note": ""}
    for column in PAPER_COLUMNS:
        if column not in values:
            values[column] = defaults.get(column)
        elif column in defaults:
            values[column] = values[column].fillna(defaults[column])
    values["value"] = values["value"].astype(float)
    return values[PAPER_COLUMNS], pd.DataFrame(data["claims"]), data["citation"]


def paper_values(values: pd.DataFrame, artefact: str) -> pd.DataFrame:
    """The rows of one artefact, renamed for joining: ``scale`` -> ``paper_scale``, ``value`` -> ``paper``."""
    rows = values[values["artefact"] == artefact].drop(columns="artefact")
    return rows.rename(columns={"scale": "paper_scale", "value": "paper"}).reset_index(drop=True)
