"""The offline default corpus: English prose that every fresh machine already has.

A Python installation ships megabytes of documentation: the docstrings of the standard library and of every installed
package, and the README/CHANGES/``.rst``/``.md``/``.txt`` files that come with them. That text is technical English,
which is enough to train a tokenizer and a tiny language model end to end without a single download.

A document is one text file, or all docstrings of one ``.py`` file joined by blank lines. The candidate files are
sorted, shuffled with the seed, read until ``max_bytes`` of text is collected, and deduplicated by content hash (many
packages ship the same LICENSE text). Each document then goes to the held-out validation split with probability
``val_fraction``, decided by the seed, so the split is by document and never cuts one in two. The same seed on the same
installation gives the same corpus; another installation gives another corpus, which the manifest records.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import random
import re
import site
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md", ".rst")
SOURCE_SUFFIXES = (".py",)


@dataclass
class CorpusConfig:
    """How the offline corpus is gathered."""

    roots: list[str] = field(default_factory=list)
    """Folders to read; empty means the running Python's stdlib and site-packages."""
    max_bytes: int = 4_000_000
    """Stop once this much UTF-8 text is collected (keeps the build to seconds)."""
    min_doc_chars: int = 200
    """Drop documents shorter than this (stubs, one-line docstrings)."""
    max_doc_chars: int = 20_000
    """Cut longer documents at the last paragraph break before this length."""
    val_fraction: float = 0.05
    """Probability that a document goes to the held-out validation split."""


@dataclass
class Corpus:
    """Deduplicated documents split by document into train and validation."""

    train: list[str]
    """Training documents."""
    val: list[str]
    """Held-out validation documents."""
    sources: int
    """Files read to collect them."""


def default_roots() -> list[str]:
    """The running interpreter's standard library and site-packages folders."""
    roots = [sysconfig.get_paths()["stdlib"], *site.getsitepackages()]
    return list(dict.fromkeys(r for r in roots if os.path.isdir(r)))


def candidate_files(roots: list[str]) -> list[Path]:
    """Every text or Python file under ``roots``, sorted so the order does not depend on the file system."""
    found = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                if name.endswith(TEXT_SUFFIXES + SOURCE_SUFFIXES):
                    found.add(Path(dirpath, name))
    return sorted(found)


_TRIPLE_QUOTED = re.compile(r'(?s)("""|\'\'\')(.*?)\1')


def docstrings(source: str) -> str:
    """The triple-quoted strings of Python ``source`` (its docstrings, in practice), cleaned and joined by blank lines.

    A regular expression instead of ``ast``: parsing every file costs ~8 ms each and dominated the build; the few
    non-docstring triple-quoted strings it also picks up are text too.
    """
    texts = (inspect.cleandoc(m.group(2)) for m in _TRIPLE_QUOTED.finditer(source))
    return "\n\n".join(t for t in texts if len(t) > 40 and " " in t)


def _normalise(text: str, max_chars: int) -> str:
    text = text.replace("\r\n", "\n").replace("\t", "    ")
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    if len(text) > max_chars:
        cut = text.rfind("\n\n", 0, max_chars)
        text = text[: cut if cut > max_chars // 2 else max_chars].rstrip()
    return text


def read_document(path: Path, max_chars: int) -> str:
    """The document of one file: its docstrings for ``.py``, its text otherwise ('' when unreadable or binary)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return ""
    if b"\x00" in raw[:4096]:
        return ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    if path.suffix in SOURCE_SUFFIXES:
        text = docstrings(text)
    return _normalise(text, max_chars)


def build_corpus(config: CorpusConfig, seed: int) -> Corpus:
    """Collect, deduplicate and split the offline corpus; deterministic for ``seed`` on one installation."""
    if config.max_bytes <= 0:
        raise ValueError(f"corpus.max_bytes must be > 0, got {config.max_bytes}")
    if not 0.0 < config.val_fraction < 1.0:
        raise ValueError(f"corpus.val_fraction must be in (0, 1), got {config.val_fraction}")
    roots = config.roots or default_roots()
    missing = [r for r in roots if not os.path.isdir(r)]
    if missing:
        raise ValueError(f"corpus.roots: not a folder: {missing}")
    files = candidate_files(roots)
    random.Random(seed).shuffle(files)
    split_rng = random.Random(seed + 1)
    seen: set[bytes] = set()
    train: list[str] = []
    val: list[str] = []
    total = read = 0
    for path in files:
        if total >= config.max_bytes:
            break
        read += 1
        text = read_document(path, config.max_doc_chars)
        if len(text) < config.min_doc_chars:
            continue
        digest = hashlib.sha256(text.encode()).digest()
        if digest in seen:
            continue
        seen.add(digest)
        (val if split_rng.random() < config.val_fraction else train).append(text)
        total += len(text.encode())
    if not train or not val:
        raise ValueError(f"corpus too small: {len(train)} train / {len(val)} val documents from {roots}; "
                         "raise corpus.max_bytes or corpus.val_fraction")
    return Corpus(train=train, val=val, sources=read)
