"""Build a data folder (tokenizer, train/val token shards, manifest, held-out documents) from one config.

Two sources share everything after the documents: ``offline`` (the installed-Python corpus and a BPE trained on it)
and ``hub`` (a streamed dataset and a named tokenizer). The folder is assembled under a temporary sibling name and
renamed into place when complete, so a crashed build never leaves a folder that looks usable.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from tqdm.auto import tqdm

from deltamatch.models.data.corpus import CorpusConfig, build_corpus
from deltamatch.models.data.hub import HubConfig, check_reachable, load_tokenizer, split_documents, stream_documents
from deltamatch.models.data.shards import ShardWriter, token_dtype, write_manifest
from deltamatch.models.data.tokenizer import BOS, EOS, PAD, TokenizerConfig, save_tokenizer, train_tokenizer


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


def _hub(tmp: Path, config: PrepareConfig) -> tuple[dict[str, int], int, dict[str, ShardWriter], dict]:
    check_reachable(config.hub)
    tok = load_tokenizer(config.hub)
    tok.save_pretrained(str(tmp / "tokenizer"))

    def encode(texts: list[str]) -> list[list[int]]:
        return tok(texts, add_special_tokens=False)["input_ids"]

    pairs = split_documents(stream_documents(config.hub, config.seed), config.hub, config.seed)
    writers = write_splits(tmp, encode, len(tok), tok.eos_token_id, pairs, config, config.hub.max_train_tokens,
                           config.hub.batch_docs)
    special = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    return special, len(tok), writers, {"kind": "hub", **asdict(config.hub)}


def prepare(config: PrepareConfig) -> dict:
    """Build the data folder ``config.out_dir``; returns its manifest."""
    out = Path(config.out_dir)
    tmp = out.with_name(f".{out.name}.partial{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        special, vocab_size, writers, source = (_offline if config.source == "offline" else _hub)(tmp, config)
        manifest = write_manifest(tmp, vocab_size=vocab_size, special=special, seed=config.seed, source=source,
                                  splits=writers)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest
