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


EXTRA_ONLY = ("snakemake", "lm_eval", "pandas", "seaborn", "matplotlib", "datasets", "jsonschema", "accelerate",
              "wonderwords", "tabulate")
CORE_USE = r"""
import sys

for name in BLOCKED:  # as if not installed: imports fail, importlib.util.find_spec answers None
    sys.modules[name] = None
import torch
from deltamatch.kernels import dm_attn_func
from deltamatch.models import HybridForCausalLM, get_config
from deltamatch.models.publish import main

q = torch.randn(1, 16, 2, 64, requires_grad=True)
dm_attn_func(q, q, q, causal=True, mode="matched").sum().backward()
model = HybridForCausalLM(get_config("tiny", attn_method="matched"))
model(torch.randint(0, 100, (1, 8))).logits.sum().backward()
print("core ok")
"""


def test_core_dependencies_exclude_the_pipeline_evals_and_report():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {dep.split(">")[0].split("=")[0].split(";")[0].strip().lower() for dep in project["dependencies"]}
    assert not core & {"snakemake", "lm-eval", "pandas", "seaborn", "matplotlib", "datasets", "jsonschema"}
    extras = project["optional-dependencies"]
    assert {"pipeline", "eval", "report", "all"} <= set(extras)
    assert any(d.startswith("snakemake>") for d in extras["pipeline"]) and any(d.startswith("lm-eval") for d in extras["eval"])
    assert extras["all"] == ["deltamatch[pipeline,eval,report]"]


def test_models_and_kernels_work_with_core_dependencies_only():
    code = f"BLOCKED = {EXTRA_ONLY!r}\n" + CORE_USE
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "core ok" in done.stdout, done.stderr[-3000:]


class _Parsed(Exception):
    pass


def _parsers_of(entry_point, monkeypatch):
    """Every argparse parser a console script builds (its subcommands' too), captured at parse_args."""
    import argparse

    seen = []

    def capture(self, args=None, namespace=None):
        seen.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises((_Parsed, SystemExit)):
        entry_point.load()(["--help"]) if entry_point.name else None
    parsers, todo = [], list(seen)
    while todo:
        parser = todo.pop()
        parsers.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return parsers


def test_every_cli_option_has_help(monkeypatch):
    import argparse

    import tomllib

    scripts = [ep for ep in entry_points(group="console_scripts") if ep.value.startswith("deltamatch.")]
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {ep.name: ep.value for ep in scripts} == declared  # every console script of pyproject, as installed
    missing = []
    for ep in scripts:
        parsers = _parsers_of(ep, monkeypatch)
        assert parsers, f"{ep.name}: no argparse parser seen"
        for parser in parsers:
            if not (parser.description or "").strip():
                missing.append(f"{ep.name} ({parser.prog}): no description")
            for action in parser._actions:
                if isinstance(action, argparse._HelpAction):
                    continue
                if isinstance(action, argparse._SubParsersAction):  # each subcommand's line in the parent's --help
                    helped = {choice.dest for choice in action._choices_actions if (choice.help or "").strip()}
                    missing += [f"{ep.name} {name}: no help" for name in action.choices if name not in helped]
                    continue
                # a hidden option (argparse.SUPPRESS) is an undocumented one too
                if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                    missing.append(f"{ep.name} ({parser.prog}): {'/'.join(action.option_strings) or action.dest}")
    assert missing == [], "\n".join(missing)
