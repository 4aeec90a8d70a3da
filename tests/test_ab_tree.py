"""tools/device/ab_tree.py: a script runs against another checkout's ``deltamatch``, not the one installed here; and
the tables of a call's CUPTI profiles: ab_compare.py (two trees) and variants_table.py (a variants call's settings)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AB_TREE = ROOT / "tools" / "device" / "ab_tree.py"


def _tree(path: Path, version: str) -> Path:
    """A minimal checkout: ``deltamatch/`` with its version and the four top-level subpackage folders."""
    (path / "deltamatch").mkdir(parents=True)
    (path / "deltamatch" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    for sub in ("kernels", "models", "evals", "reports"):
        (path / sub).mkdir()
        (path / sub / "__init__.py").write_text(f'WHERE = "{sub} of {version}"\n')
    (path / "probe.py").write_text(
        "import os, sys\n"
        "import deltamatch, deltamatch.kernels\n"
        "try:\n"
        "    import deltamatch.kernels.cuda_lib  # this checkout's only: the other tree has no such module\n"
        "    found = 'cuda_lib-found'\n"
        "except ModuleNotFoundError:\n"
        "    found = 'cuda_lib-missing'\n"
        "print(deltamatch.__version__, deltamatch.kernels.WHERE, found, os.getcwd(), *sys.argv[1:])\n")
    return path


def test_a_script_sees_the_other_trees_package_and_arguments(tmp_path):
    """Its modules only: one the other tree lacks is missing, not taken from the checkout installed here."""
    tree = _tree(tmp_path / "other", "0.0.0-other")
    done = subprocess.run([sys.executable, str(AB_TREE), str(tree), "probe.py", "--flag", "x"], capture_output=True,
                          text=True, cwd=ROOT, check=True)
    assert done.stdout.split() == ["0.0.0-other", "kernels", "of", "0.0.0-other", "cuda_lib-missing", str(tree),
                                   "--flag", "x"]
    here = subprocess.run([sys.executable, "-c", "import deltamatch; print(deltamatch.__version__)"],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    assert here.stdout.strip() != "0.0.0-other"  # the installed package is this checkout's


def test_a_folder_that_is_no_checkout_is_refused(tmp_path):
    done = subprocess.run([sys.executable, str(AB_TREE), str(tmp_path), "probe.py"], capture_output=True, text=True)
    assert done.returncode != 0 and "not a checkout of this project" in done.stderr


AB_COMPARE = ROOT / "tools" / "device" / "ab_compare.py"


def _profile(folder: Path, tree: str, round_: int, kernels: dict) -> None:
    """An ``attn_profile_{tree}_{round}.json`` as tools/device/attn_profile.py writes it."""
    import json

    rows = [dict(kernel=k, calls_per_step=1.0, ms_per_step=v, share=0.0) for k, v in kernels.items()]
    body = dict(seq_len=8192, switches={}, methods=dict(matched_factored=dict(total_ms=sum(kernels.values()),
                                                                              kernels=rows)))
    (folder / f"attn_profile_{tree}_{round_}.json").write_text(json.dumps(body))


def test_ab_compare_puts_each_kernel_of_both_trees_side_by_side(tmp_path):
    """The change is the mean over rounds of this tree minus the other's, per kernel and for the step; a kernel one
    tree lacks has no change; a folder without profiles is an error that names it."""
    _profile(tmp_path, "new", 1, {"dkdv": 4.20, "fwd": 1.40})
    _profile(tmp_path, "new", 2, {"dkdv": 4.30, "fwd": 1.44})
    _profile(tmp_path, "old", 1, {"dkdv": 4.50, "fwd": 1.40, "amax": 0.04})
    _profile(tmp_path, "old", 2, {"dkdv": 4.60, "fwd": 1.42, "amax": 0.04})
    done = subprocess.run([sys.executable, str(AB_COMPARE), str(tmp_path)], capture_output=True, text=True,
                          check=True)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in done.stdout.splitlines()[2:]}
    assert rows["dkdv"] == ["4.200", "4.300", "4.500", "4.600", "-0.300"]
    assert rows["fwd"] == ["1.400", "1.440", "1.400", "1.420", "0.010"]
    assert rows["amax"][-1] == "nan" and rows["amax"][2:4] == ["0.040", "0.040"]
    assert rows["(step)"] == ["5.600", "5.740", "5.940", "6.060", "-0.330"]
    empty = subprocess.run([sys.executable, str(AB_COMPARE), str(tmp_path / "none")], capture_output=True, text=True)
    assert empty.returncode != 0 and "none" in empty.stderr and "attn_profile_" in empty.stderr


def test_variants_table_puts_each_setting_a_row_its_parts_against_the_default(tmp_path, monkeypatch):
    """Each setting's mean step over its rounds and each part of it (the forward, the δ pass, dK/dV + dQ, the
    quantisation, the rest), a δ form under another kernel name counted in the same part; the ``Δ`` columns against
    ``default``, which leads; a folder without profiles is an error that names what it looked for."""
    monkeypatch.syspath_prepend(str(ROOT / "tools" / "device"))
    import variants_table

    base = {"dm_fwd_wide_w4p_promoted": 1.40, "dm_delta_wide_w4p": 1.18,
            "dm_dkdv_factored_ws3x_promoted_dq_ordered": 4.22, "dm_quant_dual_128_fragment_bf16": 0.08,
            "_per_channel_amax_pass_kernel": 0.04, "dm_dkdv_dq_epilogue": 0.10}
    _profile(tmp_path, "default", 1, base)
    _profile(tmp_path, "default", 2, {**base, "dm_delta_wide_w4p": 1.20})
    for round_, delta in ((1, 1.10), (2, 1.12)):
        _profile(tmp_path, "CUDA_DELTA-w4pm", round_, {**{k: v for k, v in base.items() if "delta" not in k},
                                                       "dm_delta_wide_w4pm": delta})
    (tmp_path / "attn_profile_default_1.md").write_text("not read")
    out = variants_table.table(variants_table.load(str(tmp_path), "matched_factored"))
    assert list(out.index) == ["default", "CUDA_DELTA-w4pm"]
    assert out.loc["default", "delta"] == pytest.approx(1.19)
    assert out.loc["CUDA_DELTA-w4pm", "delta"] == pytest.approx(1.11)
    assert out.loc["CUDA_DELTA-w4pm", "Δdelta"] == pytest.approx(-0.08)
    assert out.loc["CUDA_DELTA-w4pm", "Δforward"] == pytest.approx(0.0)
    assert out.loc["default", "quant"] == pytest.approx(0.12) and out.loc["default", "other"] == pytest.approx(0.10)
    assert out.loc["default", "step_2"] == pytest.approx(sum(base.values()) + 0.02)
    assert out.loc["CUDA_DELTA-w4pm", "Δstep"] == pytest.approx(-0.08)
    printed = subprocess.run([sys.executable, str(ROOT / "tools" / "device" / "variants_table.py"), str(tmp_path)],
                             capture_output=True, text=True, check=True).stdout
    assert printed.splitlines()[2].startswith("| default") and "CUDA_DELTA-w4pm" in printed.splitlines()[3]
    with pytest.raises(SystemExit, match="no attn_profile_SETTING_R.json of method 'matched_factored'"):
        variants_table.load(str(tmp_path / "none"), "matched_factored")
    # each kernel's part by name: the CUDA dQ (D = 64's) beside the dK/dV, as Triton's dQ launch is
    kernels = ("dm_dq_factored_ws3_promoted_d64", "_attn_bwd_dq_kernel", "dm_dkdv_factored_ws3_promoted_d64",
               "dm_dkdv_dq_epilogue")
    assert [variants_table.part_of(k) for k in kernels] == ["dkdv_dq", "dkdv_dq", "dkdv_dq", "other"]
