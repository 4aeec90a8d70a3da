"""Maps the ``deltamatch`` subpackages onto the project's top-level folders.

Metadata lives in ``pyproject.toml``; only the package list is computed here, because setuptools' automatic discovery
cannot rename folders (``kernels/`` must install as ``deltamatch.kernels``, never as a bare ``kernels``, which is
Hugging Face's package on PyPI). Every folder holding an ``__init__.py`` under a mapped root becomes a package, so the
wheel is complete without a hand-kept list.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
SUBPACKAGES = {"kernels": "kernels", "models": "models", "evals": "evals", "reports": "reports"}


def discover() -> tuple[list[str], dict[str, str]]:
    packages, package_dir = ["deltamatch"], {"deltamatch": "deltamatch"}
    for name, folder in SUBPACKAGES.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT)
            dotted = ".".join(("deltamatch", name, *rel.parts[1:]))
            packages.append(dotted)
            package_dir[dotted] = rel.as_posix()
    return packages, package_dir


packages, package_dir = discover()
setup(packages=packages, package_dir=package_dir)
