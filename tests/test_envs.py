"""The GPU environment: the lock pins the versions the README and the GDN layer's guard rely on, and the conda env
of the training rules installs exactly the lock."""

from pathlib import Path

import yaml
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins(lines):
    return dict(line.split("==") for line in lines)


def _lock():
    text = (ROOT / "envs" / "pip-gpu.lock.txt").read_text().splitlines()
    resolved = [line.strip() for line in text if line.strip() and not line.startswith("#")]
    no_deps = [line.split(":", 1)[1].strip() for line in text if line.startswith("# no-deps:")]
    return _pins(resolved), _pins(no_deps)


def test_gpu_lock_pins_the_training_stack():
    resolved, no_deps = _lock()
    assert resolved["torch"] == "2.11.0"
    assert resolved["flash-linear-attention"] == resolved["fla-core"] == "0.6.0"
    # fla 0.6 trains natively on Hopper only from Triton 3.7.1 (models/layers/gdn.py: fla_backward_supported)
    assert Version(no_deps["triton"]) >= Version("3.7.1") and "triton" not in resolved
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert no_deps["nvidia-cudnn-frontend"] == "1.32.0" and '"nvidia-cudnn-frontend==1.32.0"' in pyproject


def test_train_env_installs_the_lock():
    env = yaml.safe_load((ROOT / "envs" / "train.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    resolved, no_deps = _lock()
    assert _pins(pip) == resolved
    post = (ROOT / "envs" / "train.post-deploy.sh").read_text()
    assert "pip-gpu.lock.txt" in post and "--no-deps" in post
