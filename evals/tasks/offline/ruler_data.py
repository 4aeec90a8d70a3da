"""lm-eval's RULER synthetic data generators, memoised per tokenizer.

RULER's generators size every prompt with the model's tokenizer, so all checkpoints trained on one data folder get
the same samples. Generating them is cheap, but importing lm-eval's needle module is not: it sorts six million
adjective-noun keys at import, ~20 s on a laptop core, once per process. Each of the pipeline's checkpoints is
evaluated in its own process, so the samples are kept as JSONL under the task metadata ``dm_ruler_cache`` (when set),
keyed by task, lengths, a hash of the tokenizer files and the lm-eval version; a miss runs lm-eval's generator.
"""

import hashlib
import importlib
import json
from importlib.metadata import version
from pathlib import Path

import datasets
from deltamatch.atomic import write_text

GENERATORS = {
    "niah_single_1": "lm_eval.tasks.ruler.niah_utils:niah_single_1",
    "niah_multikey_2": "lm_eval.tasks.ruler.niah_utils:niah_multikey_2",
    "niah_multikey_3": "lm_eval.tasks.ruler.niah_utils:niah_multikey_3",
    "vt": "lm_eval.tasks.ruler.vt_utils:get_vt_dataset",
    "cwe": "lm_eval.tasks.ruler.cwe_utils:get_cw_dataset",
    "fwe": "lm_eval.tasks.ruler.fwe_utils:fwe_download",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")


def _generate(name: str, kwargs: dict) -> datasets.Dataset:
    module, _, fn = GENERATORS[name].partition(":")
    return getattr(importlib.import_module(module), fn)(**kwargs)["test"]


def _key(name: str, kwargs: dict) -> str:
    digest = hashlib.sha256(json.dumps([name, kwargs.get("max_seq_lengths"), version("lm_eval")]).encode())
    folder = Path(kwargs.get("tokenizer") or kwargs.get("pretrained") or "")
    for file in TOKENIZER_FILES:
        if (folder / file).is_file():
            digest.update(file.encode() + (folder / file).read_bytes())
    return digest.hexdigest()[:16]


def load(name: str, kwargs: dict) -> dict[str, datasets.Dataset]:
    cache = kwargs.get("dm_ruler_cache")
    if not cache:
        return {"test": _generate(name, kwargs)}
    path = Path(cache) / f"{name}-{_key(name, kwargs)}.jsonl"
    if not path.is_file():
        rows = _generate(name, kwargs).to_list()
        write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
    with path.open() as fh:
        rows = [json.loads(line) for line in fh]
    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}


def niah_single_1(**kwargs):
    return load("niah_single_1", kwargs)


def niah_multikey_2(**kwargs):
    return load("niah_multikey_2", kwargs)


def niah_multikey_3(**kwargs):
    return load("niah_multikey_3", kwargs)


def vt(**kwargs):
    return load("vt", kwargs)


def cwe(**kwargs):
    return load("cwe", kwargs)


def fwe(**kwargs):
    return load("fwe", kwargs)
