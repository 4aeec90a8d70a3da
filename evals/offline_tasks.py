"""Local evaluation data built from the held-out documents of the default corpus, deterministically.

``dm-prepare-data`` writes ``val_docs.jsonl`` (one ``{"text": ...}`` per held-out document). Two lm-eval tasks in
``evals/tasks/offline/`` read what this module derives from it:

* ``dm_heldout_ppl`` — the first documents, cut at a word boundary, scored by rolling log-likelihood (word and byte
  perplexity, bits per byte), exactly as lm-eval scores WikiText.
* ``dm_lastword`` — a LAMBADA-style cloze: a passage of prose without its final word, and four candidate words, the
  true one and three drawn from the passage itself (LAMBADA's answers mostly occur earlier in the passage, so words
  from the context are the plausible distractors). lm-eval scores each candidate as the passage's continuation.

The documents come in the order the data preparation wrote them (a seeded shuffle), and every choice here is drawn
from ``random.Random(seed)`` walking them in that order, so the same data folder and seed give the same files.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from deltamatch.atomic import write_text

WORD = re.compile(r"[A-Za-z]{3,}")
TRAILING = re.compile(r"[\s\"'.,;:!?)\]]+$")


@dataclass
class OfflineDataConfig:
    """How the local tasks are cut from the held-out documents."""

    seed: int = 1234
    """Seed for distractor choice and answer position."""
    heldout_docs: int = 64
    """Documents kept for held-out perplexity."""
    heldout_max_chars: int = 2000
    """Cut each perplexity document at the last space before this many characters."""
    lastword_items: int = 200
    """Cloze items to build (fewer if the documents run out)."""
    min_words: int = 24
    """A passage must have at least this many words."""
    max_context_words: int = 160
    """Keep at most this many words of context before the target."""
    min_alpha_share: float = 0.7
    """Share of whitespace tokens that must be plain words: skips code, tables and lists."""
    n_choices: int = 4
    """Candidates per item, the true word included."""


def read_val_docs(data_dir: str | Path) -> list[str]:
    """The held-out documents of a dm-prepare-data folder."""
    path = Path(data_dir) / "val_docs.jsonl"
    if not path.is_file():
        raise ValueError(f"no val_docs.jsonl in data folder {data_dir} (run dm-prepare-data first)")
    with path.open() as fh:
        docs = [json.loads(line)["text"] for line in fh if line.strip()]
    if not docs:
        raise ValueError(f"{path} holds no documents")
    return docs


def heldout_rows(docs: list[str], cfg: OfflineDataConfig) -> list[dict]:
    rows = []
    for text in docs[: cfg.heldout_docs]:
        if len(text) > cfg.heldout_max_chars:
            cut = text.rfind(" ", 0, cfg.heldout_max_chars)
            text = text[: cut if cut > 0 else cfg.heldout_max_chars]
        rows.append({"text": text})
    return rows


def _cloze(passage: str, cfg: OfflineDataConfig, rng: random.Random) -> dict | None:
    """One cloze item from a paragraph, or None when the paragraph is not prose ending in a word."""
    tokens = passage.split()
    if len(tokens) < cfg.min_words:
        return None
    if sum(bool(WORD.fullmatch(TRAILING.sub("", t))) for t in tokens) < cfg.min_alpha_share * len(tokens):
        return None
    target = TRAILING.sub("", tokens[-1])
    if not WORD.fullmatch(target):
        return None
    context_tokens = tokens[:-1][-cfg.max_context_words:]
    pool = sorted({w for w in WORD.findall(" ".join(context_tokens)) if w.lower() != target.lower()})
    if len(pool) < cfg.n_choices - 1:
        return None
    choices = rng.sample(pool, cfg.n_choices - 1)
    gold = rng.randrange(cfg.n_choices)
    choices.insert(gold, target)
    return {"context": " ".join(context_tokens), "choices": choices, "gold": gold}


def lastword_rows(docs: list[str], cfg: OfflineDataConfig) -> list[dict]:
    rng = random.Random(cfg.seed)
    rows = []
    for text in docs:
        for passage in re.split(r"\n\s*\n", text):
            item = _cloze(passage.strip(), cfg, rng)
            if item is not None:
                rows.append(item)
                if len(rows) == cfg.lastword_items:
                    return rows
    if not rows:
        raise ValueError("no held-out paragraph qualifies for the last-word task; lower min_words or add documents")
    return rows


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    """Write ``rows`` as JSON lines, atomically."""
    write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return Path(path)


def build_offline_data(data_dir: str | Path, out_dir: str | Path,
                       cfg: OfflineDataConfig | None = None) -> dict[str, str]:
    """Write ``lastword.jsonl`` and ``heldout.jsonl`` under ``out_dir``; returns the task metadata naming them."""
    cfg = cfg or OfflineDataConfig()
    docs = read_val_docs(data_dir)
    out_dir = Path(out_dir)
    return {
        "dm_lastword_jsonl": str(write_jsonl(lastword_rows(docs, cfg), out_dir / "lastword.jsonl")),
        "dm_heldout_jsonl": str(write_jsonl(heldout_rows(docs, cfg), out_dir / "heldout.jsonl")),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the offline suite's local task data from val_docs.jsonl.")
    parser.add_argument("--data", required=True, help="dm-prepare-data folder holding val_docs.jsonl")
    parser.add_argument("--out", required=True, help="folder for lastword.jsonl and heldout.jsonl")
    parser.add_argument("--seed", type=int, default=OfflineDataConfig.seed)
    args = parser.parse_args(argv)
    paths = build_offline_data(args.data, args.out, OfflineDataConfig(seed=args.seed))
    print(json.dumps(paths, indent=1))


if __name__ == "__main__":
    main()
