"""``dm-publish``: a trained checkpoint becomes a Hugging Face Hub model repo, with a model card.

    dm-publish --checkpoint results/default/runs/base/tiny/matched/s0/final --repo-id me/deltamatch-tiny-matched
    dm-publish ... --dry-run --out DIR        # build the exact folder that would be uploaded, offline

The folder holds what ``AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)`` needs: the safetensors
weights, ``config.json`` (+ ``generation_config.json``), the model code that ``save_pretrained`` copied beside them, the
tokenizer files, and ``README.md``: a model card with the architecture, the attention method, the training data, the
metrics (``summary.json`` of the run, and ``dm-eval`` results) and the paper's citation.

The weights are shipped in BF16 by default (``--dtype fp32`` keeps them as trained), and the model code is replaced by
its self-contained copy (``hub_code``), so the repo loads without deltamatch. ``--repo-id NAME`` without a namespace
publishes under the token's own user (``whoami``).

The Hub token comes from ``huggingface_hub.get_token()`` (``HF_TOKEN``, else the token ``hf auth login`` stored), is
handed to ``huggingface_hub`` and nowhere else: it is never printed,
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

from deltamatch.models.card import model_card, read_citation
from deltamatch.models.hub_code import write_model_code

SHIPPED_SUFFIXES = (".safetensors", ".json", ".py", ".txt", ".model", ".jinja")
REQUIRED = ("config.json",)


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
            raise ValueError(f"{path} contains the Hub token; refusing to publish it")
    if secret in card:
        raise ValueError("the model card (README.md) would contain the Hub token (from --summary, --evals or "
                         "--data); refusing to publish it")


def stage(files: list[Path], card: str, parent: Path | None = None, dtype: str = "bf16") -> Path:
    """A new temporary folder (in ``parent``, else the system's temp folder) holding ``files`` (weights in ``dtype``),
    the self-contained model code and the card as README.md. The caller removes it; if staging fails it is removed
    here."""
    if parent is None:
        tmp = Path(tempfile.mkdtemp(prefix="dm-publish-"))
    else:  # a sibling of the output, for hard links and an atomic rename; mkdir (not mkdtemp) keeps the umask's mode
        tmp = parent / f".dm-publish-{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp"
        tmp.mkdir()
    try:
        for path in files:
            if path.suffix == ".safetensors" and dtype == "bf16":
                _write_bf16(path, tmp / path.name)
            elif path.name == "config.json" and dtype == "bf16":
                config = json.loads(path.read_text(encoding="utf-8"))
                config["dtype"] = "bfloat16"
                (tmp / path.name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            else:
                try:  # multi-GB weights: a hard link where the file system allows one, else a copy
                    os.link(path, tmp / path.name)
                except OSError:
                    shutil.copy2(path, tmp / path.name)
        write_model_code(tmp)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _write_bf16(source: Path, target: Path) -> None:
    """``source``'s tensors with every floating-point tensor cast to BF16 (half an FP32 checkpoint's size)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt") as fh:
        metadata = fh.metadata() or {}
        tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    tensors = {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in tensors.items()}
    save_file(tensors, str(target), metadata={**metadata, "format": "pt"})


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


def hub_token() -> str | None:
    """The Hub token as huggingface_hub finds it: ``HF_TOKEN``, else the one ``hf auth login`` stored."""
    from huggingface_hub import get_token

    return get_token() or None


def resolve_repo_id(repo_id: str, token: str | None, dry_run: bool) -> str:
    """``<namespace>/<name>`` as given, or ``<name>`` under the token's own user (``whoami``); a dry run stays offline
    and keeps the bare name."""
    parts = repo_id.split("/")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"--repo-id must be <name> or <user or org>/<name>, got {repo_id!r}")
    if len(parts) == 2 or dry_run:
        return repo_id
    from huggingface_hub import HfApi

    try:
        user = HfApi(token=token).whoami()["name"]
    except Exception as err:  # noqa: BLE001 -- the Hub's errors vary; report them without the token
        raise ValueError(f"--repo-id {repo_id!r} has no namespace and the Hub did not say whose token this is "
                         f"({type(err).__name__}: {_redact(str(err), token)}); give <user or org>/{repo_id}") from None
    return f"{user}/{repo_id}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dm-publish", description=__doc__.splitlines()[0],
                                     epilog="Token: huggingface_hub.get_token() (HF_TOKEN, else `hf auth login`).")
    parser.add_argument("--checkpoint", required=True, help="dm-train's final/ folder")
    parser.add_argument("--repo-id", required=True,
                        help="Hub model repo, <user or org>/<name>; <name> alone publishes under the token's user")
    parser.add_argument("--summary", help="the run's summary.json (default: beside the checkpoint)")
    parser.add_argument("--evals", nargs="*", default=[], help="dm-eval result JSON files for the card")
    parser.add_argument("--data", help="the dm-prepare-data folder (its manifest.json describes the corpus)")
    parser.add_argument("--base-model", help="Hub id of the model this run was initialised from (card metadata)")
    parser.add_argument("--citation", help="the paper's BibTeX for the card: a .bib file, or a YAML file with a "
                        "'citation' key (reports/paper_reported.yaml); without it the card links the paper only")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                        help="dtype of the shipped weights (default bf16: half the size of the FP32 training weights)")
    parser.add_argument("--dry-run", action="store_true", help="build the folder offline; upload nothing")
    parser.add_argument("--out", help="folder to build (required with --dry-run; with an upload, where the uploaded "
                        "folder is kept, else it is staged in a temporary folder and removed)")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    token = hub_token()
    try:
        if args.dry_run and not args.out:
            raise ValueError("--dry-run needs --out (the folder to build)")
        if not args.dry_run and token is None:
            raise ValueError("no Hub token: export HF_TOKEN or run `hf auth login` (a token with write access), "
                             "or use --dry-run")
        repo_id = resolve_repo_id(args.repo_id, token, args.dry_run)
        checkpoint = Path(args.checkpoint)
        summary_path = Path(args.summary) if args.summary else checkpoint.parent / "summary.json"
        summary = _read_json(summary_path) if args.summary or summary_path.is_file() else None
        evals = [_read_json(Path(p)) for p in args.evals]
        config = _read_json(checkpoint / "config.json")
        manifest = _read_json(Path(args.data) / "manifest.json") if args.data else None
        files = checkpoint_files(checkpoint)
        citation = read_citation(args.citation) if args.citation else None
        card = str(model_card(repo_id, config, parameter_count(checkpoint), summary, evals, manifest,
                              base_model=args.base_model, citation=citation))
        assert_secret_free(files, token, card)  # before anything is written: a refused folder never exists
        out = Path(args.out) if args.out else None
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
        staged = stage(files, card, out.parent if out is not None else None, dtype=args.dtype)
        try:
            if not args.dry_run:
                try:
                    url = upload(staged, repo_id, token, args.private)
                except Exception as err:  # noqa: BLE001 -- the Hub's errors vary; report them without the token
                    print(f"dm-publish: error: upload to {repo_id} failed: {type(err).__name__}: "
                          f"{_redact(str(err), token)}", file=sys.stderr)
                    return 1
            if out is not None:
                _move_into_place(staged, out)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        if args.dry_run:
            print(f"dm-publish: dry run: {out} holds what would be uploaded to {repo_id}")
        else:
            kept = f" (the uploaded folder is {out})" if out is not None else ""
            print(f"dm-publish: uploaded to {repo_id}: {_redact(url, token)}{kept}")
    except ValueError as err:
        print(f"dm-publish: error: {_redact(str(err), token)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
