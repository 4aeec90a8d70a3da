"""The distribution: every subpackage folder ships in the wheel under deltamatch.*, and every console script resolves."""

import importlib
import subprocess
import sys
import zipfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("kernels", "models", "evals", "reports")


def _expected_packages() -> set[str]:
    found = {"deltamatch"}
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            found.add(".".join(("deltamatch", folder, *rel.parts[1:])))
    return found


@pytest.mark.slow
def test_wheel_holds_every_subpackage(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("deltamatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n[: -len("/__init__.py")].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert _expected_packages() <= shipped
    assert not any(n.startswith(("kernels/", "evals/")) for n in names)  # never a bare top-level kernels/evals
    assert any(n.endswith("kernels/README.md") for n in names)


def test_every_subpackage_imports():
    for name in sorted(_expected_packages()):
        importlib.import_module(name)


def test_console_scripts_resolve():
    scripts = [ep for ep in entry_points(group="console_scripts") if ep.value.startswith("deltamatch.")]
    assert {"dm-sweep", "dm-train", "dm-eval", "dm-report"} <= {ep.name for ep in scripts}
    for ep in scripts:
        assert callable(ep.load()), ep.name
