"""Prefetch fills the caches a suite reads, and an offline dm-eval then finds them (and serves URL downloads from its
cache) instead of waiting on the network. No network here: the downloads are stood in for."""

import json

import pytest
import requests

from deltamatch.evals import preflight, prefetch
from deltamatch.evals.suites import load_suite

URL = "https://example.invalid/squad/dev.json"
SUITE = f"""name: needs_net
task_dirs: [offline]
hub_datasets: [someone/essays, someone/other:cfg]
urls: [{URL}]
nltk_data: [tokenizers/fake_punkt]
runs:
  - tasks:
      - {{task: dm_lastword, average: acc}}
"""


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "needs_net.yaml"
    path.write_text(SUITE)
    return load_suite(path)


@pytest.fixture
def world(monkeypatch):
    """A stand-in network and caches: what was downloaded lands in `cached`; the real network is never touched."""
    cached = {"datasets": set(), "nltk": set(), "gets": []}
    for name in preflight.OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)  # restored afterwards, whatever set_hub_offline sets

    def get(url, *args, **kwargs):
        cached["gets"].append(url)
        response = requests.models.Response()
        response.status_code, response._content = 200, json.dumps({"data": [url]}).encode()
        return response

    def no_network(url, *args, **kwargs):
        raise AssertionError(f"network touched: {url}")

    monkeypatch.setattr(requests, "get", get)
    monkeypatch.setattr(prefetch, "fetch_dataset", lambda path, name: cached["datasets"].add((path, name)))
    monkeypatch.setattr(preflight, "_cached", lambda path, name: (path, name) in cached["datasets"])
    monkeypatch.setattr(preflight, "nltk_resource_found", lambda resource: resource in cached["nltk"])
    monkeypatch.setattr(prefetch, "fetch_nltk", lambda resource: cached["nltk"].add(resource))
    monkeypatch.setattr(prefetch, "set_hub_offline", lambda offline=True: cached.setdefault("offline", offline))
    cached["no_network"] = no_network
    return cached


def test_offline_check_names_what_is_missing_before_a_prefetch(suite, world, tmp_path):
    manager = prefetch._task_manager(suite)
    with pytest.raises(ValueError) as err:
        preflight.check_offline(suite, manager, tmp_path / "cache")
    message = str(err.value)
    for missing in ("'someone/essays'", "'someone/other' (config 'cfg')", f"download {URL}",
                    "NLTK resource tokenizers/fake_punkt", "dm-eval-prefetch --suite needs_net"):
        assert missing in message


def test_prefetch_fills_every_cache_then_dm_eval_runs_offline(suite, world, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    out = tmp_path / "prefetch.json"
    monkeypatch.setattr(prefetch, "load_suite", lambda name: suite)
    assert prefetch.main(["--suite", "needs_net", "--cache", str(cache), "--out", str(out)]) == 0
    assert world["datasets"] == {("someone/essays", None), ("someone/other", "cfg")}
    assert world["nltk"] == {"tokenizers/fake_punkt"} and world["gets"] == [URL] and world["offline"] is True
    record = json.loads(out.read_text())
    assert record["suite"] == "needs_net" and record["urls"][URL] == str(preflight.url_path(cache, URL))
    # what an eval job then sees: nothing missing, and the task code's download answered from the cache
    preflight.check_offline(suite, prefetch._task_manager(suite), cache)
    monkeypatch.setattr(requests, "get", world["no_network"])
    with preflight.serve_cached_urls(suite.urls, cache):
        assert requests.get(URL, timeout=60).json() == {"data": [URL]}
        with pytest.raises(AssertionError, match="network touched"):
            requests.get("https://example.invalid/other.json")
    assert requests.get is world["no_network"]  # restored on leaving
    # a second prefetch keeps what is cached: no download again
    assert prefetch.main(["--suite", "needs_net", "--cache", str(cache)]) == 0
    assert world["gets"] == [URL]


def test_prefetch_refuses_an_offline_environment(suite, world, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(prefetch, "load_suite", lambda name: suite)
    out = tmp_path / "prefetch.json"
    assert prefetch.main(["--suite", "needs_net", "--cache", str(tmp_path), "--out", str(out)]) == 2
    assert "HF_DATASETS_OFFLINE is set" in capsys.readouterr().err and not out.exists()


def test_shipped_network_suites_name_what_they_download():
    """The suites that need network declare it, so a prefetch can fetch it and an offline run can check it."""
    ruler = load_suite("ruler_8k")
    assert ruler.hub_datasets == ["baber/paul_graham_essays"] and len(ruler.urls) == 2
    assert ruler.nltk_data == ["tokenizers/punkt_tab"]  # lm-eval's RULER downloads it at import when missing
    assert load_suite("ruler_64k").urls == ruler.urls
