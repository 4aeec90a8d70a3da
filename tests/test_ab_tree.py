"""tools/device/ab_tree.py: a script runs against another checkout's ``deltamatch``, not the one installed here."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AB_TREE = ROOT / "tools" / "device" / "ab_tree.py"


def _tree(path: Path, version: str) -> Path:
    """A minimal checkout: ``deltamatch/`` with its version and the four top-level subpackage folders."""
    (path / "deltamatch").mkdir(parents=True)
    (path / "deltamatch" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    for sub in ("kernels", "models", "evals", "reports"):
        (path / sub).mkdir()
        (path / sub / "__init__.py").write_text(f'WHERE = "{sub} of {version}"\n')
    (path / "probe.py").write_text(
        "import os, sys\n"
        "import deltamatch, deltamatch.kernels\n"
        "try:\n"
        "    import deltamatch.kernels.cuda_lib  # this checkout's only: the other tree has no such module\n"
        "    found = 'cuda_lib-found'\n"
        "except ModuleNotFoundError:\n"
        "    found = 'cuda_lib-missing'\n"
        "print(deltamatch.__version__, deltamatch.kernels.WHERE, found, os.getcwd(), *sys.argv[1:])\n")
    return path


def test_a_script_sees_the_other_trees_package_and_arguments(tmp_path):
    """Its modules only: one the other tree lacks is missing, not taken from the checkout installed here."""
    tree = _tree(tmp_path / "other", "0.0.0-other")
    done = subprocess.run([sys.executable, str(AB_TREE), str(tree), "probe.py", "--flag", "x"], capture_output=True,
                          text=True, cwd=ROOT, check=True)
    assert done.stdout.split() == ["0.0.0-other", "kernels", "of", "0.0.0-other", "cuda_lib-missing", str(tree),
                                   "--flag", "x"]
    here = subprocess.run([sys.executable, "-c", "import deltamatch; print(deltamatch.__version__)"],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    assert here.stdout.strip() != "0.0.0-other"  # the installed package is this checkout's


def test_a_folder_that_is_no_checkout_is_refused(tmp_path):
    done = subprocess.run([sys.executable, str(AB_TREE), str(tmp_path), "probe.py"], capture_output=True, text=True)
    assert done.returncode != 0 and "not a checkout of this project" in done.stderr
