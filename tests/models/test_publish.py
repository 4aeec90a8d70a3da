"""dm-publish on a real tiny checkpoint: the --dry-run folder's contents and card, the upload (against a fake
``huggingface_hub.HfApi``; no network), and that HF_TOKEN never leaks nor leaves a refused or temporary folder behind."""

import json
import logging
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from deltamatch.models.hub_code import bundle_sources
from deltamatch.models.publish import main

SECRET = "hf_TESTSECRETdoNotLeak1234567890"
PAPER_YAML = Path(__file__).resolve().parents[2] / "reports" / "paper_reported.yaml"  # the pipeline's --citation


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A dm-train-like final/ folder: a tiny hybrid saved with save_pretrained, a tokenizer, a summary and an eval."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from deltamatch.models import HybridForCausalLM, get_config

    run = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = HybridForCausalLM(get_config("tiny", attn_method="matched"))
    model.save_pretrained(run / "final")
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(["delta matching keeps row sums at zero"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>").save_pretrained(run / "final")
    torch.save({"w": torch.zeros(1)}, run / "final" / "pytorch_model.bin")  # pickles never ship
    (run / "summary.json").write_text(json.dumps({"final_val_loss": 5.4321, "steps": 12, "tokens": 3072,
                                                  "method": "matched", "size": "tiny", "seed": 0}))
    (run / "offline.json").write_text(json.dumps({"checkpoint": str(run / "final"), "suite": "offline",
                                                  "lm_eval_version": "0.4.13", "average": 0.25,
                                                  "tasks": {"dm_lastword": {"acc": 0.25}},
                                                  "metric_per_task": {"dm_lastword": "acc"}}))
    return {"dir": run, "params": sum(p.numel() for p in model.parameters())}


def _no_stored_token(monkeypatch, folder):
    """Point huggingface_hub's stored-token file (`hf auth login`) at an empty folder; returns that file's path."""
    from huggingface_hub import constants

    path = folder / "token"
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(path))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(folder / "stored_tokens"))
    return path


