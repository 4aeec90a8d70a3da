"""The stage boundaries as drawn (DESIGN.md): ground ← kernels ← models ← evals; reports read files only.

Checked two ways: a fresh interpreter that imports every report module must not load torch (the report environment,
envs/report.yaml, has none), and no module imports a stage it may not see.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Which deltamatch stages each folder may import (besides itself).
ALLOWED = {
    "deltamatch": set(),
    "kernels": {"deltamatch"},
    "models": {"deltamatch", "kernels"},
    "evals": {"deltamatch", "kernels", "models"},
    "reports": {"deltamatch"},
}
STAGE_OF_MODULE = {"kernels": "kernels", "models": "models", "evals": "evals", "reports": "reports"}


def _imported_stages(path: Path) -> dict[str, int]:
    """``{stage: first line}`` of the deltamatch stages ``path`` imports (``deltamatch.X`` -> X; ground otherwise)."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "deltamatch":
                stage = STAGE_OF_MODULE.get(parts[1] if len(parts) > 1 else "", "deltamatch")
                found.setdefault(stage, node.lineno)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "find_spec" and node.args:
            arg = node.args[0]  # importlib.util.find_spec("deltamatch.reports") is an import in disguise
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("deltamatch."):
                found.setdefault(STAGE_OF_MODULE.get(str(arg.value).split(".")[1], "deltamatch"), node.lineno)
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_no_stage_imports_one_it_may_not_see(folder):
    wrong = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        for stage, line in _imported_stages(path).items():
            if stage != folder and stage not in ALLOWED[folder]:
                wrong[f"{path.relative_to(ROOT)}:{line}"] = stage
    assert wrong == {}


def test_reports_load_no_torch_in_a_fresh_interpreter():
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import deltamatch.reports\n"
        "for info in pkgutil.iter_modules(deltamatch.reports.__path__):\n"
        "    importlib.import_module('deltamatch.reports.' + info.name)\n"
        "print(json.dumps(sorted(m for m in ('torch', 'triton', 'transformers', 'fla') if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_report_environment_carries_no_torch():
    import yaml

    env = yaml.safe_load((ROOT / "envs" / "report.yaml").read_text())
    pins = [p for item in env["dependencies"] if isinstance(item, dict) for p in item["pip"]]
    assert pins and not [p for p in pins if p.split("==")[0] in ("torch", "triton")]
