"""Offline mode and the fail-fast check of what a suite would download.

Without network, ``datasets`` and ``huggingface_hub`` may retry or wait on a connection for minutes before failing,
deep inside lm-eval's task construction, with a message that does not say which suite needed what. So ``dm-eval`` runs
offline unless told ``--online``: it sets ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` and, before loading the model,
checks every Hub dataset the suite's tasks name (found in their lm-eval YAML configs, plus those a suite declares for
data that task code loads itself) against the local cache, the suite's NLTK resources against NLTK's data path (a
missing one would be downloaded when the task code is imported), and the files it downloads from plain URLs against
dm-eval's URL cache (``<cache>/urls/``), which ``dm-eval-prefetch`` fills; offline, dm-eval serves
those files to the task code from there (:func:`serve_cached_urls`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from deltamatch.evals.suites import Suite

OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def set_hub_offline(offline: bool = True) -> None:
    """Make Hub and datasets calls fail at once instead of waiting on the network.

    Both libraries read the variables once, at import, so where they are already imported (tests, notebooks) their
    module-level switches are set too.
    """
    if not offline:
        return
    for name in OFFLINE_ENV:
        os.environ[name] = "1"
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        cfg = sys.modules["datasets"].config
        cfg.HF_HUB_OFFLINE = cfg.HF_DATASETS_OFFLINE = True


def task_datasets(task_manager, name: str) -> list[tuple[str, str, str | None]]:
    """(task, dataset_path, dataset_name) for the Hub datasets that task or group ``name`` loads via its YAML."""
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = task_manager.task_index.get(name)
    if entry is None:
        raise ValueError(f"lm-eval task or group {name!r} is not known to the task index "
                         "(check the suite's task_dirs and include_defaults)")
    if entry.yaml_path is None:
        return []
    cfg = load_yaml(entry.yaml_path, resolve_func=False)
    if "group" in cfg or (entry.cfg or {}).get("group"):
        children = cfg.get("task", [])
        return [d for child in children if isinstance(child, str) for d in task_datasets(task_manager, child)]
    path = cfg.get("dataset_path")
    if not path or path in ("json", "csv", "parquet", "text", "arrow") or Path(str(path)).exists():
        return []
    return [(name, str(path), cfg.get("dataset_name"))]


def _cached(path: str, name: str | None) -> bool:
    import datasets

    try:
        datasets.load_dataset_builder(path, name)
    except Exception:  # any failure offline means "not usable from the cache"; the message below names the dataset
        return False
    return True


def suite_datasets(suite: Suite, task_manager) -> list[tuple[str, str, str | None]]:
    """(who needs it, dataset_path, dataset_name) of every Hub dataset the suite loads: its tasks' YAMLs and its own
    ``hub_datasets`` (``path`` or ``path:name``)."""
    needed = [d for run in suite.runs for t in run.tasks for d in task_datasets(task_manager, t.task)]
    for spec in suite.hub_datasets:
        path, _, name = spec.partition(":")
        needed.append((f"suite {suite.name}", path, name or None))
    return needed


def url_path(cache_dir: str | Path, url: str) -> Path:
    """Where the URL cache keeps the file of ``url``: ``<cache>/urls/<hash>-<file name>``."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(cache_dir) / "urls" / f"{digest}-{url.rstrip('/').rsplit('/', 1)[-1][:80]}"


def nltk_resource_found(resource: str) -> bool:
    """Whether NLTK finds ``resource`` (``tokenizers/punkt_tab``) on its data path, without downloading it."""
    import nltk

    try:
        nltk.data.find(resource)
    except LookupError:
        return False
    return True


@contextlib.contextmanager
def serve_cached_urls(urls: list[str], cache_dir: str | Path) -> Iterator[None]:
    """While open, ``requests.get`` of one of ``urls`` returns the cached file instead of touching the network (task
    code such as lm-eval's RULER QA fetches SQuAD and HotpotQA that way, with no cache of its own). Other URLs pass
    through unchanged."""
    import requests

    files = {url: url_path(cache_dir, url) for url in urls}
    original = requests.get

    def get(url, *args, **kwargs):
        path = files.get(url)
        if path is None or not path.is_file():
            return original(url, *args, **kwargs)
        response = requests.models.Response()
        response.status_code, response.url, response.encoding = 200, url, "utf-8"
        response._content = path.read_bytes()
        return response

    requests.get = get
    try:
        yield
    finally:
        requests.get = original


def check_offline(suite: Suite, task_manager, cache_dir: str | Path | None = None) -> None:
    """Raise ``ValueError`` naming every dataset, URL or NLTK resource the suite needs that this offline machine does
    not hold. ``cache_dir`` is dm-eval's cache (its ``urls/`` holds prefetched downloads); None: no URL is cached."""
    needed = suite_datasets(suite, task_manager)
    cached = {(p, n): _cached(p, n) for p, n in sorted({(p, n) for _, p, n in needed}, key=str)}
    missing = sorted({f"'{p}'" + (f" (config '{n}')" if n else "") + f" for {task}"
                      for task, p, n in needed if not cached[p, n]})
    problems = [f"Hugging Face dataset {m}" for m in missing]
    problems += [f"download {u}" for u in suite.urls if cache_dir is None or not url_path(cache_dir, u).is_file()]
    problems += [f"NLTK resource {r}" for r in suite.nltk_data if not nltk_resource_found(r)]
    if problems:
        raise ValueError(
            f"suite {suite.name!r} needs data this machine does not have, and the Hub is offline "
            f"(HF_HUB_OFFLINE=1): " + "; ".join(problems)
            + f". Run dm-eval --online where the network allows, or fill the caches first where it does: "
            f"dm-eval-prefetch --suite {suite.name} (same HF_HOME, XDG_CACHE_HOME and NLTK "
            "data path as the eval jobs).")
