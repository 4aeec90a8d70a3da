"""The local last-word and perplexity data: deterministic, and each item is a true passage ending."""

import json

from deltamatch.evals.offline_tasks import OfflineDataConfig, build_offline_data

PROSE = ("The harness reads every held out document once and keeps the paragraphs that are plain prose, because "
         "a cloze over code or tables would measure formatting rather than language. Each kept paragraph loses its "
         "final word, and the model must pick that word among four candidates drawn from the paragraph itself.")


def _data(tmp_path, docs):
    data = tmp_path / "data"
    data.mkdir()
    (data / "val_docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return data


def test_build_is_deterministic_and_items_are_true_endings(tmp_path):
    docs = [PROSE + "\n\n" + PROSE.replace("harness", "reader") + "\n\ncode = [1, 2, 3]", "x" * 50, PROSE]
    data = _data(tmp_path, docs)
    first = build_offline_data(data, tmp_path / "a")
    second = build_offline_data(data, tmp_path / "b")
    for key in first:
        assert open(first[key]).read() == open(second[key]).read()
    items = [json.loads(line) for line in open(first["dm_lastword_jsonl"])]
    assert len(items) == 3  # the code paragraph and the short document are skipped
    for item in items:
        assert item["choices"][item["gold"]] == "itself"
        assert len(set(item["choices"])) == 4
        assert PROSE.replace("harness", "reader").startswith(item["context"]) or PROSE.startswith(item["context"])
        assert all(c in item["context"] for i, c in enumerate(item["choices"]) if i != item["gold"])
    heldout = [json.loads(line)["text"] for line in open(first["dm_heldout_jsonl"])]
    cap = OfflineDataConfig().heldout_max_chars
    assert heldout == [d if len(d) <= cap else d[: d.rfind(" ", 0, cap)] for d in docs]


def test_other_seed_other_distractors(tmp_path):
    data = _data(tmp_path, [PROSE] * 8)
    a = build_offline_data(data, tmp_path / "a", OfflineDataConfig(seed=1))
    b = build_offline_data(data, tmp_path / "b", OfflineDataConfig(seed=2))
    assert open(a["dm_lastword_jsonl"]).read() != open(b["dm_lastword_jsonl"]).read()
