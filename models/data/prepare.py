"""Build a data folder (tokenizer, train/val token shards, manifest, held-out documents) from one config.

Two sources share everything after the documents: ``offline`` (the installed-Python corpus and a BPE trained on it)
and ``hub`` (a streamed dataset and a named tokenizer). The folder is assembled under a temporary sibling name and
renamed into place when complete, so a crashed build never leaves a folder that looks usable. The Hub path (30B
tokens for the paper) is resumable: its partial folder keeps a ``progress.json`` position, saved after every batch
that completes a train shard, and a rerun with the same config goes on from there.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from tqdm.auto import tqdm

from deltamatch.models.data.corpus import CorpusConfig, build_corpus
from deltamatch.atomic import write_json
from deltamatch.models.data.hub import DocumentSplitter, HubConfig, check_reachable, load_tokenizer, open_stream, texts
from deltamatch.models.data.shards import ShardWriter, token_dtype, write_manifest
from deltamatch.models.data.tokenizer import BOS, EOS, PAD, TokenizerConfig, save_tokenizer, train_tokenizer


PROGRESS = "progress.json"


@dataclass
class PrepareConfig:
    """What ``dm-prepare-data`` builds."""

    out_dir: str
    """Data folder to write (replaced atomically when complete)."""
    seed: int = 0
    """Seed of the corpus order, the validation split and the stream shuffle."""
    source: Literal["offline", "hub"] = "offline"
    """``offline``: installed-Python corpus + trained BPE; ``hub``: streamed dataset + named tokenizer."""
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    """Offline corpus settings."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Offline tokenizer settings."""
    hub: HubConfig = field(default_factory=HubConfig)
    """Hub dataset and tokenizer settings."""
    shard_tokens: int = 1 << 24
    """Tokens per shard file."""


def _encoded(docs: Iterable[tuple[str, str]], encode: Callable[[list[str]], list[list[int]]],
             batch_docs: int) -> Iterator[tuple[str, str, list[int]]]:
    """(split, text, ids) for each document, encoding ``batch_docs`` texts per call (the Rust side parallelises)."""
    docs = iter(docs)
    while batch := list(itertools.islice(docs, batch_docs)):
        for (split, text), ids in zip(batch, encode([text for _, text in batch])):
            yield split, text, ids


def write_splits(tmp: Path, encode: Callable[[list[str]], list[list[int]]], vocab_size: int, eos_id: int,
                 docs: Iterable[tuple[str, str]], config: PrepareConfig, max_train_tokens: int | None = None,
                 batch_docs: int = 256) -> dict[str, ShardWriter]:
    """Tokenise (split, text) pairs with ``encode`` into shard writers; keeps held-out texts in val_docs.jsonl."""
    writers = {s: ShardWriter(tmp / s, token_dtype(vocab_size), eos_id, config.shard_tokens) for s in ("train", "val")}
    bar = tqdm(total=max_train_tokens, unit="tok", desc="tokenise", leave=False)
    with (tmp / "val_docs.jsonl").open("w") as val_docs:
        for split, text, ids in _encoded(docs, encode, batch_docs):
            if max_train_tokens is not None and writers["train"].tokens >= max_train_tokens:
                break
            writers[split].add(ids)
            if split == "val":
                val_docs.write(json.dumps({"text": text}) + "\n")
            else:
                bar.update(len(ids) + 1)
    bar.close()
    if writers["val"].documents == 0 or writers["train"].documents == 0:
        raise ValueError(f"empty split: {writers['train'].documents} train / {writers['val'].documents} val documents")
    return writers


def _offline(tmp: Path, config: PrepareConfig) -> tuple[dict[str, int], int, dict[str, ShardWriter], dict]:
    corpus = build_corpus(config.corpus, config.seed)
    tok = train_tokenizer(corpus.train, config.tokenizer)
    save_tokenizer(tok, tmp / "tokenizer")
    special = {"bos": tok.token_to_id(BOS), "eos": tok.token_to_id(EOS), "pad": tok.token_to_id(PAD)}

    def encode(texts: list[str]) -> list[list[int]]:  # the Rust tokenizer directly: same ids, no transformers import
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    docs = [("train", t) for t in corpus.train] + [("val", t) for t in corpus.val]
    writers = write_splits(tmp, encode, tok.get_vocab_size(), special["eos"], docs, config)
    return special, tok.get_vocab_size(), writers, {"kind": "offline", "files_read": corpus.sources,
                                                    **asdict(config.corpus)}


