"""The commands README.md and docs/*.md give, read as a user reads them, and a folder laid out like a fresh clone to
run them in (tests/workflow/test_docs.py, tests/workflow/test_doc_commands.py,
tests/cluster/test_slurm_doc_commands.py).

Two kinds: the lines of fenced shell blocks (continuation lines joined, comments dropped, quoting kept as written), and
inline code spans in the prose that start with a program and carry at least one argument (``dm-train --config X``,
``squeue -u $USER -o "%i %k %T"``); a span naming only a program (``dm-sweep``) is a name, not a command.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.M | re.S)
ANY_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
PROGRAM = re.compile(r"^(dm-[\w-]+|snakemake|make|torchrun|python3?|pytest|pip|hf|huggingface-cli|sbatch|salloc|srun"
                     r"|squeue|scontrol|scancel|sinfo|sacct|sacctmgr|sudo|bash|[\w./-]*/[\w.-]+\.(?:sh|py))$")


def _drop_comment(line: str) -> str:
    """``line`` without its trailing ``# comment`` (a ``#`` starting a word outside quotes, as the shell reads it)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def shell_commands(text: str) -> list[str]:
    """The commands of the fenced shell blocks of a Markdown page, as written: continuation lines joined, comments
    dropped, surrounding blanks stripped."""
    commands = []
    for block in FENCE.findall(text):
        for line in re.sub(r"\s*\\\n\s*", " ", block).splitlines():
            command = _drop_comment(line).strip()
            if command:
                shlex.split(command)  # a line the shell could not read fails here, naming it
                commands.append(command)
    return commands


def inline_commands(text: str) -> list[str]:
    """Inline code spans of the prose (outside fenced blocks) that are commands: a program and its arguments."""
    prose = ANY_FENCE.sub("", text)
    commands = []
    for span in INLINE.findall(prose):
        command = " ".join(span.split())  # a span broken over two lines reads as one line
        words = command.split()
        if len(words) >= 2 and PROGRAM.match(words[0]):
            commands.append(command)
    return commands


def documented_commands() -> dict[str, list[str]]:
    """Every documented command (fenced and inline) -> the pages that give it, in page order."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for command in [*shell_commands(text), *inline_commands(text)]:
            pages = found.setdefault(command, [])
            if page.name not in pages:
                pages.append(page.name)
    return found


def clone(tmp_path: Path, with_venv: bool = False) -> Path:
    """A working folder with the repository's files (linked) and no results of its own; ``with_venv`` links ``.venv``
    to the running interpreter's environment, as ``make setup`` leaves it in a fresh clone."""
    work = tmp_path / "clone"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {".git", ".venv", "results", ".snakemake", ".pytest_cache"}:
            (work / entry.name).symlink_to(entry)
    if with_venv:
        (work / ".venv").symlink_to(Path(sys.prefix))
    return work
