"""``dm-model-info NAME [--set KEY=VALUE ...]``: parameter counts and layer pattern of a named size, as JSON.

Counted on the meta device, so the 5.29B model costs nothing. ``non_embedding_params`` leaves out the token embedding
and the (untied) LM head.
"""

import argparse
import json
import sys

import torch

from deltamatch.models.modeling_hybrid import HybridForCausalLM
from deltamatch.models.sizes import get_config, list_configs


def count_parameters(config) -> dict:
    """Parameter counts of the model for ``config``, built on the meta device."""
    with torch.device("meta"):
        model = HybridForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    return {"params": total, "non_embedding_params": total - embedding}


def model_info(name: str, **overrides) -> dict:
    config = get_config(name, **overrides)
    return {
        "name": name,
        **count_parameters(config),
        "layer_pattern": config.layer_pattern,
        "attention_layers": config.attention_layer_ids,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
    }


def _parse_override(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare string such as attn_method=matched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dm-model-info", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=list_configs(), help="model size")
    parser.add_argument("--set", dest="overrides", action="append", default=[], type=_parse_override,
                        metavar="KEY=VALUE", help="config override (JSON value), repeatable")
    args = parser.parse_args(argv)
    try:
        info = model_info(args.name, **dict(args.overrides))
    except ValueError as err:
        print(f"dm-model-info: error: {err}", file=sys.stderr)
        return 2
    json.dump(info, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
