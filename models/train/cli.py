"""``dm-train --config FILE``: train (or resume, or finish) the run a YAML config describes (see ``config.RunConfig``).

Run it as it is on one process, or under ``torchrun --nproc-per-node N -m deltamatch.models.train.cli --config FILE``
(``dm-launch`` wraps that for SLURM). Bad configs exit with status 2 and a message naming the key; a NaN or infinite loss or gradient norm
stops the run with status 3 before the optimizer step that would spread it into the weights.
"""

from __future__ import annotations

import argparse
import os
import sys

from deltamatch.models.train.config import COSMETIC_ENV, RunConfig, apply_cosmetic, load_yaml
from deltamatch.models.train.metrics import require_tensorboard


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dm-train", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML run config")
    parser.add_argument("--run-dir", help="override run_dir of the config")
    parser.epilog = (f"Environment: {COSMETIC_ENV}, a JSON object of display-only keys (train.progress, "
                     "metrics.tensorboard) set on top of the config; the pipeline passes them this way.")
    args = parser.parse_args(argv)
    try:
        config = apply_cosmetic(load_yaml(RunConfig, args.config), os.environ.get(COSMETIC_ENV))
        if config.metrics.tensorboard:
            require_tensorboard()
        if args.run_dir:
            config.run_dir = args.run_dir
    except ValueError as err:
        print(f"dm-train: error: {err}", file=sys.stderr)
        return 2
    from deltamatch.models.train.loop import NonFiniteError, train  # after validation: a bad config fails first

    try:
        summary = train(config)
    except ValueError as err:
        print(f"dm-train: error: {err}", file=sys.stderr)
        return 2
    except NonFiniteError as err:
        print(f"dm-train: error: {err}", file=sys.stderr)
        return 3
    if summary:
        ended = (f" (stopped: step {summary['diverged_at_step']} was not finite)"
                 if summary.get("diverged_at_step") is not None else "")
        print(f"dm-train: {config.run_dir}: {summary['steps']} steps{ended}, "
              f"final val loss {summary['final_val_loss']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
