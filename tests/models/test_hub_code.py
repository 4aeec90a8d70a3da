"""An exported checkpoint loads where deltamatch (and fla) cannot be imported, as from a Hub repo: the folder's model
code is self-contained, and the model it builds computes what the package's model computes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deltamatch.models import HybridForCausalLM, get_config
from deltamatch.models.hub_code import bundle_sources, outside_try_imports, write_model_code

# Run in a fresh interpreter (-I: no PYTHONPATH, no user site) whose import system refuses deltamatch and fla.
CLEAN = r"""
import json, sys
from pathlib import Path

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("deltamatch", "fla"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)

sys.meta_path.insert(0, Refuse())
import torch
from transformers import AutoModelForCausalLM

folder, tokens_file, out = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
tokens = torch.tensor(json.loads(Path(tokens_file).read_text()))
with torch.no_grad():
    result = {"logits": model(tokens).logits.tolist()}
model.train()
try:
    train_logits = model(tokens).logits  # bf16 trains through exact attention without the kernels
    train_logits.float().sum().backward()
    result["train_logits"] = train_logits.tolist()
except ImportError as err:
    result["train_error"] = str(err)
result["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in ("deltamatch", "fla"))
Path(out).write_text(json.dumps(result))
"""


def _clean_load(folder, tokens, tmp_path, python=(sys.executable, "-I")):
    (tmp_path / "tokens.json").write_text(json.dumps(tokens.tolist()))
    out = tmp_path / "out.json"
    env = {"HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*python, "-c", CLEAN, str(folder), str(tmp_path / "tokens.json"), str(out)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    return done, (json.loads(out.read_text()) if done.returncode == 0 else None)


def _venv_without_deltamatch(tmp_path):
    """A fresh venv whose only extra path is this environment's site-packages, added by a plain path line: the
    .pth files in there (deltamatch's editable-install hook among them) are not run, so deltamatch is not importable
    while torch and transformers are."""
    import site
    import venv

    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    Path(own, "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    probe = subprocess.run([str(python), "-c", "import torch, transformers; import deltamatch"], capture_output=True,
                           text=True, cwd=tmp_path)
    assert "No module named 'deltamatch'" in probe.stderr, probe.stderr[-2000:]
    return (str(python),)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["bf16"])
def test_exported_folder_loads_without_deltamatch(tmp_path, method):
    torch.manual_seed(0)
    model = HybridForCausalLM(get_config("tiny", attn_method=method)).eval()
    folder = tmp_path / "final"
    model.save_pretrained(folder)
    tokens = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))

    plain, _ = _clean_load(folder, tokens, tmp_path)  # what save_pretrained alone ships imports deltamatch
    assert plain.returncode != 0 and "deltamatch" in plain.stderr

    write_model_code(folder)
    done, result = _clean_load(folder, tokens, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert result["loaded"] == []
    with torch.no_grad():
        expected = model(tokens).logits
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, rtol=1e-5, atol=1e-5)
    # training mode without the kernels: exact attention in the model's dtype (not the package's BF16-operand core)
    torch.testing.assert_close(torch.tensor(result["train_logits"]), expected, rtol=1e-5, atol=1e-5)


def test_bundle_is_flat_and_free_of_package_imports():
    files = bundle_sources()
    assert {"modeling_hybrid.py", "configuration_hybrid.py", "attention.py", "gdn.py", "mlp.py", "norm.py"} <= set(files)
    for name, text in files.items():
        assert outside_try_imports(text, "deltamatch") == [], name
        assert outside_try_imports(text, "fla") == [], name  # fla stays optional at import time
    assert "from .attention import GQAttention" in files["modeling_hybrid.py"]


def test_an_unbundlable_import_is_named():
    assert outside_try_imports("import os\ndef f():\n    from deltamatch.kernels import x\n", "deltamatch") == [3]
    assert outside_try_imports("try:\n    import deltamatch\nexcept ImportError:\n    pass\n", "deltamatch") == []


@pytest.mark.slow
def test_exported_folder_loads_in_a_venv_without_deltamatch(tmp_path):
    torch.manual_seed(0)
    model = HybridForCausalLM(get_config("tiny", attn_method="matched")).eval()
    folder = tmp_path / "final"
    model.save_pretrained(folder)
    write_model_code(folder)
    tokens = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(2))
    done, result = _clean_load(folder, tokens, tmp_path, python=_venv_without_deltamatch(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    with torch.no_grad():
        expected = model(tokens).logits
    # an FP8 method's checkpoint evaluates with exact attention, as in the package; training it needs the kernels
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, rtol=1e-5, atol=1e-5)
    assert "needs the deltamatch FP8 attention kernels" in result["train_error"]
    assert not any(name.startswith("deltamatch") for name in result["loaded"])
