"""The commit written beside every recorded measurement."""

import subprocess

from deltamatch.provenance import ROOT, commit


def test_the_commit_sent_to_a_device_wins_over_its_stale_git(monkeypatch):
    monkeypatch.setenv("DM_COMMIT", "5c7e891")
    assert commit() == "5c7e891"


def test_without_it_git_names_the_checkout_and_a_folder_without_git_is_unknown(monkeypatch, tmp_path):
    monkeypatch.delenv("DM_COMMIT", raising=False)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert len(commit()) >= 7 and head.startswith(commit())
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert commit(tmp_path) == "unknown"
