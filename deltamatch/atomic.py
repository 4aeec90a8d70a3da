"""Atomic file writes for every result the project produces: a temporary name in the target folder, then ``os.replace``.

A crash or a kill leaves either the old file or the new one, never half of one; Snakemake, a report reader and a
resumed run never see a torn CSV, JSON or checkpoint manifest.

``mkstemp`` creates its file with mode 0600 whatever the umask; the file is given the mode a plain ``open`` would have
given it (0666 less the umask), so collaborators on a shared file system can read results as the umask intends.
"""

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def current_umask() -> int:
    """The process's umask (reading it means setting it: set it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``, on error removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=target.suffix or ".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj, indent: int = 2) -> None:
    write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")
