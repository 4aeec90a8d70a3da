"""``dm-train --config FILE``: train (or resume, or finish) the run a YAML config describes (see ``config.RunConfig``).

Run it as it is on one process, or under ``torchrun --nproc-per-node N -m deltamatch.models.train.cli --config FILE``
(``dm-launch`` wraps that for SLURM).

Exit statuses: 0 done; 2 bad input, one line naming it (a config key, a malformed YAML file, a shard that does not
match its manifest, a run dir trained under another config, an unwritable run dir, a full disk); 3 a NaN or infinite
loss or gradient norm under ``train.on_nonfinite: raise`` (the step is never applied); 130 / 143 stopped by SIGINT /
SIGTERM after the current step, with a checkpoint written (rerun to resume); 130 also for a second SIGINT, which
aborts at once.
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
    parser.add_argument("--allow-config-change", action="store_true",
                        help="resume a run dir whose checkpoints were written under another config (e.g. a new lr "
                             "schedule); the change is recorded in metrics.jsonl")
    parser.add_argument("--restart-on-config-change", action="store_true",
                        help="delete a run dir's checkpoints, metrics and export when they were written under another "
                             "config, and start afresh (what the pipeline does)")
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
    from deltamatch.models.train.signals import Interrupted

    try:
        summary = train(config, allow_config_change=args.allow_config_change,
                        restart_on_config_change=args.restart_on_config_change)
    except ValueError as err:
        print(f"dm-train: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # unwritable or missing folders, a full disk: the path is in the message
        print(f"dm-train: error: {err}", file=sys.stderr)
        return 2
    except NonFiniteError as err:
        print(f"dm-train: error: {err}", file=sys.stderr)
        return 3
    except Interrupted as err:
        print(f"dm-train: {err}", file=sys.stderr)
        return err.exit_status
    except KeyboardInterrupt:  # a second SIGINT: the user did not want to wait for the step and its checkpoint
        print("dm-train: interrupted by a second SIGINT; the run resumes from its newest checkpoint", file=sys.stderr)
        return 130
    if summary:
        ended = (f" (stopped: step {summary['diverged_at_step']} was not finite)"
                 if summary.get("diverged_at_step") is not None else "")
        print(f"dm-train: {config.run_dir}: {summary['steps']} steps{ended}, "
              f"final val loss {summary['final_val_loss']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