def _fingerprint(config: PrepareConfig) -> dict:
    """What a partial build must have been started with to be resumed (everything but where it goes)."""
    return json.loads(json.dumps({k: v for k, v in asdict(config).items() if k != "out_dir"}))


def _load_progress(tmp: Path, config: PrepareConfig) -> dict | None:
    """The saved position of a partial Hub build in ``tmp`` made from the same config, else None."""
    path = tmp / PROGRESS
    if not path.is_file():
        return None
    state = json.loads(path.read_text(encoding="utf-8"))
    if state.get("config") != _fingerprint(config):
        print(f"dm-prepare-data: {tmp} was started from another config; starting over", file=sys.stderr)
        return None
    return state


def _save_progress(tmp: Path, config: PrepareConfig, stream, splitter: DocumentSplitter,
                   writers: dict[str, ShardWriter], val_docs) -> None:
    val_docs.flush()
    state = {"config": _fingerprint(config), "stream": stream.state_dict(), "splitter": splitter.state(),
             "writers": {name: w.save_state() for name, w in writers.items()}, "val_docs_bytes": val_docs.tell()}
    write_json(tmp / PROGRESS, state)


def _hub(tmp: Path, config: PrepareConfig) -> tuple[dict[str, int], int, dict[str, ShardWriter], dict]:
    """Stream, split and tokenise the Hub dataset into ``tmp``, resumably: after every batch that completed a train
    shard the position (stream state, split RNG, writers, held-out documents) is saved to ``progress.json``, and a
    rerun with the same config goes on from there instead of from the first document."""
    check_reachable(config.hub)
    tok = load_tokenizer(config.hub)
    state = _load_progress(tmp, config)
    if state is None:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    tok.save_pretrained(str(tmp / "tokenizer"))
    stream = open_stream(config.hub, config.seed)
    splitter = DocumentSplitter(config.hub, config.seed, state["splitter"] if state else None)
    writers = {s: ShardWriter(tmp / s, token_dtype(len(tok)), tok.eos_token_id, config.shard_tokens)
               for s in ("train", "val")}
    val_path = tmp / "val_docs.jsonl"
    if state:
        stream.load_state_dict(state["stream"])
        for name, writer in writers.items():
            writer.load_state(state["writers"][name])
        os.truncate(val_path, state["val_docs_bytes"])
        print(f"dm-prepare-data: resuming {tmp} at {writers['train'].tokens:,} train tokens", file=sys.stderr)
    cap = config.hub.max_train_tokens
    docs = texts(stream, config.hub)
    bar = tqdm(total=cap, initial=writers["train"].tokens, unit="tok", desc="tokenise", leave=False)
    with val_path.open("a", encoding="utf-8") as val_docs:
        while writers["train"].tokens < cap and (batch := list(itertools.islice(docs, config.hub.batch_docs))):
            shards = len(writers["train"].shards)
            for text, ids in zip(batch, tok(batch, add_special_tokens=False)["input_ids"]):
                if writers["train"].tokens >= cap:
                    break
                split = splitter(text)
                writers[split].add(ids)
                if split == "val":
                    val_docs.write(json.dumps({"text": text}) + "\n")
                else:
                    bar.update(len(ids) + 1)
            if len(writers["train"].shards) > shards:
                _save_progress(tmp, config, stream, splitter, writers, val_docs)
    bar.close()
    if writers["val"].documents == 0 or writers["train"].documents == 0:
        raise ValueError(f"empty split: {writers['train'].documents} train / {writers['val'].documents} val documents")
    (tmp / PROGRESS).unlink(missing_ok=True)
    special = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    return special, len(tok), writers, {"kind": "hub", **asdict(config.hub)}


def prepare(config: PrepareConfig) -> dict:
    """Build the data folder ``config.out_dir``; returns its manifest. A Hub build that fails or is killed keeps its
    partial folder (``.<name>.partial``) and the next call with the same config resumes it."""
    out = Path(config.out_dir)
    hub = config.source == "hub"
    tmp = out.with_name(f".{out.name}.partial" if hub else f".{out.name}.partial{os.getpid()}")
    if not hub:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    try:
        special, vocab_size, writers, source = (_hub if hub else _offline)(tmp, config)
        manifest = write_manifest(tmp, vocab_size=vocab_size, special=special, seed=config.seed, source=source,
                                  splits=writers)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if not hub:
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest
