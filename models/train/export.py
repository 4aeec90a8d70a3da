"""The final export: an HF folder (``save_pretrained`` weights, config and model code, plus the tokenizer) and
``summary.json``, both written atomically by rank 0.

Under FSDP the full state dict is gathered to rank 0's CPU and loaded into a fresh unsharded model, so the folder is the
same whatever the rank count. ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` loads it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from deltamatch.models.train.checkpoint import save_error
from deltamatch.models.train.distributed import Layout, barrier


def export_hf(model: nn.Module, tokenizer_dir: str | Path, out: str | Path, layout: Layout) -> Path | None:
    """Write ``out`` as an HF folder with the tokenizer of ``tokenizer_dir`` (call on every rank)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    out = Path(out)
    if layout.is_main:
        from transformers import AutoTokenizer

        from deltamatch.models import HybridForCausalLM
        from deltamatch.models.hub_code import write_model_code

        fresh = HybridForCausalLM(model.config)
        fresh.load_state_dict(state, strict=True)
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            fresh.save_pretrained(tmp)
            write_model_code(tmp)  # self-contained: the folder loads without deltamatch
            AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(tmp)
        except Exception as err:  # a full disk: the folder is named and the half-written copy deleted
            shutil.rmtree(tmp, ignore_errors=True)
            named = save_error(err, tmp, "the HF export")
            if named is not None:
                raise named from err
            raise
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    barrier(layout)
    return out if layout.is_main else None


def write_summary(path: str | Path, summary: dict) -> None:
    """Write ``summary.json`` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, path)


def check_hf_folder(folder: str | Path) -> None:
    """ValueError naming the folder or file if ``folder`` is missing or one of its safetensors files is not whole (a
    truncated copy fails here, not as an unnamed header error deep inside ``from_pretrained``)."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"checkpoint {folder} is not a folder")
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt") as fh:
                fh.keys()
        except (SafetensorError, OSError) as err:
            raise ValueError(f"weights file {file} is corrupt or truncated ({err})") from None
