"""``dm-eval``: evaluate one checkpoint on one suite through lm-eval and write the tidy result JSON.

    dm-eval --checkpoint runs/tiny-matched/final --suite offline --data data/default --out results/eval.json

Output: ``{"checkpoint", "suite", "lm_eval_version", "tasks": {task: {metric: value}}, "average",
"metric_per_task": {task: metric averaged}, "n_samples": {task: documents scored}, "limit", "wall_s"}``, written
atomically. Suites live in ``evals/suites/`` (``--suite`` also takes a YAML path). Runs offline unless ``--online``:
a suite needing a Hub dataset, URL download or NLTK resource that is not cached fails at once, naming it;
``dm-eval-prefetch --suite NAME`` fills those caches where the network allows.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from deltamatch.config import load_with_flags


@dataclass
class EvalConfig:
    """How a checkpoint is evaluated (``--config`` file keys; the flags of the same names override them)."""

    limit: int | None = None
    """At most this many documents per task (below the suite's own counts); None keeps the suite's."""
    online: bool = False
    """Allow Hub and web downloads (default: offline, from the caches dm-eval-prefetch fills)."""
    cache: str | None = None
    """Folder for synthetic task data and prefetched URL downloads (default ~/.cache/deltamatch/evals)."""
    device: str | None = None
    """Torch device (default: cuda if present, else cpu)."""

    def __post_init__(self) -> None:
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 1):
            raise ValueError(f"limit must be a positive integer or null, got {self.limit!r}")


def build_parser() -> argparse.ArgumentParser:
    from deltamatch.evals.suites import available_suites

    parser = argparse.ArgumentParser(prog="dm-eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="Hugging Face model folder (dm-train's final/)")
    parser.add_argument("--suite", required=True, help=f"suite name ({', '.join(available_suites())}) or YAML path")
    parser.add_argument("--out", required=True, help="result JSON to write")
    parser.add_argument("--config",
                        help="YAML file of EvalConfig keys (limit, online, cache, device); flags override it")
    parser.add_argument("--limit", type=int, default=None, help="at most N documents per task (below the suite's)")
    parser.add_argument("--data", default=None, help="dm-prepare-data folder (val_docs.jsonl) for local tasks")
    parser.add_argument("--online", action="store_true", help="allow Hub and web downloads (default: offline)")
    parser.add_argument("--cache", default=None, help="folder for synthetic task data and prefetched URL downloads "
                        "(default ~/.cache/deltamatch/evals)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present, else cpu)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = load_with_flags(EvalConfig, args.config, {"limit": args.limit, "online": True if args.online else None,
                                                        "cache": args.cache, "device": args.device})
    except ValueError as err:
        parser.exit(2, f"dm-eval: error: {err}\n")
    # Before lm-eval, datasets or huggingface_hub are imported: they read the offline switches once, at import.
    from deltamatch.evals.preflight import set_hub_offline

    set_hub_offline(not cfg.online)
    from deltamatch.evals.runner import evaluate_suite, write_json_atomic
    from deltamatch.evals.suites import load_suite

    from deltamatch.models.train.export import check_hf_folder

    try:  # bad input is one line naming it, exit 2; the result file is written only whole
        check_hf_folder(args.checkpoint)
        record = evaluate_suite(args.checkpoint, load_suite(args.suite), data_dir=args.data, limit=cfg.limit,
                                online=cfg.online, device=cfg.device, cache_dir=cfg.cache)
        write_json_atomic(record, args.out)
    except (ValueError, OSError) as err:
        print(f"dm-eval: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({"suite": record["suite"], "average": record["average"], "tasks": record["tasks"]}, indent=1))


if __name__ == "__main__":
    main()
