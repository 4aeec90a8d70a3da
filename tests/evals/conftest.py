"""A tiny trained deltamatch checkpoint and data folder, built once per session from public interfaces only.

Tokenizer: byte-level BPE trained here with ``tokenizers`` on standard-library docstrings. Model:
``deltamatch.models.get_config("tiny")`` at that vocabulary, a few plain-torch AdamW steps on the same text (enough to
move it off its initialisation; this is a fixture, not the trainer), saved with ``save_pretrained`` beside the
tokenizer, as dm-train's ``final/`` is. The data folder holds ``val_docs.jsonl`` of held-out docstrings.
"""

import importlib
import json

import pytest
import torch

MODULES = ("json", "argparse", "collections", "functools", "itertools", "re", "textwrap", "pathlib", "typing",
           "dataclasses", "unittest", "logging", "subprocess", "threading", "asyncio", "csv", "random", "statistics",
           "decimal", "datetime", "calendar", "heapq", "string", "difflib", "inspect", "enum", "email", "zipfile")


def docstrings() -> list[str]:
    docs = set()
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in dir(module):
            doc = getattr(getattr(module, attr), "__doc__", None)
            if isinstance(doc, str) and len(doc) > 300:
                docs.add(doc.strip())
    return sorted(docs)


def train_tokenizer(texts: list[str], folder) -> "PreTrainedTokenizerFast":  # noqa: F821
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<|pad|>")
    fast.save_pretrained(folder)
    return fast


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """(checkpoint folder, data folder) of a tiny hybrid trained for a few steps."""
    from deltamatch.models import HybridForCausalLM, get_config

    root = tmp_path_factory.mktemp("tiny")
    docs = docstrings()
    train_docs, val_docs = docs[: -len(docs) // 5], docs[-len(docs) // 5:]
    data = root / "data"
    data.mkdir()
    with (data / "val_docs.jsonl").open("w") as fh:
        fh.writelines(json.dumps({"text": d}) + "\n" for d in val_docs)
    ckpt = root / "ckpt"
    tok = train_tokenizer(train_docs, data / "tokenizer")
    torch.manual_seed(0)
    config = get_config("tiny", vocab_size=len(tok), eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                        pad_token_id=tok.pad_token_id)
    model = HybridForCausalLM(config)
    ids = torch.tensor(tok("\n\n".join(train_docs)).input_ids[: 8 * 128]).view(8, 128)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(4):
        batch = ids[2 * (step % 4): 2 * (step % 4) + 2]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    return ckpt, data
