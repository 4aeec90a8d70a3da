"""An exported checkpoint loads where deltamatch (and fla) cannot be imported, as from a Hub repo: the folder's model
code is self-contained, and the model it builds computes what the package's model computes."""

import json
import subprocess
import sys

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
    logits = model(tokens).logits
model.train()
grad_logits = model(tokens).logits  # bf16 trains through exact attention without the kernels
grad_logits.float().sum().backward()
Path(out).write_text(json.dumps({"logits": logits.tolist(), "train_logits": grad_logits.tolist(),
                                 "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("deltamatch", "fla"))}))
"""


def _clean_load(folder, tokens, tmp_path):
    (tmp_path / "tokens.json").write_text(json.dumps(tokens.tolist()))
    out = tmp_path / "out.json"
    env = {"HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-I", "-c", CLEAN, str(folder), str(tmp_path / "tokens.json"), str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    return done, (json.loads(out.read_text()) if done.returncode == 0 else None)


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
