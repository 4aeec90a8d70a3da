"""Atomic writes: the result appears whole under its name, and with the mode the umask gives a plain open()."""

import os
import stat

import pytest

from deltamatch.atomic import atomic_path, write_json, write_text


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_written_files_honour_the_umask(tmp_path, umask, mask):
    os.umask(mask)
    write_text(tmp_path / "a.txt", "x")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # the reference: what open() gives under this umask
    mode = stat.S_IMODE((tmp_path / "a.txt").stat().st_mode)
    assert mode == stat.S_IMODE(plain.stat().st_mode) == 0o666 & ~mask


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    write_json(tmp_path / "r.json", {"a": 1})
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "r.json") as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert (tmp_path / "r.json").read_text() == '{\n  "a": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
