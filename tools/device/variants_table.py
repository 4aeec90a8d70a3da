"""The settings of one ``tools/device/cuda_gpu.sh variants`` call side by side: the ``attn_profile_TAG_R.json`` files
its rounds R wrote (``tools/device/attn_profile.py``), one row per setting.

``python3 tools/device/variants_table.py DIR [--method matched_factored]`` prints, per setting, the step's CUPTI time
(the mean over rounds, and each round's) and the mean time of each part of the step — the forward, the δ pass, the dK/dV
+ dQ kernel, the quantisation, everything else — with each part's change against the ``default`` setting where the
call ran one (settings compare within a call: the day moves every kernel by about 1%, kernels/NOTES.md).
"""
import argparse
import glob
import json
import os
import re

import pandas as pd

PARTS = (("forward", r"^dm_fwd_|^_attn_fwd_kernel"), ("delta", r"^dm_delta_|^_attn_bwd_delta"),
         ("dkdv_dq", r"^dm_dkdv_factored_|^dm_dq_factored_|^_attn_bwd_dkdv_kernel|^_attn_bwd_dq_kernel"),
         ("quant", r"^dm_quant_|_quant_|_amax_"))
"""The step's parts by kernel name, the CUDA library's and Triton's (the first pattern that matches; the rest is
``other``)."""


def part_of(kernel: str) -> str:
    return next((part for part, pattern in PARTS if re.search(pattern, kernel)), "other")


def read_profiles(folder: str, method: str) -> pd.DataFrame:
    """One row per (tag, round, kernel) of the ``attn_profile_TAG_R.json`` files in ``folder``, ``method``'s kernels
    with their ms per step (``tools/device/ab_compare.py`` reads its two trees' rounds through this too)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "attn_profile_*.json"))):
        match = re.search(r"attn_profile_(.+)_(\d+)\.json$", path)
        if not match:
            continue
        with open(path) as f:
            kernels = json.load(f)["methods"].get(method, {}).get("kernels", [])
        rows += [dict(tag=match[1], round=int(match[2]), kernel=k["kernel"], ms=k["ms_per_step"]) for k in kernels]
    return pd.DataFrame(rows, columns=["tag", "round", "kernel", "ms"])


def load(folder: str, method: str) -> pd.DataFrame:
    """One row per (setting, round, kernel) of the profiles in ``folder``, with the kernel's part of the step."""
    df = read_profiles(folder, method)
    if df.empty:
        raise SystemExit(f"{folder}: no attn_profile_SETTING_R.json of method {method!r}")
    return df.rename(columns={"tag": "setting"}).assign(part=df.kernel.map(part_of))


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Per setting: each round's step, the mean step and each part's mean; ``Δ`` columns against ``default``."""
    by_round = df.groupby(["setting", "round"]).ms.sum().unstack("round")
    by_round.columns = [f"step_{r}" for r in by_round.columns]
    parts = df.groupby(["setting", "part", "round"]).ms.sum().groupby(["setting", "part"]).mean().unstack("part")
    parts = parts.reindex(columns=[p for p, _ in PARTS] + ["other"]).fillna(0.0)
    out = pd.concat([by_round.mean(axis=1).rename("step"), by_round, parts], axis=1)
    if "default" in out.index:
        for column in ["step", *parts.columns]:
            out[f"Δ{column}"] = out[column] - out.loc["default", column]
        out = pd.concat([out.loc[["default"]], out.drop(index="default")])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--method", default="matched_factored")
    args = parser.parse_args(argv)
    print(table(load(args.folder, args.method)).to_markdown(floatfmt=".3f"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
