"""dm-eval's settings come from a --config file (EvalConfig), with the flags of the same names on top."""

import pytest

from deltamatch.config import load_with_flags
from deltamatch.evals.cli import EvalConfig, main


def test_flags_override_the_config_file_and_bad_keys_are_named(tmp_path, capsys):
    path = tmp_path / "eval.yaml"
    path.write_text("limit: 3\nonline: false\ndevice: cpu\n")
    cfg = load_with_flags(EvalConfig, path, {"limit": 2, "online": None, "cache": None, "device": None})
    assert (cfg.limit, cfg.online, cfg.device, cfg.cache) == (2, False, "cpu", None)
    path.write_text("limt: 3\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--checkpoint", str(tmp_path), "--suite", "offline", "--out", str(tmp_path / "o.json"),
              "--config", str(path)])
    assert exit_.value.code == 2 and "limt" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the settings are checked before the checkpoint is even looked at
        main(["--checkpoint", str(tmp_path / "none"), "--suite", "offline", "--out", str(tmp_path / "o.json"),
              "--limit", "0"])
    assert "limit must be a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
