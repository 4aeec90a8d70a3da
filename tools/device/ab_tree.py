"""Run a project script from another checkout on the same machine: an A/B of two commits in one device call.

    python3 tools/device/ab_tree.py TREE SCRIPT [ARGS...]

TREE holds the other commit's files (``git archive <rev> | tar -x -C TREE``) and, for the CUDA kernels, its library
built on the CPU machine (``TREE/build/cuda``; carry TREE). Its ``deltamatch`` package is imported from TREE instead of
the checkout installed here (an editable install's finder is set aside), and SCRIPT runs from TREE as ``__main__``.
"""
import os
import runpy
import sys
import tempfile


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    tree, script = os.path.abspath(sys.argv[1]), sys.argv[2]
    if not os.path.isfile(os.path.join(tree, "deltamatch", "__init__.py")):
        sys.exit(f"{tree}: not a checkout of this project (no deltamatch/__init__.py)")
    package = os.path.join(tempfile.mkdtemp(prefix="ab_tree_"), "deltamatch")
    os.makedirs(package)
    for name in os.listdir(os.path.join(tree, "deltamatch")):
        os.symlink(os.path.join(tree, "deltamatch", name), os.path.join(package, name))
    for sub in ("kernels", "models", "evals", "reports"):  # the subpackages live at the top level (setup.py)
        os.symlink(os.path.join(tree, sub), os.path.join(package, sub))
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, os.path.dirname(package))
    os.chdir(tree)
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
