"""Running the real snakemake on the project's Snakefile from a scratch working directory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAKEFILE = ROOT / "Snakefile"
BIN = Path(sys.executable).parent  # the venv's console scripts (snakemake, dm-*)


def run_snakemake(*args, workdir: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    """``snakemake -s <project Snakefile> -d <workdir> ARGS``; outputs land under ``workdir/results/``."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    command = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(workdir), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    done.output = done.stdout + done.stderr  # snakemake prints some errors on stdout, some on stderr
    return done


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Job stats:")) + 3
    counts = {}
    for line in lines[start:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


# Fixtures rather than imports: several test folders have a conftest.py, so `from conftest import ...` is ambiguous.
@pytest.fixture(scope="session")
def snakemake():
    return run_snakemake


@pytest.fixture(scope="session")
def stats():
    return job_counts


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory):
    """A scratch folder where config/test.yaml (the embedded default, shrunk) was built end to end, once per session
    (test_pipeline.py checks it; test_doc_commands.py runs the documented commands on a copy of its results)."""
    workdir = tmp_path_factory.mktemp("pipeline")
    done = run_snakemake("--cores", "2", "--configfile", str(ROOT / "config" / "test.yaml"), workdir=workdir,
                         timeout=900)
    assert done.returncode == 0, done.output[-6000:]
    return workdir
