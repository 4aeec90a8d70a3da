"""Which code a recorded measurement ran: the commit every benchmark writes beside its numbers.

``DM_COMMIT`` wins over git: a device machine receives the working tree with a ``.git`` that may predate the commit
sent (the tree is copied, the history is not always), so the device scripts export the commit they were sent as.
"""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit(root: Path = ROOT) -> str:
    """The short commit of the code that runs: ``$DM_COMMIT``, else ``git rev-parse`` in ``root``, else "unknown"."""
    if os.environ.get("DM_COMMIT"):
        return os.environ["DM_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
