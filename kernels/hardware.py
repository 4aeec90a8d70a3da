"""The machine's accelerator, as the kernel stage needs it: is there a Hopper (sm90) GPU to run and time kernels on?

    python -m deltamatch.kernels.hardware [--out hardware.json] [--has-hopper]

prints ``{"hopper": ..., "device": ..., "capability": ...}`` (and writes it to ``--out``); with ``--has-hopper`` the exit
status is 1 without an sm90 GPU, so a rule can run the GPU-only steps only where they can run. The report reads the
recorded file (``kernel/bench/hardware.json``), never the machine.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from deltamatch.atomic import write_text


def hardware() -> dict:
    """The accelerator of this machine: ``hopper`` (an sm90 GPU is present), its ``device`` name and ``capability``."""
    if not torch.cuda.is_available():
        return {"hopper": False, "device": None, "capability": None}
    major, minor = torch.cuda.get_device_capability()
    return {"hopper": major == 9, "device": torch.cuda.get_device_name(), "capability": f"sm{major}{minor}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deltamatch.kernels.hardware", description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--has-hopper", action="store_true", help="exit 1 unless an sm90 GPU is present")
    args = parser.parse_args(argv)
    found = hardware()
    if args.out:
        write_text(args.out, json.dumps(found, indent=2) + "\n")
    print(json.dumps(found))
    return 0 if found["hopper"] or not args.has_hopper else 1


if __name__ == "__main__":
    sys.exit(main())
