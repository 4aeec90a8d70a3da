"""Each kernel's CUPTI time per step in two trees side by side: the ``attn_profile_new_R.json`` and
``attn_profile_old_R.json`` files of ``tools/device/cuda_gpu.sh ab`` (this tree, the ``.ab`` tree; rounds R).

``python3 tools/device/ab_compare.py DIR [--method matched_factored]`` prints one row per kernel: its ms per step in
each round of each tree, and the change of the means (new − old; none for a kernel one tree does not launch), then the
step's.
"""
import argparse
import sys

import pandas as pd
from variants_table import read_profiles  # this folder's: the script's own directory leads sys.path


def load(folder: str, method: str) -> pd.DataFrame:
    df = read_profiles(folder, method)
    df = df[df.tag.isin(("new", "old"))].rename(columns={"tag": "tree"})
    if df.empty:
        raise SystemExit(f"{folder}: no attn_profile_{{new,old}}_R.json of method {method!r}")
    return df


def compare(df: pd.DataFrame) -> pd.DataFrame:
    table = df.pivot_table(index="kernel", columns=["tree", "round"], values="ms", aggfunc="sum")
    table.columns = [f"{tree}_{rnd}" for tree, rnd in table.columns]
    means = {tree: df[df.tree == tree].pivot_table(index="kernel", columns="round", values="ms", aggfunc="sum")
             .mean(axis=1) for tree in ("new", "old")}
    table["change"] = means["new"].reindex(table.index) - means["old"].reindex(table.index)
    total = table.drop(columns="change").sum(min_count=1).rename("(step)")
    steps = {tree: df[df.tree == tree].groupby("round").ms.sum().mean() for tree in ("new", "old")}
    total["change"] = steps["new"] - steps["old"]  # a kernel only one tree launches counts here too
    return pd.concat([table.sort_values(table.columns[0], ascending=False), total.to_frame().T])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--method", default="matched_factored")
    args = parser.parse_args(argv)
    print(compare(load(args.folder, args.method)).to_markdown(floatfmt=".3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
