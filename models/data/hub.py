"""The cluster data path: a Hub dataset streamed with ``datasets`` and a Hub tokenizer, both named in config.

The paper trains on Nemotron-CC with a 32k-vocabulary tokenizer. Nothing is downloaded in full: the dataset is
streamed (optionally shuffled through a seeded buffer), documents go to the validation split with probability
``val_fraction`` decided by the seed, and streaming stops once ``max_train_tokens`` training tokens are written. The
shards and manifest have the offline format (``shards``).

Local sources work too and need no network: a packaged builder with files (``dataset: json`` + ``data_files``) or a
local folder, and a local tokenizer folder. A Hub name while the Hub is unreachable (``HF_HUB_OFFLINE=1``, or no
route to the host) fails at once with a ``ValueError`` naming the dataset or tokenizer, instead of hanging in retries.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlparse

# ``datasets`` packaged builders that read local files without the Hub.
LOCAL_BUILDERS = {"json", "csv", "text", "parquet", "arrow"}


@dataclass
class HubConfig:
    """Hub dataset and tokenizer for the cluster data path."""

    dataset: str = ""
    """Dataset repo id (``nvidia/Nemotron-CC-v2``), a local folder, or a packaged builder (``json``) + data_files."""
    name: str | None = None
    """Dataset configuration name (subset)."""
    split: str = "train"
    """Split to stream."""
    data_files: list[str] = field(default_factory=list)
    """Files for a packaged builder such as ``json``."""
    text_field: str = "text"
    """Column holding the document text."""
    tokenizer: str = ""
    """Tokenizer repo id or local folder (the paper uses a 32k vocabulary)."""
    max_train_tokens: int = 10_000_000
    """Stop once this many training tokens are written."""
    val_fraction: float = 0.001
    """Probability that a document goes to the validation split."""
    max_val_docs: int = 2000
    """Validation documents kept at most (later ones go to train)."""
    shuffle_buffer: int = 10_000
    """Seeded shuffle buffer of the stream (0 keeps the stream order)."""
    batch_docs: int = 256
    """Documents tokenised per batch."""


def _is_local(name: str) -> bool:
    return name in LOCAL_BUILDERS or os.path.isdir(name)


def _hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the Hub endpoint accepts a TCP connection (a cheap check before ``datasets`` retries for minutes)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def check_reachable(config: HubConfig) -> None:
    """ValueError naming the dataset/tokenizer that needs the Hub when the Hub cannot be reached."""
    if not config.dataset:
        raise ValueError("hub.dataset is empty: name a Hub dataset (e.g. nvidia/Nemotron-CC-v2) or use source: offline")
    if not config.tokenizer:
        raise ValueError("hub.tokenizer is empty: name a Hub tokenizer or a local tokenizer folder")
    remote = [f"{kind} {name!r}" for kind, name in (("dataset", config.dataset), ("tokenizer", config.tokenizer))
              if not _is_local(name)]
    if remote and not _hub_reachable():
        raise ValueError(f"the Hugging Face Hub is unreachable (offline or no network), but {' and '.join(remote)} "
                         "must be downloaded from it; use `source: offline` or local paths")


def load_tokenizer(config: HubConfig):
    """The configured tokenizer, with bos/pad falling back to eos when the tokenizer lacks them."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(config.tokenizer)
    except Exception as err:  # transformers raises OSError, ValueError or HTTP errors depending on the cause
        raise ValueError(f"cannot load tokenizer {config.tokenizer!r}: {err}") from err
    if tok.eos_token is None:
        raise ValueError(f"tokenizer {config.tokenizer!r} has no eos token; documents could not be separated")
    if tok.bos_token is None:
        tok.bos_token = tok.eos_token
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def open_stream(config: HubConfig, seed: int):
    """The configured dataset as a streaming ``datasets.IterableDataset`` in a seeded order. It is stateful:
    ``state_dict()`` says where iteration stands and ``load_state_dict()`` resumes there (the rows that sat in the
    shuffle buffer at that point are not replayed)."""
    import datasets

    kwargs = {"data_files": config.data_files} if config.data_files else {}
    try:
        stream = datasets.load_dataset(config.dataset, config.name, split=config.split, streaming=True, **kwargs)
    except Exception as err:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ConnectionError)
        raise ValueError(f"cannot stream dataset {config.dataset!r} (name={config.name!r}, split={config.split!r}): "
                         f"{err}") from err
    if config.shuffle_buffer:
        stream = stream.shuffle(seed=seed, buffer_size=config.shuffle_buffer)
    return stream


def texts(stream, config: HubConfig) -> Iterator[str]:
    """The non-empty document texts of ``stream``."""
    for row in stream:
        if config.text_field not in row:
            raise ValueError(f"dataset {config.dataset!r} has no column {config.text_field!r} "
                             f"(has {sorted(row)}); set hub.text_field")
        text = row[config.text_field]
        if isinstance(text, str) and text.strip():
            yield text


def stream_documents(config: HubConfig, seed: int) -> Iterator[str]:
    """Texts of the configured dataset, streamed in a seeded order."""
    return texts(open_stream(config, seed), config)


class DocumentSplitter:
    """Sends each document to ``val`` with probability ``val_fraction`` until ``max_val_docs`` are taken, else to
    ``train``; seeded, and with a JSON state so that a resumed build goes on with the same decisions."""

    def __init__(self, config: HubConfig, seed: int, state: dict | None = None):
        self.config, self.rng, self.n_val = config, random.Random(seed + 1), 0
        if state is not None:
            version, internal, gauss = state["rng"]
            self.rng.setstate((version, tuple(internal), gauss))
            self.n_val = state["n_val"]

    def __call__(self, text: str) -> str:
        if self.n_val < self.config.max_val_docs and self.rng.random() < self.config.val_fraction:
            self.n_val += 1
            return "val"
        return "train"

    def state(self) -> dict:
        return {"rng": self.rng.getstate(), "n_val": self.n_val}


def split_documents(docs: Iterator[str], config: HubConfig, seed: int) -> Iterator[tuple[str, str]]:
    """(split, text) pairs: each document goes to ``val`` with probability ``val_fraction`` until it is full."""
    splitter = DocumentSplitter(config, seed)
    for text in docs:
        yield splitter(text), text
