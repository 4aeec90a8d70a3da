"""Offline corpus, tokenizer, shards and the Hub path (with local sources; the Hub itself is never contacted)."""

import json
import os

import numpy as np
import pytest
import yaml

from deltamatch.models.data import cli
from deltamatch.models.data.corpus import CorpusConfig, build_corpus, docstrings
from deltamatch.models.data.shards import read_manifest, verify
from deltamatch.models.data.tokenizer import TokenizerConfig, train_tokenizer

SMALL = {"max_bytes": 1_000_000, "val_fraction": 0.05}


def _prepare(tmp_path, name, **config):
    path = tmp_path / f"{name}.yaml"
    config.setdefault("out_dir", str(tmp_path / name))
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["--config", str(path)]) == 0
    return tmp_path / name


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return _prepare(tmp_path_factory.mktemp("data"), "data", seed=3, corpus=SMALL)


def _shard_tokens(folder, split):
    manifest = read_manifest(folder)
    return np.concatenate([np.fromfile(folder / s["file"], dtype=manifest["dtype"])
                           for s in manifest["splits"][split]["shards"]])


def test_offline_tokenizer_loads_with_transformers(data_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(data_dir / "tokenizer")
    assert len(tok) >= 8192
    assert {tok.bos_token, tok.eos_token, tok.pad_token} == {"<|bos|>", "<|eos|>", "<|pad|>"}
    text = "Return the sum of a and b.\n\n    >>> add(2, 3)\n    5 — ünïcödé"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_val_shards_are_the_held_out_documents_tokenised(data_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(data_dir / "tokenizer")
    docs = [json.loads(line)["text"] for line in (data_dir / "val_docs.jsonl").read_text().splitlines()]
    expected = np.concatenate([np.array(tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
                               for d in docs])
    np.testing.assert_array_equal(_shard_tokens(data_dir, "val"), expected)
    manifest = read_manifest(data_dir)
    assert manifest["splits"]["val"]["documents"] == len(docs)
    assert manifest["special_tokens"]["eos"] == tok.eos_token_id and manifest["vocab_size"] == len(tok)
    # held out by document: no validation text appears among the training documents
    train = build_corpus(CorpusConfig(**SMALL), seed=3).train
    assert not set(docs) & set(train)


def test_manifest_counts_hashes_and_corruption(data_dir, tmp_path):
    manifest = read_manifest(data_dir)
    for split in ("train", "val"):
        assert manifest["splits"][split]["tokens"] == len(_shard_tokens(data_dir, split)) > 0
    verify(data_dir)
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(data_dir, bad)
    shard = bad / manifest["splits"]["train"]["shards"][0]["file"]
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="sha256"):
        verify(bad)


def test_build_is_deterministic_for_a_seed(data_dir, tmp_path):
    again = _prepare(tmp_path, "again", seed=3, corpus=SMALL)
    assert read_manifest(again)["splits"] == read_manifest(data_dir)["splits"]
    other = build_corpus(CorpusConfig(**SMALL), seed=4)
    assert other.train != build_corpus(CorpusConfig(**SMALL), seed=3).train
    assert not list(tmp_path.glob(".again.partial*")), "temporary build folder left behind"


def test_corpus_dedups_extracts_docstrings_and_drops_stubs(tmp_path):
    prose = "The quick brown fox jumps over the lazy dog, again and again. " * 8
    for i in range(3):
        (tmp_path / f"copy{i}.txt").write_text(prose)  # three copies of one document
    (tmp_path / "mod.py").write_text(f'"""{prose}"""\n\ndef f():\n    """Short but real docstring text here, long enough."""\n')
    (tmp_path / "stub.md").write_text("too short")
    (tmp_path / "binary.txt").write_bytes(b"\x00\x01" * 200)
    corpus = build_corpus(CorpusConfig(roots=[str(tmp_path)], min_doc_chars=100, val_fraction=0.5), seed=0)
    docs = corpus.train + corpus.val
    assert len(docs) == 2
    assert prose.strip() in docs
    assert any("Short but real docstring" in d for d in docs)
    assert docstrings("x = 1\n") == ""


def test_tokenizer_rejects_a_corpus_too_small_for_8192():
    with pytest.raises(ValueError, match="8192"):
        train_tokenizer(["a tiny corpus with few words"] * 10, TokenizerConfig())
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["x"], TokenizerConfig(vocab_size=1000))


def test_config_rejects_unknown_and_ill_typed_keys(tmp_path, capsys):
    for bad, key in [({"corpus": {"max_byts": 5}}, "corpus.max_byts"), ({"seed": "one"}, "seed"),
                     ({"source": "s3"}, "source")]:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump({"out_dir": str(tmp_path / "x"), **bad}))
        assert cli.main(["--config", str(path)]) == 2
        assert f"'{key}'" in capsys.readouterr().err


