"""``dm-publish``: a trained checkpoint becomes a Hugging Face Hub model repo, with a model card.

    dm-publish --checkpoint results/default/runs/base/tiny/matched/s0/final --repo-id me/deltamatch-tiny-matched
    dm-publish ... --dry-run --out DIR        # build the exact folder that would be uploaded, offline

The folder holds what ``AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)`` needs: the safetensors
weights, ``config.json`` (+ ``generation_config.json``), the model code that ``save_pretrained`` copied beside them, the
tokenizer files, and ``README.md``: a model card with the architecture, the attention method, the training data, the
metrics (``summary.json`` of the run, and ``dm-eval`` results) and the paper's citation.

The Hub token is read from ``HF_TOKEN`` only, handed to ``huggingface_hub`` and nowhere else: it is never printed,
logged, put in the card or written to a file. A checkpoint or card that contains it anyway is refused before anything
is staged. The folder is staged in a temporary folder that is always removed: with ``--out`` it is renamed into place
once complete (after the upload, for a real one), and a real upload without ``--out`` leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

SHIPPED_SUFFIXES = (".safetensors", ".json", ".py", ".txt", ".model", ".jinja")
REQUIRED = ("config.json",)


METHOD_TEXT = {
    "bf16": "BF16 operands with FP32 accumulation: the paper's mixed-precision reference.",
    "stale": "naive FP8: all seven attention matmuls in FP8 (E4M3, FP32 block scales), the softmax-gradient δ from the "
             "saved BF16 output and the unquantised dO (FlashAttention's shortcut, stale under FP8).",
    "consistent": "FP8 attention with δ from the dequantised FP8 dO (the paper's consistent-dO ablation).",
    "matched": "Delta-Matching: FP8 attention whose δ_i = Σ_j P_ij dP̂_ij is recomputed from the unquantised P and "
               "the FP32 products of the FP8 operands, so each row of dS sums to zero before its FP8 cast.",
    "cudnn_fp8": "the cuDNN / Transformer Engine FP8 attention baseline (per-tensor scales).",
}


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


def model_card(repo_id: str, config: dict, params: int, summary: dict | None, evals: list[dict],
               manifest: dict | None = None) -> str:
    """The README.md of the Hub repo: front matter, architecture, method, data, metrics, usage and citation."""
    from deltamatch.reports.paper import load_paper

    citation = load_paper()[2].strip()
    method = config.get("attn_method", "unknown")
    size = (summary or {}).get("size", "hybrid")
    front = "\n".join(["---", "library_name: transformers", "license: apache-2.0", "pipeline_tag: text-generation",
                       "tags:", "  - deltamatch", "  - fp8", "  - gated-deltanet", "  - hybrid", f"  - {method}", "---"])
    usage = ("```python\nimport deltamatch.models  # registers the architecture (pip install deltamatch)\n"
             "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
             f'model = AutoModelForCausalLM.from_pretrained("{repo_id}", trust_remote_code=True)\n'
             f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")\n```')
    sections = [
        front, f"# {repo_id.split('/')[-1]}",
        f"A `{size}` Gated-DeltaNet/attention hybrid language model trained with the deltamatch reproduction harness "
        "of *Delta-Matching: Closing the Final Gap of Native 8-bit Training for LLMs* (arXiv 2609.37852).",
        "## Architecture", _architecture(config, params),
        "## Attention method", f"`{method}`: {METHOD_TEXT.get(method, 'see deltamatch.kernels.METHODS.')}",
        "## Training data", _data(summary, manifest),
        "## Metrics", _metrics(summary, evals),
        "## Usage", usage,
        "## Citation", f"```bibtex\n{citation}\n```",
    ]
    return "\n\n".join(sections) + "\n"


def checkpoint_files(checkpoint: Path) -> list[Path]:
    """The files of ``checkpoint`` that are shipped (never hidden or temporary files, never pickled weights)."""
    if not checkpoint.is_dir():
        raise ValueError(f"checkpoint folder not found: {checkpoint}")
    files = sorted(p for p in checkpoint.iterdir()
                   if p.is_file() and not p.name.startswith(".") and p.suffix in SHIPPED_SUFFIXES)
    names = {p.name for p in files}
    for name in REQUIRED:
        if name not in names:
            raise ValueError(f"{checkpoint}: no {name} (is this a dm-train final/ folder?)")
    if not any(p.suffix == ".safetensors" for p in files):
        raise ValueError(f"{checkpoint}: no *.safetensors weights")
    if "tokenizer_config.json" not in names:
        raise ValueError(f"{checkpoint}: no tokenizer (tokenizer_config.json); dm-train's export writes one")
    return files


def parameter_count(checkpoint: Path) -> int:
    """Parameters from the safetensors headers (shapes only; no tensor is loaded)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():
                count = 1
                for dim in fh.get_slice(name).get_shape():
                    count *= dim
                total += count
    return total


def _read_json(path: Path | None) -> dict | None:
    if path is None:
        return None
    if not path.is_file():
        raise ValueError(f"missing input file: {path}")
    return json.loads(path.read_text(encoding="utf-8"))


def _contains(path: Path, needle: bytes, chunk: int = 1 << 20) -> bool:
    """Whether ``needle`` occurs in the file at ``path``, read in chunks (weights can be many GB)."""
    keep = len(needle) - 1
    tail = b""
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            window = tail + block
            if needle in window:
                return True
            tail = window[-keep:] if keep else b""
    return False


