"""The paper's reported values (``paper_reported.yaml``), as a tidy frame the tables join against."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

PAPER_YAML = Path(__file__).with_name("paper_reported.yaml")
PAPER_COLUMNS = ["artefact", "scale", "variant", "method", "metric", "layers", "value", "approx", "bound", "at_least",
                 "note", "source"]
CLAIM_COLUMNS = ["id", "artefact", "scale", "paper", "text", "source"]
# Flags on a paper value: read off a figure (≈), an upper bound the paper states (≤), a lower bound (≥).
FLAGS = ("approx", "bound", "at_least")


def load_paper(path: str | Path = PAPER_YAML) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Return (values, claims, citation). ``values`` has every column of PAPER_COLUMNS, ``claims`` every column of
    CLAIM_COLUMNS (missing fields filled; ``source`` defaults to ``paper``)."""
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
    defaults = {"variant": "base", "layers": "", "approx": False, "bound": False, "at_least": False, "note": "",
                "source": "paper"}
    for column in PAPER_COLUMNS:
        if column not in values:
            values[column] = defaults.get(column)
        elif column in defaults:
            values[column] = values[column].fillna(defaults[column])
    values["value"] = values["value"].astype(float)
    claims = pd.DataFrame(data["claims"])
    unknown = set(claims.columns) - set(CLAIM_COLUMNS)
    missing = {"id", "artefact", "text"} - set(claims.columns)
    if unknown or missing:
        raise ValueError(f"{path}: 'claims' has unknown fields {sorted(unknown)} / lacks {sorted(missing)}")
    if claims["id"].duplicated().any():
        raise ValueError(f"{path}: duplicate claim ids {sorted(set(claims['id'][claims['id'].duplicated()]))}")
    claims = claims.reindex(columns=CLAIM_COLUMNS)
    claims["source"] = claims["source"].fillna("paper")
    return values[PAPER_COLUMNS], claims.fillna(""), data["citation"]


def paper_values(values: pd.DataFrame, artefact: str) -> pd.DataFrame:
    """The rows of one artefact, renamed for joining: ``scale`` -> ``paper_scale``, ``value`` -> ``paper``."""
    rows = values[values["artefact"] == artefact].drop(columns="artefact")
    return rows.rename(columns={"scale": "paper_scale", "value": "paper"}).reset_index(drop=True)
