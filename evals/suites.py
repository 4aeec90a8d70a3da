"""Evaluation suites as configuration: which lm-eval tasks to run, which metric of each to keep, which to average.

A suite is a YAML file in ``evals/suites/`` (or any path). It lists one or more *runs*; each run is one lm-eval
evaluation whose tasks share the same task metadata (RULER sizes its synthetic data from ``max_seq_lengths`` there, so
RULER at two lengths would be two runs; the shipped RULER suites hold one length each, ``ruler_8k`` and ``ruler_64k``,
so that a suite average never mixes context lengths). Each task entry names an lm-eval task or group, the metrics to
report, the one metric that enters the suite average (or none: perplexities are reported beside the average, not in
it) and an optional per-task sample limit. Task YAMLs of our own live in ``evals/tasks/<dir>/`` and are indexed through
``TaskManager(include_path=...)``; ``include_defaults`` says whether lm-eval's ~15k built-in task configs are indexed
too (that costs ~5 s of start-up, so the offline suite leaves it off).

Everything a suite may download is named in the suite or in its task configs, so :mod:`deltamatch.evals.preflight`
can refuse an offline run before the model is even loaded, and :mod:`deltamatch.evals.prefetch` can fill the caches
beforehand on a machine with network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltamatch.config import load_yaml

SUITES_DIR = Path(__file__).parent / "suites"
TASKS_DIR = Path(__file__).parent / "tasks"


@dataclass
class SuiteTask:
    """One lm-eval task or group of a run and what to keep of its results."""

    task: str
    """lm-eval task or group name."""
    average: str | int | None = None
    """Metric that enters the suite average (None: reported only); a YAML number such as 8192 becomes its string."""
    report: list[str] = field(default_factory=list)
    """Further metrics to report beside ``average`` (e.g. perplexities)."""
    limit: int | None = None
    """Evaluate at most this many documents per task (None: all); ``--limit`` lowers it further."""
    subtasks: bool = False
    """For a group: also report each subtask's metrics, keyed ``group/subtask``."""

    def __post_init__(self) -> None:
        if self.average is not None:
            self.average = str(self.average)  # lm-eval metric names are strings
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"suite task {self.task!r}: limit must be >= 1, got {self.limit}")

    @property
    def metrics(self) -> list[str]:
        return ([self.average] if self.average else []) + [m for m in self.report if m != self.average]


@dataclass
class SuiteRun:
    """One lm-eval evaluation: tasks that share task metadata."""

    tasks: list[SuiteTask]
    """Tasks and groups evaluated together."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Handed to every task (``max_seq_lengths`` for RULER); the checkpoint path is added as ``pretrained``."""

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("a suite run needs a non-empty list of tasks")


@dataclass
class Suite:
    """A named set of lm-eval runs, with what the suite needs from the machine."""

    name: str
    """Suite name (file stem in ``evals/suites/``)."""
    runs: list[SuiteRun]
    """lm-eval evaluations, in order."""
    description: str = ""
    """One paragraph for the report."""
    task_dirs: list[str] = field(default_factory=list)
    """Folders under ``evals/tasks/`` indexed for our own task YAMLs."""
    include_defaults: bool = False
    """Also index lm-eval's built-in tasks."""
    needs_data: bool = False
    """Needs ``--data DIR`` (a dm-prepare-data folder with ``val_docs.jsonl``) for locally built tasks."""
    hub_datasets: list[str] = field(default_factory=list)
    """Hub datasets loaded inside task code (``path`` or ``path:name``); those in task YAMLs are found automatically."""
    urls: list[str] = field(default_factory=list)
    """Files that task code downloads from the web (``requests.get``) without a cache: the suite needs network, or a
    prefetch (``dm-eval-prefetch``), after which dm-eval serves them from its cache offline."""
    nltk_data: list[str] = field(default_factory=list)
    """NLTK resources task code needs (``tokenizers/punkt_tab``); NLTK downloads a missing one at import, so an
    offline run checks them first."""
    model_args: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the lm-eval model (``max_length``, ``batch_size``, ``dtype``)."""

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError(f"suite {self.name!r} needs a non-empty list of runs")

    def include_paths(self) -> list[Path]:
        return [TASKS_DIR / d for d in self.task_dirs]


def available_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.yaml"))


def load_suite(name_or_path: str | Path) -> Suite:
    """The suite called ``name_or_path`` in ``evals/suites/``, or the suite YAML at that path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = SUITES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ValueError(f"unknown suite {str(name_or_path)!r}; available: {available_suites()}")
    elif not path.is_file():
        raise ValueError(f"suite file not found: {path}")
    suite = load_yaml(Suite, path)
    missing = [str(p) for p in suite.include_paths() if not p.is_dir()]
    if missing:
        raise ValueError(f"suite {suite.name!r}: task_dirs not found: {missing}")
    keys = [key for run in suite.runs for t in run.tasks for key in [t.task]]
    if len(keys) != len(set(keys)):
        raise ValueError(f"suite {suite.name!r}: a task is listed twice: {keys}")
    return suite
