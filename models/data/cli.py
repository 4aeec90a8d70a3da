"""``dm-prepare-data --config FILE``: build a data folder from a YAML config (see ``prepare.PrepareConfig``)."""

from __future__ import annotations

import argparse
import sys
import time

from deltamatch.models.data.prepare import PrepareConfig, prepare
from deltamatch.config import load_yaml


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dm-prepare-data", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML file (keys: out_dir, seed, source, corpus, tokenizer, "
                                                        "hub, shard_tokens)")
    parser.add_argument("--out-dir", help="override out_dir of the config")
    args = parser.parse_args(argv)
    try:
        config = load_yaml(PrepareConfig, args.config)
        if args.out_dir:
            config.out_dir = args.out_dir
        start = time.perf_counter()
        manifest = prepare(config)
    except ValueError as err:
        print(f"dm-prepare-data: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # an unwritable out_dir, a full disk
        print(f"dm-prepare-data: error: cannot write out_dir {config.out_dir}: {err}", file=sys.stderr)
        return 2
    splits = ", ".join(f"{k} {v['tokens']:,} tokens / {v['documents']:,} docs" for k, v in manifest["splits"].items())
    print(f"dm-prepare-data: {config.out_dir}: vocab {manifest['vocab_size']}, {splits} "
          f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
