"""The documented commands run as written: every `snakemake` command in a fenced shell block of README.md or docs/*.md
is run exactly as the page gives it (plus ``-n``), from a folder laid out like a fresh clone."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.M | re.S)


def shell_commands(text: str) -> list[str]:
    """The commands of the fenced shell blocks of a Markdown page: continuation lines joined, comments dropped."""
    commands = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(shlex.join(words))
    return commands


def documented_snakemake_commands() -> list[tuple[str, str]]:
    return [(page.name, cmd) for page in PAGES for cmd in shell_commands(page.read_text(encoding="utf-8"))
            if cmd.startswith("snakemake ")]


def test_extraction_joins_continuations_and_drops_comments():
    page = "```bash\nsnakemake --a x \\\n    --b y   # a comment\n# only a comment\nls  # no\n```\n```python\nsnakemake\n```\n"
    assert shell_commands(page) == ["snakemake --a x --b y", "ls"]


def _clone(tmp_path: Path) -> Path:
    """A working folder with the repository's files (linked) and no results of its own."""
    work = tmp_path / "clone"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {".git", ".venv", "results", ".snakemake", ".pytest_cache"}:
            (work / entry.name).symlink_to(entry)
    return work


COMMANDS = documented_snakemake_commands()


def test_the_pages_document_the_cluster_and_local_commands():
    pages = {page for page, _ in COMMANDS}
    assert pages == {"README.md", "cluster.md"}
    assert sum("profiles/slurm" in cmd for _, cmd in COMMANDS) >= 4
    assert any("main_1p67b.csv" in cmd and "profiles/slurm" in cmd for _, cmd in COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(COMMANDS)])
def test_documented_snakemake_command_dry_runs(page, command, tmp_path):
    work = _clone(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([*shlex.split(command), "-n"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{page}: {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Job stats:" in done.stdout or "Nothing to be done" in done.stdout + done.stderr, done.stdout[-2000:]
