"""Dataset loaders for the locally built tasks: lm-eval hands a task's metadata to its ``custom_dataset``.

``dm-eval`` builds the JSONL files from the data folder's ``val_docs.jsonl`` (see ``deltamatch.evals.offline_tasks``)
and passes their paths as metadata; with plain ``lm_eval run`` pass them with
``--metadata '{"dm_lastword_jsonl": "...", "dm_heldout_jsonl": "..."}'``.
"""

import json
from pathlib import Path

import datasets


def _load_jsonl(kwargs: dict, key: str) -> dict[str, datasets.Dataset]:
    path = kwargs.get(key)
    if not path:
        raise ValueError(f"task metadata {key!r} is missing: it must name the JSONL built by "
                         "deltamatch.evals.offline_tasks (dm-eval passes it; lm_eval needs --metadata)")
    if not Path(path).is_file():
        raise ValueError(f"task metadata {key!r}: no such file {path}")
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}


def load_lastword(**kwargs) -> dict[str, datasets.Dataset]:
    return _load_jsonl(kwargs, "dm_lastword_jsonl")


def load_heldout(**kwargs) -> dict[str, datasets.Dataset]:
    return _load_jsonl(kwargs, "dm_heldout_jsonl")