def test_hub_path_streams_local_json_into_the_same_format(data_dir, tmp_path):
    rows = [{"text": f"Document {i}: " + "the gradient of the softmax sums to zero. " * (i % 7 + 1)} for i in range(300)]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hub = {"dataset": "json", "data_files": [str(src)], "tokenizer": str(data_dir / "tokenizer"),
           "max_train_tokens": 2000, "val_fraction": 0.1, "shuffle_buffer": 50}
    out = _prepare(tmp_path, "hub", source="hub", seed=1, hub=hub, shard_tokens=512)
    manifest = read_manifest(out)
    verify(out)
    train = manifest["splits"]["train"]
    assert 2000 <= train["tokens"] < 2000 + 2000 and len(train["shards"]) >= 4  # stopped near the cap, 512-token shards
    assert all(s["tokens"] == 512 for s in train["shards"][:-1])
    val_docs = (out / "val_docs.jsonl").read_text().splitlines()
    assert manifest["splits"]["val"]["documents"] == len(val_docs) > 0
    assert manifest["vocab_size"] == read_manifest(data_dir)["vocab_size"]


def test_hub_path_fails_fast_offline(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    path = tmp_path / "hub.yaml"
    path.write_text(yaml.safe_dump({"out_dir": str(tmp_path / "h"), "source": "hub",
                                    "hub": {"dataset": "nvidia/Nemotron-CC-v2", "tokenizer": "org/tok"}}))
    assert cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unreachable" in err and "nvidia/Nemotron-CC-v2" in err and "org/tok" in err
    assert not os.path.exists(tmp_path / "h")


def test_hub_build_killed_midway_resumes_to_the_same_folder(data_dir, tmp_path, monkeypatch):
    from deltamatch.models.data import prepare as prepare_module
    from deltamatch.models.data.shards import ShardWriter

    rows = [{"text": f"Document {i}: " + "row sums of dS vanish. " * (i % 5 + 1)} for i in range(400)]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hub = {"dataset": "json", "data_files": [str(src)], "tokenizer": str(data_dir / "tokenizer"),
           "max_train_tokens": 4000, "val_fraction": 0.1, "shuffle_buffer": 0, "batch_docs": 8}
    whole = _prepare(tmp_path, "whole", source="hub", seed=2, hub=hub, shard_tokens=300)

    added, real_add = [0], ShardWriter.add

    def killed_after_60_documents(self, ids):
        added[0] += 1
        if added[0] > 60:
            raise KeyboardInterrupt("killed")
        real_add(self, ids)

    config = {"out_dir": str(tmp_path / "resumed"), "source": "hub", "seed": 2, "hub": hub, "shard_tokens": 300}
    (tmp_path / "resumed.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setattr(ShardWriter, "add", killed_after_60_documents)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["--config", str(tmp_path / "resumed.yaml")])
    partial = tmp_path / ".resumed.partial"
    progress = json.loads((partial / prepare_module.PROGRESS).read_text())
    assert not (tmp_path / "resumed").exists() and progress["writers"]["train"]["shards"]

    read = []
    monkeypatch.setattr(ShardWriter, "add", lambda self, ids: (read.append(1), real_add(self, ids)))
    assert cli.main(["--config", str(tmp_path / "resumed.yaml")]) == 0
    # it went on from the saved position: only the documents after it were tokenised again
    saved = sum(progress["writers"][s]["documents"] for s in ("train", "val"))
    total = sum(read_manifest(whole)["splits"][s]["documents"] for s in ("train", "val"))
    assert not partial.exists() and 0 < saved and len(read) == total - saved
    resumed = tmp_path / "resumed"
    verify(resumed)
    for split in ("train", "val"):  # token for token what the uninterrupted build wrote
        assert np.array_equal(_shard_tokens(resumed, split), _shard_tokens(whole, split)), split
    assert (resumed / "val_docs.jsonl").read_text() == (whole / "val_docs.jsonl").read_text()
    assert sorted(p.name for p in (resumed / "train").iterdir()) == sorted(p.name for p in (whole / "train").iterdir())
