"""A script of the repository (not a package module), imported by its path for the tests that call its functions."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The module of ``ROOT / relative`` (e.g. ``tools/device/dq_clock.py``), named by its stem."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # what a dataclass in the script looks its module up by
    spec.loader.exec_module(module)
    return module
