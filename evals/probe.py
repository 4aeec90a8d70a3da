"""``dm-probe``: the paper's Table 9 for one checkpoint — the softmax-gradient invariant on real activations.

For one held-out batch, every attention layer's core inputs ``q, k, v`` and output gradient ``dO`` are captured by
``deltamatch.models.instrument.capture_attention_io`` (one forward and backward of the LM loss), and
``deltamatch.kernels.measures.residual_summary`` replays that layer's backward under each δ (stale, consistent,
matched): the normalised row-sum residual of dS before and after its FP8 cast, and the dK column-sum share. Rows:
``layer, delta, before_cast, after_cast, dk_colsum``.

    dm-probe --checkpoint runs/tiny-matched/final --data data/default --out results/probe.csv
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from deltamatch.atomic import atomic_path
from deltamatch.config import load_with_flags
from deltamatch.evals.offline_tasks import read_val_docs
from deltamatch.kernels.measures import residual_summary
from deltamatch.models.instrument import capture_attention_io

COLUMNS = ["layer", "delta", "before_cast", "after_cast", "dk_colsum"]


@dataclass
class ProbeConfig:
    """Which held-out tokens the probe runs on."""

    batch_size: int = 2
    """Sequences in the batch."""
    seq_len: int = 256
    """Tokens per sequence."""


def heldout_batch(tokenizer, data_dir: str | Path, cfg: ProbeConfig) -> torch.Tensor:
    """The first ``batch_size x seq_len`` tokens of the held-out documents, joined by EOS, as ``(B, N)``."""
    need = cfg.batch_size * cfg.seq_len
    ids: list[int] = []
    for doc in read_val_docs(data_dir):
        ids += tokenizer(doc).input_ids + [tokenizer.eos_token_id]
        if len(ids) >= need:
            return torch.tensor(ids[:need]).view(cfg.batch_size, cfg.seq_len)
    raise ValueError(f"held-out documents in {data_dir} hold {len(ids)} tokens; the probe needs {need}")


def probe_rows(model, input_ids: torch.Tensor) -> pd.DataFrame:
    """Table 9 rows for ``model`` on ``input_ids`` (labels = inputs, HF shift convention)."""
    io = capture_attention_io(model, input_ids, input_ids)
    rows = [{"layer": layer, "delta": kind, **values}
            for layer, (q, k, v, do) in io.items()
            for kind, values in residual_summary(q, k, v, do, causal=True).items()]
    return pd.DataFrame(rows, columns=COLUMNS)


def load_checkpoint(checkpoint: str | Path):
    import deltamatch.models  # noqa: F401  (registers the auto classes)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise ValueError(f"checkpoint {checkpoint} is not a Hugging Face model folder (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    return model.train(), AutoTokenizer.from_pretrained(checkpoint)


def write_csv_atomic(frame: pd.DataFrame, path: str | Path) -> Path:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="dm-probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="Hugging Face model folder (dm-train's final/)")
    parser.add_argument("--data", required=True, help="dm-prepare-data folder holding val_docs.jsonl")
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--config", help="YAML file of ProbeConfig keys (batch_size, seq_len); flags override it")
    parser.add_argument("--batch-size", type=int,
                        help=f"held-out sequences in the batch (default {ProbeConfig.batch_size})")
    parser.add_argument("--seq-len", type=int, help=f"tokens per sequence (default {ProbeConfig.seq_len})")
    args = parser.parse_args(argv)
    try:
        cfg = load_with_flags(ProbeConfig, args.config, {"batch_size": args.batch_size, "seq_len": args.seq_len})
        model, tokenizer = load_checkpoint(args.checkpoint)
        batch = heldout_batch(tokenizer, args.data, cfg)
        frame = probe_rows(model, batch)
    except ValueError as err:
        raise SystemExit(f"dm-probe: error: {err}") from err
    write_csv_atomic(frame, args.out)
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
