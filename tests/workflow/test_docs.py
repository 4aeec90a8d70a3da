"""The documented commands run as written: every `snakemake` command README.md or docs/*.md give (in a fenced shell
block or inline, as tests/doc_commands.py extracts them) is run exactly as the page gives it (plus ``-n``), from a
folder laid out like a fresh clone. The other documented commands: test_doc_commands.py."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from doc_commands import clone, documented_commands, shell_commands


# The same plans as test_dag.py's test_default_dry_run and test_h200_dry_run_plans_every_method_on_the_569m (which
# check their job counts too): not planned twice.
PLANNED_BY_TEST_DAG = {"snakemake -n",
                       "snakemake --cores all --resources local_gpus=1 --configfile config/h200.yaml"}


def documented_snakemake_commands() -> list[tuple[str, str]]:
    """The ``snakemake`` commands that plan a run (``--unlock`` is run by test_doc_commands.py)."""
    return [(pages[0], cmd) for cmd, pages in documented_commands().items()
            if cmd.startswith("snakemake ") and "--unlock" not in cmd and cmd not in PLANNED_BY_TEST_DAG]


def test_extraction_joins_continuations_and_drops_comments():
    page = ("```bash\nsnakemake --a x \\\n    --b y   # a comment\n# only a comment\nls  # no\n"
            "squeue -u \"$USER\" -o \"%i #%k\"\n```\n```python\nsnakemake\n```\n")
    assert shell_commands(page) == ["snakemake --a x --b y", "ls", 'squeue -u "$USER" -o "%i #%k"']


COMMANDS = documented_snakemake_commands()


def test_the_pages_document_the_cluster_and_local_commands():
    documented = documented_commands()
    assert {page for page, _ in COMMANDS} == {"README.md", "cluster.md"}
    assert sum(cmd.startswith("snakemake --profile profiles/slurm") for _, cmd in COMMANDS) >= 3
    assert any(cmd.startswith("snakemake --profile profiles/local") for _, cmd in COMMANDS)
    one_table = [cmd for _, cmd in COMMANDS if "main_1p67b.csv" in cmd and "profiles/slurm" in cmd]
    assert one_table and all(documented[cmd] == ["README.md", "cluster.md"] for cmd in one_table)
    assert PLANNED_BY_TEST_DAG <= set(documented)


@pytest.mark.slow
@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(COMMANDS)])
def test_documented_snakemake_command_dry_runs(page, command, tmp_path):
    work = clone(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([*shlex.split(command), "-n"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{page}: {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Job stats:" in done.stdout or "Nothing to be done" in done.stdout + done.stderr, done.stdout[-2000:]
