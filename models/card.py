"""The model card of a published checkpoint, built with ``huggingface_hub.ModelCard`` / ``ModelCardData``.

The metadata block carries what the Hub indexes: license, language, library and pipeline, tags, the training
``datasets`` (a Hub corpus; the offline corpus has no Hub id), ``base_model`` (for a run initialised from another
published repo), and a ``model-index`` with every numeric dm-eval result and the validation cross-entropy. The body
says what the model is (architecture, attention method), what it was trained on, its metrics, how to load it (which
transformers it needs), its limitations (a ``tiny`` model is a few-million-parameter toy) and the paper.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from deltamatch.methods import METHODS

PAPER_URL = "https://arxiv.org/abs/2609.37852"
TRANSFORMERS_REQUIREMENT = "transformers>=5.0,<6"
TOY_SIZES = ("tiny",)



def _method_text(method: str) -> str:
    """The registry's description of ``method`` (a checkpoint of a method this version no longer knows says so)."""
    known = METHODS.get(method)
    return known.description if known else "not a method of this deltamatch version (see deltamatch.methods)."


def _architecture(config: dict, params: int) -> str:
    pattern = config.get("layer_pattern") or []
    counts = ", ".join(f"{pattern.count(kind)} {kind}" for kind in dict.fromkeys(pattern))
    lines = [f"- parameters: {params:,} ({params / 1e6:.1f}M)",
             f"- blocks: {config.get('num_hidden_layers')} ({counts}), hidden size {config.get('hidden_size')}, "
             f"SwiGLU MLP {config.get('intermediate_size')}, vocabulary {config.get('vocab_size')}"]
    if any(kind in ("gqa", "mla") for kind in pattern):
        lines.append(f"- softmax attention ({config.get('attn_mixer')}): {config.get('num_attention_heads')} query / "
                     f"{config.get('num_key_value_heads')} key-value heads of dim {config.get('head_dim')}, "
                     f"QK-RMSNorm {'on' if config.get('qk_norm') else 'off'}, {'RoPE' if config.get('rope') else 'NoPE'}")
    return "\n".join(lines)


def _data(summary: dict | None, manifest: dict | None) -> str:
    lines = []
    if summary and isinstance(summary.get("tokens"), int):
        lines.append(f"- trained on {summary['tokens']:,} tokens ({summary.get('steps')} steps, seed {summary.get('seed')})")
    if manifest:
        source = manifest.get("source", {})
        described = ", ".join(f"{k} {v}" for k, v in source.items() if isinstance(v, (str, int, float)) and v != "")
        lines.append(f"- corpus: {described or 'not recorded'}; tokenizer vocabulary {manifest.get('vocab_size')}")
        for split, info in manifest.get("splits", {}).items():
            lines.append(f"- {split} split: {info.get('tokens', 0):,} tokens, {info.get('documents', 0):,} documents")
    return "\n".join(lines) or "- not recorded (pass --summary and --data to dm-publish)"


def _metrics(summary: dict | None, evals: list[dict]) -> str:
    lines = []
    if summary:
        lines.append(f"- validation cross-entropy: {summary['final_val_loss']:.4f}")
    for result in evals:
        lines.append(f"- `{result['suite']}` suite (lm-eval {result.get('lm_eval_version')}): average "
                     f"{result['average']:.4f}")
        for task, metrics in result.get("tasks", {}).items():
            shown = ", ".join(f"{m} {v:.4f}" for m, v in metrics.items() if isinstance(v, (int, float)))
            lines.append(f"  - {task}: {shown}")
    return "\n".join(lines) or "- none were given to dm-publish"


