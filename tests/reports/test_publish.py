"""dm-publish --dry-run on a real tiny checkpoint: the folder's contents, the card, and that HF_TOKEN never leaks."""

import json

import pytest
import torch

from deltamatch.models.publish import main

SECRET = "hf_TESTSECRETdoNotLeak1234567890"


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


@pytest.fixture
def publish(monkeypatch, capfd):
    """Run dm-publish in this process with HF_TOKEN set (or unset); returns (exit status, stdout + stderr)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def run(checkpoint, out, *extra, token=SECRET):
        if token:
            monkeypatch.setenv("HF_TOKEN", token)
        else:
            monkeypatch.delenv("HF_TOKEN", raising=False)
        status = main(["--checkpoint", str(checkpoint["dir"] / "final"), "--repo-id", "someone/deltamatch-tiny-matched",
                       "--evals", str(checkpoint["dir"] / "offline.json"), "--out", str(out), *extra])
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
    assert names == sorted([*source, "README.md"])
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    assert any(n.endswith(".py") for n in names)  # the model code, for trust_remote_code
    assert (out / "model.safetensors").read_bytes() == (checkpoint["dir"] / "final" / "model.safetensors").read_bytes()
    for path in out.rglob("*"):
        assert SECRET.encode() not in path.read_bytes()
    card = (out / "README.md").read_text()
    for heading in ("## Architecture", "## Attention method", "## Training data", "## Metrics", "## Citation"):
        assert heading in card
    assert f"parameters: {checkpoint['params']:,}" in card
    assert "validation cross-entropy: 5.4321" in card and "average 0.2500" in card and "Delta-Matching" in card
    assert "arXiv:2609.37852" in card and "someone/deltamatch-tiny-matched" in card


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
    assert status == 2 and "HF_TOKEN is not set" in printed
    leaky = tmp_path / "leaky"
    (leaky / "final").mkdir(parents=True)
    for path in (checkpoint["dir"] / "final").iterdir():
        (leaky / "final" / path.name).write_bytes(path.read_bytes())
    (leaky / "final" / "notes.txt").write_text(f"token={SECRET}")
    (leaky / "offline.json").write_bytes((checkpoint["dir"] / "offline.json").read_bytes())
    status, printed = publish({"dir": leaky}, tmp_path / "b", "--dry-run")
    assert status == 2 and "contains the value of HF_TOKEN" in printed
    assert SECRET not in printed


def test_bad_arguments_name_the_problem(checkpoint, tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path), "--repo-id", "a/b", "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert "config.json" in capsys.readouterr().err
    assert main(["--checkpoint", str(checkpoint["dir"] / "final"), "--repo-id", "nobody", "--dry-run",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--repo-id" in capsys.readouterr().err
