"""tools/device/variants_table.py: the settings of a ``cuda_gpu.sh variants`` call side by side, from the profiles'
JSON, each part of the step against the default."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "device"))

import variants_table  # noqa: E402


def _profile(folder: Path, tag: str, kernels: dict[str, float]) -> None:
    """One ``attn_profile_TAG.json`` as tools/device/attn_profile.py writes it."""
    rows = [dict(kernel=k, calls_per_step=1.0, ms_per_step=ms, share=0.0) for k, ms in kernels.items()]
    doc = dict(seq_len=8192, switches={}, methods=dict(matched_factored=dict(total_ms=sum(kernels.values()),
                                                                              kernels=rows)))
    (folder / f"attn_profile_{tag}.json").write_text(json.dumps(doc))


def test_each_setting_a_row_its_parts_against_the_default(tmp_path):
    base = {"dm_fwd_wide_w4p_promoted": 1.40, "dm_delta_wide_w4p": 1.18,
            "dm_dkdv_factored_ws3x_promoted_dq_ordered": 4.22, "dm_quant_dual_128_fragment_bf16": 0.08,
            "_per_channel_amax_pass_kernel": 0.04, "dm_dkdv_dq_epilogue": 0.10}
    _profile(tmp_path, "default_1", base)
    _profile(tmp_path, "default_2", {**base, "dm_delta_wide_w4p": 1.20})
    for r, delta in ((1, 1.10), (2, 1.12)):  # the δ pass's form: another kernel name, the same part
        _profile(tmp_path, f"CUDA_DELTA-w4pm_{r}", {**{k: v for k, v in base.items() if "delta" not in k},
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


def test_a_folder_without_profiles_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no attn_profile_SETTING_R.json of method 'matched_factored'"):
        variants_table.load(str(tmp_path), "matched_factored")
