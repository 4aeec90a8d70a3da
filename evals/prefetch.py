"""Fill the caches a suite reads, where the network allows, so that ``dm-eval`` runs it offline where it does not.

    python -m deltamatch.evals.prefetch --suite commonsense --suite ruler_8k --out prefetch.json

Cluster compute nodes often have no network, and the Hub and NLTK libraries may wait on a connection for minutes
before failing. The pipeline therefore (config ``evals.prefetch``) runs this on the login node as a local rule and the
eval jobs run ``dm-eval`` offline (its default: ``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``), which checks these
same caches first and fails at once, naming what is missing (:func:`deltamatch.evals.preflight.check_offline`).

What a suite downloads is named in the suite or in its task configs, and goes where dm-eval looks for it:

* Hub datasets (the tasks' ``dataset_path``/``dataset_name`` and the suite's ``hub_datasets``): ``datasets.load_dataset``
  into the Hugging Face cache (``HF_HOME``, ``HF_DATASETS_CACHE``);
* files at plain URLs (the suite's ``urls``): ``<cache>/urls/`` (dm-eval's ``--cache``, default
  ``~/.cache/deltamatch/evals``, under ``XDG_CACHE_HOME``), which dm-eval serves to the task code offline;
* NLTK resources (the suite's ``nltk_data``): NLTK's download folder (``~/nltk_data``, or ``NLTK_DATA``).

These folders must be on a file system the eval jobs see with the same environment variables (a shared home).
Anything already cached is kept. The synthetic RULER samples themselves cannot be prefetched: they are generated with
the evaluated checkpoint's tokenizer, locally, at eval time. ``--out`` records what was fetched (JSON, atomically)
only after an offline check of the suite passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from deltamatch.atomic import atomic_path, write_json
from deltamatch.evals.preflight import OFFLINE_ENV, check_offline, set_hub_offline, suite_datasets, url_path
from deltamatch.evals.suites import Suite, available_suites, load_suite


def _task_manager(suite: Suite):
    from deltamatch.evals.runner import _task_manager

    return _task_manager(suite, dict(suite.runs[0].metadata))


def fetch_url(url: str, cache_dir: str | Path, timeout: float = 120.0) -> Path:
    """Download ``url`` into the URL cache unless it is there already; returns the file."""
    import requests

    path = url_path(cache_dir, url)
    if path.is_file():
        return path
    response = requests.get(url, timeout=timeout)
    response.raise_for_status()
    with atomic_path(path) as tmp:
        tmp.write_bytes(response.content)
    return path


def fetch_nltk(resource: str) -> None:
    """Download an NLTK resource (``tokenizers/punkt_tab`` -> package ``punkt_tab``) unless NLTK finds it."""
    from deltamatch.evals.preflight import nltk_resource_found

    if nltk_resource_found(resource):
        return
    import nltk

    if not nltk.download(resource.rstrip("/").rsplit("/", 1)[-1], quiet=True, raise_on_error=True):
        raise ValueError(f"NLTK could not download {resource}")


def fetch_dataset(path: str, name: str | None) -> None:
    import datasets

    datasets.load_dataset(path, name)


def fetch(suite: Suite, cache_dir: str | Path, manager=None) -> dict:
    """Download what ``suite`` reads into the caches (what is cached already is kept); returns the record."""
    blocked = [name for name in OFFLINE_ENV if os.environ.get(name, "").lower() in ("1", "true", "yes", "on")]
    if blocked:
        raise ValueError(f"prefetch downloads, but {', '.join(blocked)} is set: unset it (on a machine with network)")
    manager = manager or _task_manager(suite)
    record = {"suite": suite.name, "cache": str(cache_dir), "hub_datasets": [], "urls": {}, "nltk_data": []}
    for path, name in sorted({d[1:] for d in suite_datasets(suite, manager)}, key=str):
        try:
            fetch_dataset(path, name)
        except Exception as err:  # any failure here: name the dataset, keep the library's reason
            raise ValueError(f"suite {suite.name!r}: could not download Hugging Face dataset {path!r}"
                             + (f" (config {name!r})" if name else "") + f": {err}") from err
        record["hub_datasets"].append(f"{path}:{name}" if name else path)
    for url in suite.urls:
        try:
            record["urls"][url] = str(fetch_url(url, cache_dir))
        except Exception as err:
            raise ValueError(f"suite {suite.name!r}: could not download {url}: {err}") from err
    for resource in suite.nltk_data:
        fetch_nltk(resource)
        record["nltk_data"].append(resource)
    return record


def prefetch(suites: list[Suite], cache_dir: str | Path) -> list[dict]:
    """Fill every cache the suites read, then check offline, as an eval job will, that dm-eval finds everything."""
    start = time.perf_counter()
    managers = [_task_manager(suite) for suite in suites]
    records = [fetch(suite, cache_dir, manager) for suite, manager in zip(suites, managers)]
    set_hub_offline(True)  # from here on this process sees what an offline eval job sees
    for suite, manager in zip(suites, managers):
        check_offline(suite, manager, cache_dir)
    for record in records:
        record["wall_s"] = round(time.perf_counter() - start, 2)
    return records


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dm-eval-prefetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", action="append", required=True,
                        help=f"suite name ({', '.join(available_suites())}) or YAML path; repeat for several")
    parser.add_argument("--out", help="JSON record of what was fetched (written after the offline check passed)")
    parser.add_argument("--cache", default=None, help="dm-eval's --cache (default ~/.cache/deltamatch/evals)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from deltamatch.evals.runner import default_cache_dir

    cache = Path(args.cache or default_cache_dir())
    try:
        records = prefetch([load_suite(name) for name in args.suite], cache)
    except ValueError as err:
        print(f"prefetch: error: {err}", file=sys.stderr)
        return 2
    if args.out:
        write_json(args.out, records[0] if len(records) == 1 else records, indent=1)
    print(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