@pytest.fixture
def publish(monkeypatch, capfd, tmp_path_factory):
    """Run dm-publish in this process with HF_TOKEN set (or unset); returns (exit status, stdout + stderr)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _no_stored_token(monkeypatch, tmp_path_factory.mktemp("hf"))

    def run(checkpoint, out, *extra, token=SECRET):
        """``out=None`` leaves --out off (a real upload then stages in a temporary folder)."""
        if token:
            monkeypatch.setenv("HF_TOKEN", token)
        else:
            monkeypatch.delenv("HF_TOKEN", raising=False)
        status = main(["--checkpoint", str(checkpoint["dir"] / "final"), "--repo-id", "someone/deltamatch-tiny-matched",
                       "--evals", str(checkpoint["dir"] / "offline.json"), "--citation", str(PAPER_YAML),
                       *(["--out", str(out)] if out is not None else []), *extra])
        captured = capfd.readouterr()
        return status, captured.out + captured.err

    return run


def test_dry_run_builds_the_exact_folder_and_never_leaks_the_token(checkpoint, tmp_path, publish):
    out = tmp_path / "folder"
    status, printed = publish(checkpoint, out, "--dry-run")
    assert status == 0, printed
    assert SECRET not in printed
    names = sorted(p.name for p in out.iterdir())
    source = sorted(p.name for p in (checkpoint["dir"] / "final").iterdir() if p.suffix != ".bin")
    assert names == sorted({*source, *bundle_sources(), "README.md"})
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    for name, text in bundle_sources().items():  # the self-contained model code, for trust_remote_code
        assert (out / name).read_text() == text
    # BF16 weights by default: the training weights rounded once, nothing else changed
    from safetensors.torch import load_file

    shipped, trained = load_file(out / "model.safetensors"), load_file(checkpoint["dir"] / "final" / "model.safetensors")
    assert shipped.keys() == trained.keys()
    for name, tensor in trained.items():
        assert shipped[name].dtype == torch.bfloat16 and torch.equal(shipped[name], tensor.to(torch.bfloat16)), name
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    for path in out.rglob("*"):
        assert SECRET.encode() not in path.read_bytes()
    card = (out / "README.md").read_text()
    for heading in ("## Architecture", "## Attention method", "## Training data", "## Metrics", "## Citation"):
        assert heading in card
    assert f"parameters: {checkpoint['params']:,}" in card
    assert "validation cross-entropy: 5.4321" in card and "average 0.2500" in card and "Delta-Matching" in card
    assert "arXiv:2609.37852" in card and "someone/deltamatch-tiny-matched" in card
    assert "@article{tang2026deltamatching," in card  # the BibTeX came from the --citation file


def test_citation_comes_from_the_file_it_is_given(tmp_path):
    from deltamatch.models.card import read_citation

    bib = tmp_path / "paper.bib"
    bib.write_text("@misc{x, title = {T}}\n")
    assert read_citation(bib) == "@misc{x, title = {T}}"
    assert read_citation(PAPER_YAML).startswith("@article{tang2026deltamatching,")
    for text, problem in (("values: []\n", "no top-level 'citation'"), ("citation: not bibtex\n", "BibTeX")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=problem):
            read_citation(bad)
    with pytest.raises(ValueError, match="no file"):
        read_citation(tmp_path / "missing.yaml")


def test_dry_run_folder_loads_with_transformers(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "folder"
    assert main(["--checkpoint", str(checkpoint["dir"] / "final"), "--repo-id", "a/b", "--dry-run",
                 "--out", str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert sum(p.numel() for p in model.parameters()) == checkpoint["params"]
    assert AutoTokenizer.from_pretrained(out).eos_token == "</s>"


def test_upload_needs_the_token_and_refuses_a_leaking_folder(checkpoint, tmp_path, publish):
    status, printed = publish(checkpoint, tmp_path / "a", token=None)
    assert status == 2 and "no Hub token" in printed
    leaky = tmp_path / "leaky"
    (leaky / "final").mkdir(parents=True)
    for path in (checkpoint["dir"] / "final").iterdir():
        (leaky / "final" / path.name).write_bytes(path.read_bytes())
    (leaky / "final" / "notes.txt").write_text(f"token={SECRET}")
    (leaky / "offline.json").write_bytes((checkpoint["dir"] / "offline.json").read_bytes())
    status, printed = publish({"dir": leaky}, tmp_path / "b", "--dry-run")
    assert status == 2 and "contains the Hub token" in printed and "notes.txt" in printed
    assert SECRET not in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaky"]  # neither the refused folder nor a staging one


def test_bad_arguments_name_the_problem(checkpoint, tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path), "--repo-id", "a/b", "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert "config.json" in capsys.readouterr().err
    assert main(["--checkpoint", str(checkpoint["dir"] / "final"), "--repo-id", "a/b/c", "--dry-run",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--repo-id" in capsys.readouterr().err


# --- the upload, against a fake HfApi -------------------------------------------------------------------------------

REPO = "someone/deltamatch-tiny-matched"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """Replace ``huggingface_hub.HfApi`` (publish.upload imports it at call time) with a recorder; point the temp
    folder at ``tmp_path/tmp`` so leftovers show; send every log record at DEBUG to ``tmp_path/publish.log``."""
    import huggingface_hub

    record = {"init": [], "create_repo": [], "upload_folder": [], "fail": None}

    class FakeHfApi:
        def __init__(self, *args, **kwargs):
            record["init"].append(kwargs)

        def create_repo(self, repo_id, **kwargs):
            record["create_repo"].append({"repo_id": repo_id, **kwargs})
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, *, repo_id, folder_path, **kwargs):
            folder = Path(folder_path)
            files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
            record["upload_folder"].append({"repo_id": repo_id, "folder": folder, "files": files, **kwargs})
            if record["fail"]:
                raise OSError(record["fail"])
            return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0123abcd")

        def whoami(self, **kwargs):
            return {"name": "tokenowner", "type": "user"}

        def __getattr__(self, name):  # any other Hub call would need the network
            raise AssertionError(f"dm-publish called HfApi.{name}, which the fake does not provide")

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    handler = logging.FileHandler(tmp_path / "publish.log", encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    loggers = [logging.getLogger(), logging.getLogger("huggingface_hub")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    record["temp"], record["log"] = temp, tmp_path / "publish.log"
    yield record
    for logger, level in zip(loggers, levels):
        logger.removeHandler(handler)
        logger.setLevel(level)
    handler.close()


def _token_of(record):
    """The token the fake Hub was given: to the client, or to each call."""
    given = {call.get("token") for call in record["init"]}
    given |= {call.get("token") for call in record["create_repo"] + record["upload_folder"] if "token" in call}
    return given - {None}


def _files_with_secret(root):
    return [p for p in Path(root).rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


def test_upload_hands_the_token_and_the_folder_to_the_hub_and_leaves_no_temp_folder(checkpoint, tmp_path, publish, hub):
    status, printed = publish(checkpoint, None, "--dtype", "fp32")
    assert status == 0, printed
    assert _token_of(hub) == {SECRET}
    assert [call["repo_id"] for call in hub["create_repo"]] == [REPO]
    assert hub["create_repo"][0].get("repo_type", "model") == "model" and hub["create_repo"][0].get("exist_ok")
    assert not hub["create_repo"][0].get("private")
    (upload,) = hub["upload_folder"]
    assert upload["repo_id"] == REPO and upload.get("repo_type", "model") == "model"
    source = checkpoint["dir"] / "final"
    shipped = sorted(p.name for p in source.iterdir() if p.suffix != ".bin")
    assert sorted(upload["files"]) == sorted({*shipped, *bundle_sources(), "README.md"})
    for name in shipped:  # --dtype fp32: the weights and every other file exactly as trained; the code self-contained
        expected = bundle_sources()[name].encode() if name.endswith(".py") else (source / name).read_bytes()
        assert upload["files"][name] == expected, name
    card = upload["files"]["README.md"].decode()
    assert "## Metrics" in card and REPO in card
    assert "https://huggingface.co/someone/deltamatch-tiny-matched/commit/0123abcd" in printed
    # the staging folder was removed, and nothing else was left in the temp folder
    assert not upload["folder"].exists() and list(hub["temp"].iterdir()) == []
    # the token: nowhere in stdout/stderr, in what was uploaded, in the log file, nor in any file written here
    assert SECRET not in printed
    assert all(SECRET.encode() not in data for data in upload["files"].values())
    assert SECRET not in hub["log"].read_text(encoding="utf-8")
    assert _files_with_secret(tmp_path) == []


def test_upload_with_out_keeps_exactly_the_uploaded_folder(checkpoint, tmp_path, publish, hub):
    out = tmp_path / "results" / "publish" / "s0"  # as the publish rule runs it, with --out {output}
    status, printed = publish(checkpoint, out, "--private")
    assert status == 0, printed
    (upload,) = hub["upload_folder"]
    assert hub["create_repo"][0]["private"] is True
    assert {p.name: p.read_bytes() for p in out.iterdir()} == upload["files"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["s0"]  # no staging sibling left
    assert list(hub["temp"].iterdir()) == []
    assert SECRET not in printed and _files_with_secret(tmp_path) == []
    assert SECRET not in hub["log"].read_text(encoding="utf-8")


@pytest.fixture
def leaky(checkpoint, tmp_path):
    """A copy of the checkpoint with the token in one of its shipped files."""
    run = tmp_path / "leaky"
    (run / "final").mkdir(parents=True)
    for path in (checkpoint["dir"] / "final").iterdir():
        (run / "final" / path.name).write_bytes(path.read_bytes())
    (run / "final" / "special_tokens_map.json").write_text(json.dumps({"note": f"pasted by mistake: {SECRET}"}))
    (run / "offline.json").write_bytes((checkpoint["dir"] / "offline.json").read_bytes())
    return {"dir": run}


@pytest.mark.parametrize("out", [None, "given"])
def test_a_checkpoint_holding_the_token_is_refused_and_leaves_nothing(leaky, tmp_path, publish, hub, out):
    target = tmp_path / "results" / "publish" / "s0" if out else None
    status, printed = publish(leaky, target)
    assert status == 2
    assert "special_tokens_map.json contains the Hub token; refusing to publish it" in printed
    assert SECRET not in printed
    assert hub["init"] == [] and hub["upload_folder"] == []  # nothing reached the Hub
    assert not (tmp_path / "results").exists()  # no output folder, not even its parent
    assert list(hub["temp"].iterdir()) == []  # and no staging folder
    # the only file holding the token is the one it was put in
    assert _files_with_secret(tmp_path) == [leaky["dir"] / "final" / "special_tokens_map.json"]


def test_a_card_that_would_hold_the_token_is_refused(checkpoint, tmp_path, publish, hub):
    evals = tmp_path / "evals.json"
    evals.write_text(json.dumps({"suite": SECRET, "average": 0.5, "tasks": {}}))
    out = tmp_path / "out"
    status, printed = publish(checkpoint, out, "--dry-run", "--evals", str(evals))
    assert status == 2 and "model card (README.md) would contain the Hub token" in printed
    assert SECRET not in printed and not out.exists() and list(hub["temp"].iterdir()) == []


def test_a_real_upload_without_hf_token_fails_fast(tmp_path, publish, hub):
    out = tmp_path / "out"
    # the checkpoint does not even exist: the token is checked before anything is read or written
    status, printed = publish({"dir": tmp_path / "nowhere"}, out, token=None)
    assert status == 2
    assert "no Hub token" in printed and "--dry-run" in printed
    assert hub["init"] == [] and not out.exists() and list(hub["temp"].iterdir()) == []


def test_a_failed_upload_reports_without_the_token_and_leaves_nothing(checkpoint, tmp_path, publish, hub):
    hub["fail"] = f"401 Client Error for token {SECRET}: unauthorized"
    out = tmp_path / "results" / "s0"
    status, printed = publish(checkpoint, out)
    assert status == 1
    assert "upload to someone/deltamatch-tiny-matched failed" in printed and "401" in printed
    assert SECRET not in printed
    assert not out.exists() and sorted(p.name for p in out.parent.iterdir()) == []
    assert list(hub["temp"].iterdir()) == [] and _files_with_secret(tmp_path) == []


def test_the_token_scan_finds_it_across_read_chunks(tmp_path):
    from deltamatch.models.publish import _contains

    needle = SECRET.encode()
    for offset in range(0, 2 * len(needle)):
        path = tmp_path / f"f{offset}"
        path.write_bytes(b"x" * offset + needle + b"y")
        (tmp_path / "near").write_bytes(b"x" * offset + needle[:-1] + b"y")
        for chunk in (1, 2, 5, len(needle) - 1, len(needle), 64):
            assert _contains(path, needle, chunk), (offset, chunk)
            assert not _contains(tmp_path / "near", needle, chunk), (offset, chunk)


def test_card_carries_hub_metadata_limitations_and_requirements(checkpoint, tmp_path, publish):
    from huggingface_hub import ModelCard

    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"source": {"kind": "hub", "dataset": "nvidia/Nemotron-CC-v2",
                                                               "tokenizer": "mistralai/Mistral-7B-v0.1"},
                                                    "vocab_size": 32000, "splits": {}}))
    out = tmp_path / "folder"
    status, printed = publish(checkpoint, out, "--dry-run", "--data", str(data), "--base-model", "someone/base")
    assert status == 0, printed
    card = ModelCard.load(out / "README.md")
    assert card.data.language == "en" and card.data.license == "apache-2.0"
    assert card.data.datasets == ["nvidia/Nemotron-CC-v2"] and card.data.base_model == "someone/base"
    results = {(r.dataset_name, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert results == {("nvidia/Nemotron-CC-v2", "cross_entropy"): 5.4321, ("dm_lastword", "acc"): 0.25}
    assert card.data.model_name == "deltamatch-tiny-matched"
    text = (out / "README.md").read_text()
    assert "model-index:" in text and "## Limitations" in text and "This is a toy" in text
    assert "https://arxiv.org/abs/2609.37852" in text and "transformers>=5.0,<6" in text
    assert "import deltamatch" not in text  # loading needs only transformers


def test_the_token_of_hf_auth_login_is_used_and_a_bare_name_goes_under_its_user(checkpoint, tmp_path, publish, hub,
                                                                                 monkeypatch):
    from huggingface_hub import constants

    Path(constants.HF_TOKEN_PATH).write_text(SECRET)  # as `hf auth login` stores it; HF_TOKEN unset
    monkeypatch.delenv("HF_TOKEN", raising=False)
    status = main(["--checkpoint", str(checkpoint["dir"] / "final"), "--repo-id", "deltamatch-tiny-matched"])
    assert status == 0
    assert _token_of(hub) == {SECRET}
    assert [call["repo_id"] for call in hub["create_repo"]] == ["tokenowner/deltamatch-tiny-matched"]
    (upload,) = hub["upload_folder"]
    assert "tokenowner/deltamatch-tiny-matched" in upload["files"]["README.md"].decode()


def test_a_dry_run_with_a_bare_name_stays_offline(checkpoint, tmp_path, publish, monkeypatch):
    import huggingface_hub

    class NoHub:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a dry run contacted the Hub")

    monkeypatch.setattr(huggingface_hub, "HfApi", NoHub)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    out = tmp_path / "folder"
    assert main(["--checkpoint", str(checkpoint["dir"] / "final"), "--repo-id", "deltamatch-tiny-matched",
                 "--dry-run", "--out", str(out)]) == 0
    assert 'from_pretrained("deltamatch-tiny-matched"' in (out / "README.md").read_text()