def read_citation(path: str | Path) -> str:
    """The paper's BibTeX from ``path``: a ``.bib`` file, or a YAML file with a ``citation`` key (the pipeline passes
    ``reports/paper_reported.yaml``, the one place the citation is written)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--citation: no file {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        data = yaml.safe_load(text)
        if not isinstance(data, dict) or not isinstance(data.get("citation"), str):
            raise ValueError(f"--citation: {path} has no top-level 'citation' string")
        text = data["citation"]
    if not text.strip().startswith("@"):
        raise ValueError(f"--citation: {path} does not hold a BibTeX entry (starting with '@')")
    return text.strip()


def eval_results(summary: dict | None, evals: list[dict], manifest: dict | None):
    """The ``model-index`` entries: validation cross-entropy, then every numeric metric of every dm-eval task."""
    from huggingface_hub import EvalResult

    results = []
    if summary and isinstance(summary.get("final_val_loss"), (int, float)):
        corpus = ((manifest or {}).get("source") or {}).get("dataset") or "held-out validation split"
        results.append(EvalResult(task_type="text-generation", dataset_type=corpus, dataset_name=corpus,
                                  dataset_split="validation", metric_type="cross_entropy",
                                  metric_name="validation cross-entropy", metric_value=summary["final_val_loss"]))
    for result in evals:
        for task, metrics in sorted(result.get("tasks", {}).items()):
            for metric, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    results.append(EvalResult(task_type="text-generation", dataset_type=task, dataset_name=task,
                                              metric_type=metric, metric_value=value,
                                              metric_name=f"{metric} (dm-eval {result.get('suite')} suite, lm-eval "
                                                          f"{result.get('lm_eval_version')})"))
    return results


def _limitations(size: str, params: int) -> str:
    lines = []
    if size in TOY_SIZES or params < 50_000_000:
        lines.append(f"- **This is a toy.** A `{size}` model ({params / 1e6:.1f}M parameters) trained for a few "
                     "hundred steps on a small corpus, built to exercise the pipeline end to end. It does not produce "
                     "useful text, and its metrics say nothing about the paper's 569M-5.29B models.")
    lines += ["- A research checkpoint for comparing attention numerics, not an instruction-tuned or safety-tuned model;"
              " it continues text and may reproduce biases and errors of its training data.",
              "- Loading runs the repository's model code (`trust_remote_code=True`): exact attention and the "
              "pure-PyTorch Gated DeltaNet everywhere; flash-linear-attention's kernels when installed on a GPU. "
              "Training it further with an FP8 attention method needs the deltamatch kernels."]
    return "\n".join(lines)


def model_card(repo_id: str, config: dict, params: int, summary: dict | None, evals: list[dict],
               manifest: dict | None = None, base_model: str | None = None, citation: str | None = None):
    """The Hub repo's README.md as a ``huggingface_hub.ModelCard`` (``str(card)`` is the file's text); ``citation``:
    the paper's BibTeX (``read_citation``), else the card links the paper only."""
    import transformers
    from huggingface_hub import ModelCard, ModelCardData

    method = config.get("attn_method", "unknown")
    size = (summary or {}).get("size", "hybrid")
    source = (manifest or {}).get("source") or {}
    name = repo_id.split("/")[-1]
    data = ModelCardData(
        model_name=name, license="apache-2.0", language="en", library_name="transformers",
        pipeline_tag="text-generation", tags=["deltamatch", "fp8", "gated-deltanet", "hybrid", method],
        datasets=[source["dataset"]] if source.get("kind") == "hub" and source.get("dataset") else None,
        base_model=base_model, eval_results=eval_results(summary, evals, manifest) or None,
    )
    usage = ("```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
             f'model = AutoModelForCausalLM.from_pretrained("{repo_id}", trust_remote_code=True)\n'
             f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")\n```\n\n'
             f"Needs `{TRANSFORMERS_REQUIREMENT}` and PyTorch (exported with transformers "
             f"{transformers.__version__}); nothing else: the model code in this repository is self-contained.")
    sections = [
        f"# {name}",
        f"A `{size}` Gated-DeltaNet/attention hybrid language model trained with the deltamatch reproduction harness "
        f"of *Delta-Matching: Closing the Final Gap of Native 8-bit Training for LLMs* ([arXiv 2609.37852]({PAPER_URL})).",
        "## Architecture", _architecture(config, params),
        "## Attention method", f"`{method}`: {_method_text(method)}",
        "## Training data", _data(summary, manifest),
        "## Metrics", _metrics(summary, evals),
        "## Usage", usage,
        "## Limitations", _limitations(size, params),
        "## Citation", f"Paper: {PAPER_URL}" + (f"\n\n```bibtex\n{citation}\n```" if citation else ""),
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")