def assert_secret_free(files: Path | list[Path], secret: str | None, card: str = "") -> None:
    """Refuse files (a list, or every file under a folder) or a card in which the token appears: it would be public
    once uploaded. The message names the file, never the token."""
    if not secret:
        return
    needle = secret.encode()
    paths = sorted(p for p in files.rglob("*") if p.is_file()) if isinstance(files, Path) else files
    for path in paths:
        if _contains(path, needle):
            raise ValueError(f"{path} contains the value of HF_TOKEN; refusing to publish it")
    if secret in card:
        raise ValueError("the model card (README.md) would contain the value of HF_TOKEN (from --summary, --evals or "
                         "--data); refusing to publish it")


def stage(files: list[Path], card: str, parent: Path | None = None) -> Path:
    """A new temporary folder (in ``parent``, else the system's temp folder) holding ``files`` and the card as
    README.md. The caller removes it; if staging fails it is removed here."""
    if parent is None:
        tmp = Path(tempfile.mkdtemp(prefix="dm-publish-"))
    else:  # a sibling of the output, for hard links and an atomic rename; mkdir (not mkdtemp) keeps the umask's mode
        tmp = parent / f".dm-publish-{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp"
        tmp.mkdir()
    try:
        for path in files:
            try:  # multi-GB weights: a hard link where the file system allows one, else a copy
                os.link(path, tmp / path.name)
            except OSError:
                shutil.copy2(path, tmp / path.name)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _move_into_place(staged: Path, out: Path) -> None:
    """Rename ``staged`` to ``out``, replacing what was there (moved aside first, so ``out`` is never half-built)."""
    old = None
    if out.exists() or out.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent)) / "old"
        os.replace(out, old)
    os.replace(staged, out)
    if old is not None:
        shutil.rmtree(old.parent, ignore_errors=True)


def build_folder(checkpoint: Path, out: Path, card: str, secret: str | None = None) -> Path:
    """Check the shipped files and the card for ``secret``, then link or copy them and write the card into ``out``,
    atomically (a sibling temp folder, renamed into place only when complete; removed otherwise)."""
    files = checkpoint_files(checkpoint)
    assert_secret_free(files, secret, card)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = stage(files, card, out.parent)
    try:
        _move_into_place(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return out


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def upload(folder: Path, repo_id: str, token: str, private: bool) -> str:
    """Create the model repo if needed and upload ``folder`` as one commit; returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder),
                             commit_message="Upload deltamatch checkpoint")
    return str(getattr(info, "commit_url", info))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dm-publish", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="dm-train's final/ folder")
    parser.add_argument("--repo-id", required=True, help="Hub model repo, <user or org>/<name>")
    parser.add_argument("--summary", help="the run's summary.json (default: beside the checkpoint)")
    parser.add_argument("--evals", nargs="*", default=[], help="dm-eval result JSON files for the card")
    parser.add_argument("--data", help="the dm-prepare-data folder (its manifest.json describes the corpus)")
    parser.add_argument("--dry-run", action="store_true", help="build the folder offline; upload nothing")
    parser.add_argument("--out", help="folder to build (required with --dry-run; with an upload, where the uploaded "
                        "folder is kept, else it is staged in a temporary folder and removed)")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    args = parser.parse_args(argv)
    token = os.environ.get("HF_TOKEN") or None
    try:
        if "/" not in args.repo_id or args.repo_id.count("/") != 1:
            raise ValueError(f"--repo-id must be <user or org>/<name>, got {args.repo_id!r}")
        if args.dry_run and not args.out:
            raise ValueError("--dry-run needs --out (the folder to build)")
        if not args.dry_run and token is None:
            raise ValueError("HF_TOKEN is not set; export a Hub token with write access, or use --dry-run")
        checkpoint = Path(args.checkpoint)
        summary_path = Path(args.summary) if args.summary else checkpoint.parent / "summary.json"
        summary = _read_json(summary_path) if args.summary or summary_path.is_file() else None
        evals = [_read_json(Path(p)) for p in args.evals]
        config = _read_json(checkpoint / "config.json")
        manifest = _read_json(Path(args.data) / "manifest.json") if args.data else None
        files = checkpoint_files(checkpoint)
        card = model_card(args.repo_id, config, parameter_count(checkpoint), summary, evals, manifest)
        assert_secret_free(files, token, card)  # before anything is written: a refused folder never exists
        out = Path(args.out) if args.out else None
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
        staged = stage(files, card, out.parent if out is not None else None)
        try:
            if not args.dry_run:
                try:
                    url = upload(staged, args.repo_id, token, args.private)
                except Exception as err:  # noqa: BLE001 -- the Hub's errors vary; report them without the token
                    print(f"dm-publish: error: upload to {args.repo_id} failed: {type(err).__name__}: "
                          f"{_redact(str(err), token)}", file=sys.stderr)
                    return 1
            if out is not None:
                _move_into_place(staged, out)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        if args.dry_run:
            print(f"dm-publish: dry run: {out} holds what would be uploaded to {args.repo_id}")
        else:
            kept = f" (the uploaded folder is {out})" if out is not None else ""
            print(f"dm-publish: uploaded to {args.repo_id}: {_redact(url, token)}{kept}")
    except ValueError as err:
        print(f"dm-publish: error: {_redact(str(err), token)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
