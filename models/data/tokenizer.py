"""A byte-level BPE tokenizer trained on the offline corpus, saved as a transformers tokenizer folder.

Byte-level (GPT-2 style) so that every string is encodable without an unknown token; the merges are learnt with the
``tokenizers`` Rust trainer. The vocabulary must reach at least 8192 entries: lm-eval's RULER variable-tracking task
generates text until the tokenizer produces a target and loops forever on a weak one, so a corpus too small to learn
8192 entries is an error, not a warning. The folder holds ``<|bos|>``, ``<|eos|>`` and ``<|pad|>`` and loads offline
with ``AutoTokenizer.from_pretrained``. No special token is inserted by ``encode``; the shard writer appends
``<|eos|>`` after each document itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
MIN_VOCAB = 8192


@dataclass
class TokenizerConfig:
    """Byte-level BPE training settings."""

    vocab_size: int = 8192
    """Target vocabulary size, special tokens included (>= 8192)."""
    min_frequency: int = 2
    """A pair must occur this often to be merged."""


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
    """Learn a byte-level BPE of ``config.vocab_size`` entries from ``texts``; ValueError if it falls short."""
    if config.vocab_size < MIN_VOCAB:
        raise ValueError(f"tokenizer.vocab_size must be >= {MIN_VOCAB} (RULER needs it), got {config.vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() < MIN_VOCAB:
        raise ValueError(f"the corpus only supports {tok.get_vocab_size()} BPE entries (< {MIN_VOCAB}); "
                         "raise corpus.max_bytes or lower tokenizer.min_frequency")
    return tok


def save_tokenizer(tok: Tokenizer, folder: str | Path) -> None:
    """Write ``tok`` as a transformers tokenizer folder (tokenizer.json + tokenizer_config.json + special tokens)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   clean_up_tokenization_spaces=False)
    fast.save_pretrained(str(folder))
