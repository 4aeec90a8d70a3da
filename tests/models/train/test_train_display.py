"""What a training run shows: the progress bar (live on a terminal, whole lines in a log file) and the optional
TensorBoard mirror of the metrics."""

import io

import yaml

from deltamatch.models.train import cli, metrics
from deltamatch.models.train.metrics import MetricsWriter, progress_bar, read_metrics


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _run(bar, steps):
    for _ in range(steps):
        bar.update(1)
    bar.close()


def test_progress_in_a_log_file_is_whole_lines():
    log = io.StringIO()
    _run(progress_bar(40, 10, "train matched", True, stream=log), 30)
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[0].startswith("train matched") and "10/40" in lines[0] and "40/40" in lines[-1]


def test_progress_on_a_terminal_is_redrawn_in_place_and_off_when_disabled():
    tty = Terminal()
    _run(progress_bar(5, 0, "train bf16", True, stream=tty), 5)
    assert "\r" in tty.getvalue() and "5/5" in tty.getvalue()
    quiet = Terminal()
    _run(progress_bar(5, 0, "train bf16", False, stream=quiet), 5)
    assert quiet.getvalue() == ""


def test_tensorboard_mirrors_train_and_val_scalars(tmp_path, monkeypatch):
    scalars, where = [], []

    class Board:
        def add_scalar(self, tag, value, step):
            scalars.append((tag, value, step))

        def close(self):
            scalars.append("closed")

    monkeypatch.setattr(metrics, "tensorboard_writer", lambda log_dir: where.append(log_dir) or Board())
    writer = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard=True)
    writer.write("train", step=3, tokens=96, loss=2.5, lr=1e-3, grad_norm=None, tokens_per_s=10.0)
    writer.write("gain", step=3, layer=1, concentration=0.4)
    writer.write("val", step=3, loss=2.75)
    writer.close()
    assert where == [tmp_path / "tensorboard"]
    assert scalars == [("train/tokens", 96, 3), ("train/loss", 2.5, 3), ("train/lr", 1e-3, 3),
                       ("train/tokens_per_s", 10.0, 3), ("val/loss", 2.75, 3), "closed"]
    assert [r["kind"] for r in read_metrics(tmp_path / "metrics.jsonl")] == ["train", "gain", "val"]  # JSONL unchanged
    assert MetricsWriter(tmp_path / "other.jsonl", enabled=False, tensorboard=True)._board is None  # rank > 0


def test_tensorboard_without_the_package_fails_before_training(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "metrics": {"tensorboard": True}}))
    assert cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "metrics.tensorboard" in err and "pip install tensorboard" in err
    assert not (tmp_path / "run").exists()
