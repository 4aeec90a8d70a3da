"""Run one suite on one checkpoint through lm-eval and reduce the results to the contract's tidy JSON.

Per run of the suite: a ``TaskManager`` indexing our task folders (and lm-eval's own tasks where the suite asks), with
the run's metadata plus the checkpoint path (RULER sizes its synthetic prompts with the checkpoint's tokenizer); the
tasks loaded one entry at a time so a failure names the entry; per-task sample limits passed to
``lm_eval.simple_evaluate`` as explicit document indices; then the chosen metrics picked out of lm-eval's results.
The suite average is the plain mean of each task's ``average`` metric. Offline (the default), files the suite downloads
from plain URLs are served from the URL cache that ``dm-eval-prefetch`` filled.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from deltamatch.evals.preflight import check_offline, serve_cached_urls, set_hub_offline
from deltamatch.evals.suites import Suite, SuiteRun
from deltamatch.atomic import write_json


def _task_manager(suite: Suite, metadata: dict[str, Any]):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(p) for p in suite.include_paths()] or None,
                       include_defaults=suite.include_defaults, metadata=metadata)


def _seed() -> None:
    """lm-eval's default seeds, set before tasks are built: RULER's generators draw from the global RNGs."""
    import numpy as np
    import torch
    from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED

    random.seed(DEFAULT_RANDOM_SEED)
    np.random.seed(DEFAULT_OTHER_SEED)
    torch.manual_seed(DEFAULT_OTHER_SEED)


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "deltamatch" / "evals"


def _load(task_manager, run: SuiteRun, suite: Suite):
    """The run's tasks and groups as lm-eval objects, plus lm-eval's flat ``{tasks, groups}`` view."""
    _seed()
    objects, tasks, groups = [], {}, {}
    for entry in run.tasks:
        try:
            loaded = task_manager.load([entry.task])
        except (ConnectionError, FileNotFoundError, OSError) as err:
            raise ValueError(f"suite {suite.name!r}: task {entry.task!r} could not load its data: {err}") from err
        tasks.update(loaded["tasks"])
        groups.update(loaded.get("groups", {}))
        objects.append(loaded["groups"][entry.task] if entry.task in loaded.get("groups", {})
                       else loaded["tasks"][entry.task])
    return objects, tasks, groups


def _samples(run: SuiteRun, tasks: dict, groups: dict, limit: int | None) -> dict[str, list[int]] | None:
    """First-n document indices per leaf task, n = min(task limit, --limit, documents)."""
    samples = {}
    for entry in run.tasks:
        n = min((x for x in (entry.limit, limit) if x is not None), default=None)
        if n is None:
            continue
        leaves = ([t.task_name for t in groups[entry.task].get_all_tasks()] if entry.task in groups else [entry.task])
        for name in leaves:
            samples[name] = list(range(min(n, len(tasks[name].eval_docs))))
    return samples or None


def _metric(results: dict, name: str, metric: str) -> float:
    row = results["results"].get(name) or results.get("groups", {}).get(name)
    if row is None:
        raise ValueError(f"lm-eval returned no results for {name!r}")
    for key in (f"{metric},none", metric):
        if key in row:
            return float(row[key])
    raise ValueError(f"lm-eval results for {name!r} have no metric {metric!r}; got {sorted(row)}")


def _collect(results: dict, run: SuiteRun, groups: dict, out: dict) -> None:
    for entry in run.tasks:
        out["tasks"][entry.task] = {m: _metric(results, entry.task, m) for m in entry.metrics}
        if entry.average:
            out["metric_per_task"][entry.task] = entry.average
        if entry.subtasks and entry.task in groups:
            for task in groups[entry.task].get_all_tasks():
                out["tasks"][f"{entry.task}/{task.task_name}"] = {
                    m: _metric(results, task.task_name, m) for m in entry.metrics}
        names = [t.task_name for t in groups[entry.task].get_all_tasks()] if entry.task in groups else [entry.task]
        for name in names:
            out["n_samples"][name] = int(results.get("n-samples", {}).get(name, {}).get("effective", 0))


def evaluate_suite(checkpoint: str | Path, suite: Suite, data_dir: str | Path | None = None,
                   limit: int | None = None, online: bool = False, device: str | None = None,
                   cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Evaluate ``checkpoint`` on ``suite``; returns the result record (see ``dm-eval``).

    ``cache_dir`` keeps synthetic task data between processes (default: ``~/.cache/deltamatch/evals``).
    """
    checkpoint = Path(checkpoint).resolve()
    if not (checkpoint / "config.json").is_file():
        raise ValueError(f"checkpoint {checkpoint} is not a Hugging Face model folder (no config.json)")
    if suite.needs_data and data_dir is None:
        raise ValueError(f"suite {suite.name!r} builds local tasks from held-out text: pass --data DIR "
                         "(a dm-prepare-data folder with val_docs.jsonl)")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    set_hub_offline(not online)
    start = time.perf_counter()
    cache = Path(cache_dir or default_cache_dir())
    served = serve_cached_urls(suite.urls, cache) if suite.urls and not online else contextlib.nullcontext()
    with tempfile.TemporaryDirectory(prefix="dm-eval-") as scratch, served:
        local = {"dm_ruler_cache": str(cache / "ruler")}
        if suite.needs_data:
            from deltamatch.evals.offline_tasks import build_offline_data

            local.update(build_offline_data(data_dir, scratch))
        managers = [_task_manager(suite, {**run.metadata, **local, "pretrained": str(checkpoint)})
                    for run in suite.runs]
        if not online:
            check_offline(suite, managers[0], cache)

        import lm_eval
        from deltamatch.evals.adapter import DeltaMatchLM

        lm = DeltaMatchLM(pretrained=str(checkpoint), device=device, **suite.model_args)
        out: dict[str, Any] = {"checkpoint": str(checkpoint), "suite": suite.name,
                               "lm_eval_version": version("lm_eval"), "tasks": {}, "average": None,
                               "metric_per_task": {}, "n_samples": {}, "limit": limit}
        for run, manager in zip(suite.runs, managers):
            objects, tasks, groups = _load(manager, run, suite)
            results = lm_eval.simple_evaluate(model=lm, tasks=objects, task_manager=manager,
                                              samples=_samples(run, tasks, groups, limit),
                                              bootstrap_iters=0, log_samples=False)
            _collect(results, run, groups, out)
    scores = [out["tasks"][t][m] for t, m in out["metric_per_task"].items()]
    out["average"] = sum(scores) / len(scores) if scores else None
    out["wall_s"] = round(time.perf_counter() - start, 2)
    return out


def write_json_atomic(record: dict, path: str | Path) -> Path:
    write_json(path, record, indent=1)
    return Path(path)
