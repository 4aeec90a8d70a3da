"""Hardware detection and the GPU correctness step belong to the kernel stage; off Hopper they record and step aside."""

import json

import pytest
import torch

from deltamatch.kernels import check
from deltamatch.kernels.hardware import hardware, main


def test_hardware_is_recorded_and_gates_on_hopper(tmp_path, capsys):
    out = tmp_path / "bench" / "hardware.json"
    status = main(["--out", str(out), "--has-hopper"])
    found = json.loads(out.read_text())
    assert found == hardware() == json.loads(capsys.readouterr().out)
    assert set(found) == {"hopper", "device", "capability"}
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    assert found["hopper"] is hopper and status == (0 if hopper else 1)
    assert main([]) == 0  # without --has-hopper it only records


def test_gpu_tests_run_only_on_hopper(monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr(check.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or type("R", (), {"returncode": 5}))
    monkeypatch.setattr(check, "hardware", lambda: {"hopper": False, "device": None, "capability": None})
    assert check.gpu_tests(str(tmp_path)) == 0 and calls == []
    assert "GPU correctness tests not run: no Hopper GPU" in capsys.readouterr().out
    monkeypatch.setattr(check, "hardware", lambda: {"hopper": True, "device": "NVIDIA H200", "capability": "sm90"})
    assert check.gpu_tests(str(tmp_path)) == 5  # the tests' exit status is the check's
    assert calls[0][-4:] == ["-q", "-m", "gpu", str(tmp_path)]


@pytest.mark.parametrize("argv", [["hardware"], ["hardware", "--has-hopper"]])
def test_the_report_no_longer_probes_the_machine(argv):
    from deltamatch.reports.cli import main as report

    with pytest.raises(SystemExit):
        report(argv)
