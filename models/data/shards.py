"""Token shards: flat binary files of token ids that the trainer memory-maps, and the manifest that describes them.

Layout of a data folder (the same for the offline corpus and the Hub path)::

    manifest.json          format, dtype, vocab size, special-token ids, seed, source, per split: tokens, documents,
                           and per shard: file, tokens, sha256
    train/00000.bin ...    little-endian uint16 (vocab <= 65536) or uint32 token ids, documents joined by <|eos|>
    val/00000.bin ...
    tokenizer/             transformers tokenizer folder
    val_docs.jsonl         the held-out raw documents, one {"text": ...} per line

Every shard is written to a temporary name and renamed once complete, and its sha256 is computed from the bytes
written, so the manifest can be checked against the files (``verify``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from deltamatch.atomic import atomic_path, write_text

FORMAT = "deltamatch-token-shards-v1"
MANIFEST = "manifest.json"
BUFFER = ".buffer.bin"  # a resumable build's unflushed tokens (removed by close)


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id of a ``vocab_size`` vocabulary."""
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")




@dataclass
class ShardWriter:
    """Appends documents (token ids) to one split, cutting a new shard every ``shard_tokens`` tokens."""

    folder: Path
    """The split folder (``data/train``)."""
    dtype: np.dtype
    """Token dtype on disk."""
    eos_id: int
    """Appended after every document."""
    shard_tokens: int = 1 << 24
    """Tokens per shard file (16 Mi tokens = 32 MiB at uint16)."""
    shards: list[dict] = field(default_factory=list)
    """Manifest entries of the shards written so far."""
    documents: int = 0
    """Documents added."""
    max_ids: list[int] = field(default_factory=list)
    """Largest token id of each shard written (the vocabulary check of :func:`verify`, known at write time)."""
    _buffer: list[np.ndarray] = field(default_factory=list)
    _buffered: int = 0

    def __post_init__(self) -> None:
        if self.shard_tokens <= 0:
            raise ValueError(f"shard_tokens must be > 0, got {self.shard_tokens}")
        self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def tokens(self) -> int:
        """Tokens added, flushed or not."""
        return sum(s["tokens"] for s in self.shards) + self._buffered

    def add(self, ids: Iterable[int]) -> None:
        """Append one document's ids followed by EOS."""
        arr = np.fromiter(ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token id out of range for {self.dtype}: [{arr.min()}, {arr.max()}]")
        self._buffer.append(np.append(arr, self.eos_id).astype(self.dtype))
        self._buffered += arr.size + 1
        self.documents += 1
        while self._buffered >= self.shard_tokens:
            self._flush(self.shard_tokens)

    def close(self) -> list[dict]:
        """Write what is buffered and return the shard entries."""
        if self._buffered:
            self._flush(self._buffered)
        (self.folder / BUFFER).unlink(missing_ok=True)
        return self.shards

    def save_state(self) -> dict:
        """The writer's position for a resumed build: its shards and documents, with the tokens not yet in a shard
        written (atomically) beside the shards."""
        buffered = np.concatenate(self._buffer) if self._buffer else np.empty(0, self.dtype)
        with atomic_path(self.folder / BUFFER) as tmp:
            tmp.write_bytes(buffered.tobytes())
        return {"shards": list(self.shards), "documents": self.documents, "buffered": int(buffered.size)}

    def load_state(self, state: dict) -> None:
        """Go on from :meth:`save_state`'s position; shard files written after it are rewritten as the build goes on."""
        buffered = np.fromfile(self.folder / BUFFER, dtype=self.dtype) if state["buffered"] else np.empty(0, self.dtype)
        if buffered.size != state["buffered"]:
            raise ValueError(f"{self.folder / BUFFER} holds {buffered.size} tokens, the saved state {state['buffered']}")
        self.shards, self.documents = [dict(s) for s in state["shards"]], state["documents"]
        self._buffer, self._buffered = ([buffered] if buffered.size else []), int(buffered.size)

    def _flush(self, n: int) -> None:
        flat = np.concatenate(self._buffer)
        head, rest = flat[:n], flat[n:]
        self._buffer, self._buffered = ([rest] if rest.size else []), rest.size
        name = f"{len(self.shards):05d}.bin"
        path = self.folder / name
        tmp = path.with_name(f".{name}.tmp")
        data = head.tobytes()
        tmp.write_bytes(data)
        os.replace(tmp, path)
        self.shards.append({"file": f"{self.folder.name}/{name}", "tokens": int(n),
                            "sha256": hashlib.sha256(data).hexdigest()})
        self.max_ids.append(int(head.max()))


def write_manifest(folder: Path, *, vocab_size: int, special: dict[str, int], seed: int, source: dict,
                   splits: dict[str, ShardWriter]) -> dict:
    """Close every split and write ``manifest.json``; returns the manifest."""
    manifest = {
        "format": FORMAT,
        "dtype": token_dtype(vocab_size).name,
        "vocab_size": vocab_size,
        "special_tokens": special,
        "seed": seed,
        "source": source,
        "splits": {name: {"tokens": w.tokens, "documents": w.documents, "shards": w.close()}
                   for name, w in splits.items()},
    }
    write_text(folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    _remember_verified(folder, manifest, [m for w in splits.values() for m in w.max_ids])
    return manifest


def _remember_verified(folder: Path, manifest: dict, max_ids: list[int]) -> None:
    """Seed :func:`verify`'s cache with the shards just written (their sha256 is of the bytes written, their ids were
    seen), so the training jobs that start together on a fresh data folder do not each hash all of it again."""
    shards = [s for split in manifest["splits"].values() for s in split["shards"]]
    cache = {}
    for shard, largest in zip(shards, max_ids):
        if largest < manifest["vocab_size"]:
            stat = (folder / shard["file"]).stat()
            cache[shard["file"]] = [stat.st_size, stat.st_mtime_ns, shard["sha256"]]
    write_text(folder / VERIFIED, json.dumps(cache, indent=1) + "\n")


def read_manifest(folder: str | Path) -> dict:
    """Load and sanity-check ``manifest.json`` of a data folder."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ValueError(f"not a data folder (no {MANIFEST}): {folder}; run dm-prepare-data first")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


VERIFIED = ".verified.json"
"""Cache of :func:`verify` in the data folder: per shard file, the (size, mtime_ns, sha256) it was found good with."""


def _check_size(path: Path, shard: dict, itemsize: int) -> None:
    if not path.is_file():
        raise ValueError(f"shard {path} is missing (the manifest lists it); rerun dm-prepare-data")
    if shard["tokens"] <= 0:
        raise ValueError(f"shard {path} holds no tokens (manifest: {shard['tokens']}); rerun dm-prepare-data")
    if path.stat().st_size != shard["tokens"] * itemsize:
        raise ValueError(f"shard {path} has the wrong size: {path.stat().st_size} bytes, the manifest says "
                         f"{shard['tokens']} tokens x {itemsize} bytes; rerun dm-prepare-data")


def _scan(path: Path, dtype: np.dtype) -> tuple[str, int]:
    """sha256 of the file and its largest token id, in one pass of 4 MiB blocks."""
    digest, largest = hashlib.sha256(), -1
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
            largest = max(largest, int(np.frombuffer(block, dtype=dtype).max()))
    return digest.hexdigest(), largest


def verify(folder: str | Path) -> None:
    """Check every shard's size, sha256 and token ids (< the manifest's vocab_size) against the manifest;
    ValueError naming the first bad shard.

    A shard found good is remembered in ``.verified.json`` with its size and mtime and not hashed again while both
    stay the same (a rewritten or edited file gets a new mtime), so several runs over one data folder hash it once."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    dtype = np.dtype(manifest["dtype"])
    cache_path = folder / VERIFIED
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    fresh = {}
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            path = folder / shard["file"]
            _check_size(path, shard, dtype.itemsize)
            stat = path.stat()
            key = [stat.st_size, stat.st_mtime_ns, shard["sha256"]]
            if cache.get(shard["file"]) == key:
                fresh[shard["file"]] = key
                continue
            sha256, largest = _scan(path, dtype)
            if sha256 != shard["sha256"]:
                raise ValueError(f"shard {path} does not match its sha256 in the manifest (corrupt or changed since "
                                 f"dm-prepare-data wrote it)")
            if largest >= manifest["vocab_size"]:
                raise ValueError(f"shard {path} holds token id {largest}, outside the vocabulary of "
                                 f"{manifest['vocab_size']} ids in the manifest")
            fresh[shard["file"]] = key
    if fresh != cache:
        try:  # a read-only data folder is verified every time instead
            write_text(cache_path, json.dumps(fresh, indent=1) + "\n")
        except OSError:
            pass


def open_split(folder: str | Path, split: str) -> list[np.memmap]:
    """Memory-map every shard of ``split`` read-only, in manifest order."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if split not in manifest["splits"]:
        raise ValueError(f"data folder {folder} has no split {split!r} (has {sorted(manifest['splits'])})")
    dtype = np.dtype(manifest["dtype"])
    shards = manifest["splits"][split]["shards"]
    for shard in shards:
        _check_size(folder / shard["file"], shard, dtype.itemsize)
    return [np.memmap(folder / s["file"], dtype=dtype, mode="r", shape=(s["tokens"],)) for s in shards]
