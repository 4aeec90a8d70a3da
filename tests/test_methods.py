"""The method registry (deltamatch/methods.py) is the one list of attention methods: every consumer derives from it."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from deltamatch import methods as registry

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("deltamatch", "kernels", "models", "evals", "reports", "benchmarks", "tools")

# A fresh interpreter adds a reference-only method to the registry before anything else imports it, then asks every
# consumer what it sees. Nothing but the registry entry is written: the reference runs it from its numerics fields.
ADD_AND_ASK = r"""
import json, sys
import importlib.util
import deltamatch.methods as registry

registry.METHODS["toy_fp8"] = registry.AttentionMethod(
    "toy_fp8", True, "matched", "tensor", "toy FP8", "a toy method: per-tensor FP8 with the matched δ.", ("reference",))

import jsonschema, torch, yaml
from deltamatch.kernels import PUBLIC_MODES, dm_attn_func
from deltamatch.kernels.reference import attention_reference, probe_backward
from deltamatch.kernels import bench, sweep, triton_attention
from deltamatch.models import get_config
from deltamatch.models.card import _method_text
from deltamatch.reports.tables import METHOD_ORDER

spec = importlib.util.spec_from_file_location("reference_bench", sys.argv[1] + "/benchmarks/reference_bench.py")
reference_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reference_bench)
schema = yaml.safe_load(open(sys.argv[1] + "/workflow/schemas/config.schema.yaml"))
jsonschema.validate({"name": "x", "runs": [{"variant": "base", "methods": ["toy_fp8"]}]}, schema)

gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 40, 2, 16, generator=gen) for _ in range(3))
o = dm_attn_func(q, k, v, causal=True, mode="toy_fp8")
probe = probe_backward(q, k, v, torch.randn(1, 40, 2, 16, generator=gen), method="toy_fp8")
print(json.dumps({
    "public_modes": "toy_fp8" in PUBLIC_MODES,
    "dm_attn_func_is_reference": bool(torch.equal(o, attention_reference(q, k, v, True, "toy_fp8"))),
    "probe_kinds": sorted(probe),
    "sweep": "toy_fp8" in sweep.SWEEP_METHODS and sweep.SweepConfig(methods=("toy_fp8",)).methods == ("toy_fp8",),
    "reference_bench": "toy_fp8" in reference_bench.METHODS,
    "triton": "toy_fp8" in triton_attention.MODES,
    "kernel_bench": "toy_fp8" in bench.FP8_MODES + bench.BASELINES,
    "model_config": get_config("tiny", attn_method="toy_fp8").attn_method,
    "card": _method_text("toy_fp8"),
    "report_order": METHOD_ORDER[-1],
    "config_check": registry.check_public("toy_fp8"),
}))
"""


def test_every_consumer_sees_a_method_added_to_the_registry():
    done = subprocess.run([sys.executable, "-c", ADD_AND_ASK, str(ROOT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "public_modes": True, "dm_attn_func_is_reference": True, "probe_kinds": ["matched", "stale"], "sweep": True,
        "reference_bench": True, "triton": False, "kernel_bench": False, "model_config": "toy_fp8",
        "card": "a toy method: per-tensor FP8 with the matched δ.", "report_order": "toy_fp8", "config_check": "toy_fp8",
    }


def _method_lists(path: Path) -> list[int]:
    """Lines of tuple/list/set literals or dict displays in ``path`` that copy the registry: every public method, or
    every method the reference runs (a selection, such as a benchmark's four methods, is a choice, not a copy)."""
    copies = (set(registry.public_methods()), set(registry.simulated_methods()))
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        elements = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            spelled = {e.value for e in elements if isinstance(e, ast.Constant)}
            if any(copy <= spelled for copy in copies):
                found.append(node.lineno)
    return found


def test_no_method_list_outside_the_registry():
    lists = {str(p.relative_to(ROOT)): lines for folder in SOURCES for p in sorted((ROOT / folder).rglob("*.py"))
             if p.name != "methods.py" and (lines := _method_lists(p))}
    assert lists == {}
    schema = (ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8")
    assert "enum: [bf16" not in schema  # the workflow checks methods against the registry (workflow/common.smk)


def test_the_lists_that_derive_from_the_registry():
    assert registry.public_methods() == ("bf16", "stale", "consistent", "matched", "bf16_dp", "maxshift",
                                         "stale_factored", "matched_factored", "cudnn_fp8")
    assert registry.implemented_by("triton") == ("stale", "consistent", "matched", "matched_factored")
    assert registry.implemented_by("cudnn") == ("cudnn_fp8",)
    assert registry.simulated_methods() == ("bf16", "stale", "consistent", "matched", "bf16_dp", "maxshift",
                                            "stale_factored", "matched_factored", "cudnn_fp8_sim")
    assert registry.reference_twin("cudnn_fp8") == "cudnn_fp8_sim" and registry.reference_twin("matched") == "matched"
    assert registry.get_method("bf16").delta_kind == "stale"  # FlashAttention's δ formula on BF16 numbers


def test_config_names_are_checked_once_with_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"config key runs\[0\]\.methods: unknown attention method 'fp4'; choose one "
                                         r"of \['bf16', 'stale', 'consistent', 'matched', 'bf16_dp', 'maxshift', "
                                         r"'stale_factored', 'matched_factored', 'cudnn_fp8'\]"):
        registry.check_public("fp4", "runs[0].methods")
    with pytest.raises(ValueError, match="unknown attention method 'cudnn_fp8_sim'"):  # an internal twin, not public
        registry.check_public("cudnn_fp8_sim")


@pytest.mark.parametrize("fields, problem", [
    (dict(delta="exactish"), "unknown delta"),
    (dict(scaling="row"), "unknown scaling"),
    (dict(backends=("flash",)), "backends"),
    (dict(backends=("cudnn",)), "exactly one of"),  # runs nowhere on a CPU and names no simulation
])
def test_a_malformed_entry_is_refused(fields, problem):
    base = dict(name="x", fp8=True, delta="matched", scaling="block", label="x", description="x",
                backends=("reference",))
    with pytest.raises(ValueError, match=problem):
        registry.AttentionMethod(**{**base, **fields})
