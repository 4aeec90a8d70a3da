"""The AOT build check: every one of the seven attention matmuls compiles to an FP8 (E4M3) wgmma for sm_90a.

Compiling every kernel of every head dim takes minutes on a CI core, so the tests compile a representative subset
(D = 128 in full: both masks, every quantisation variant and ``matched_factored``'s causal kernels; D = 64 causal and
D = 256 non-causal attention kernels, and the stale dO pass at D = 256; the Q pass at D = 128 under every other
code-store mode, to PTX) and ``dm-kernel-check`` compiles everything (109 kernels; 137 with ``--load-variants``, 217
with ``--store-variants``).
"""

import dataclasses
import json

import pytest

from deltamatch.kernels import check

# which of the spec's seven matmuls (kernels/README.md) each kernel computes
MATMULS = {"attn_fwd": {1, 2}, "attn_bwd_dkdv": {3, 4, 5, 7}, "attn_bwd_dk": {3, 4, 7}, "attn_bwd_dv": {3, 5},
           "attn_bwd_dq": {3, 4, 6}, "attn_bwd_delta_matched": {3, 4}, "quant_pass": set(),
           "quant_do_delta_pass": set(), "per_channel_amax_pass": set(), "per_channel_quant_pass": set(),
           "column_stats": set(), "column_stats_reduce": set(), "block_and_channel_pass": set()}


def _subset():
    yield from ((128, spec) for spec in check.attention_specs(128, causal=True, load_variants=True))
    yield from ((128, spec) for spec in check.attention_specs(128, causal=False))
    yield from ((128, spec) for spec in check.quant_specs(128))
    yield from ((128, spec) for spec in check.factored_specs(128, causal=True))
    yield from ((64, spec) for spec in check.attention_specs(64, causal=True))
    yield from ((256, spec) for spec in check.attention_specs(256, causal=False))
    # the stale dO pass at D = 256 runs on 32 registers (its 256 div.rn slow-path calls make ptxas spill the block)
    yield from ((256, spec) for spec in check.quant_specs(256) if spec.variant == "do_stale")


@pytest.fixture(scope="module")
def rows():
    return [check.analyse(spec, d) for d, spec in _subset()]


def test_the_default_covers_both_masks_and_every_quant_variant():
    specs = check.kernel_specs(128, load_variants=True)
    variants = {(s.name, s.variant) for s in specs}
    for name in ("attn_fwd", "attn_bwd_delta_matched", "attn_bwd_dk", "attn_bwd_dv", "attn_bwd_dq"):
        assert {(name, "causal"), (name, "non-causal")} <= variants
        # launched through TMA at D = 128 (triton_fwd.tma_enabled), so the other loads are the pointer ones; the δ
        # pass is launched through pointers (triton_bwd.backward_config), so its other loads are TMA's
        other = "tma" if name == "attn_bwd_delta_matched" else "pointers"
        assert {(name, f"causal-{other}"), (name, f"non-causal-{other}")} <= variants
    for s in specs:
        if s.name.startswith("attn_"):
            launched_tma = s.name != "attn_bwd_delta_matched"
            assert s.constexprs.get("TMA", False) == (launched_tma != s.variant.endswith(("-pointers", "-tma"))), s
    assert not any(s.variant.endswith(("-tma", "-pointers")) for s in check.kernel_specs(128))  # launched only
    assert {s.variant for s in check.attention_specs(64, True, load_variants=True)} == {"causal", "causal-tma"}
    assert {v for n, v in variants if n == "quant_pass"} == {"q", "k", "v"}
    assert {v for n, v in variants if n == "quant_do_delta_pass"} == {"do_matched", "do_stale", "do_consistent"}
    for name in ("attn_fwd", "attn_bwd_delta_matched", "attn_bwd_dk", "attn_bwd_dv", "attn_bwd_dq"):  # matched_factored
        factored = [s for s in specs if (s.name, s.variant) == (name, "causal-factored")]
        assert len(factored) == 1 and factored[0].constexprs.get("FACTORED", name == "attn_bwd_delta_matched"), name
    assert next(s for s in specs if s.variant == "causal-factored" and s.name.endswith("delta_matched")).constexprs[
        "ROW_SCALES"]
    assert {v for n, v in variants if n.startswith("per_channel")} == {"v_channel", "k_channel", "q_channel"}
    both = {s.variant: s.constexprs for s in specs if s.name == "block_and_channel_pass"}
    assert set(both) == {"k_both", "v_both", "do_both"}
    assert both["k_both"]["CENTRE"] and both["k_both"]["FRAGMENT_ORDER"] and both["k_both"]["BLOCK_ROWS"] == 64
    assert not both["v_both"]["CENTRE"] and both["do_both"]["BLOCK_ROWS"] == 128
    k = next(s for s in check.kernel_specs(64) if s.variant == "k")
    assert k.constexprs["CENTRE"] and k.constexprs["BLOCK_ROWS"] == 64


def test_store_variants_cover_every_pass_that_stores_codes_under_every_other_mode():
    from deltamatch.kernels.triton_quant import STORE_MODE, STORE_MODES

    launched = [s for s in check.kernel_specs(128) if "STORE_MODE" in s.constexprs]
    assert {s.name for s in launched} == {"quant_pass", "quant_do_delta_pass", "per_channel_quant_pass",
                                          "block_and_channel_pass"}
    assert all(s.constexprs["STORE_MODE"] == STORE_MODE for s in launched)
    extra = check.kernel_specs(128, store_variants=True)[len(check.kernel_specs(128)):]
    assert len(extra) == len(launched) * (len(STORE_MODES) - 1)
    assert {(s.name, s.variant, s.constexprs["STORE_MODE"]) for s in extra} == {
        (s.name, f"{s.variant}-{name}", mode) for s in launched for name, mode in STORE_MODES.items()
        if mode != STORE_MODE}


def test_store_modes_quantise_each_block_once():
    """With both code stores as pointer stores, Triton 3.6 converts the BF16 block and quantises it twice, once per
    layout (triton_quant's docstring: 129 ``div.rn`` in the Q pass at D = 128). Every other store mode must hold one
    ``div.rn`` per element a thread quantises, and one for the block's scale."""
    from deltamatch.kernels.triton_quant import STORE_MODES

    q = check.quant_specs(128)[0]
    per_thread = 128 * 128 // (32 * q.options["num_warps"])
    for name, mode in STORE_MODES.items():
        if name != "pointers":
            spec = dataclasses.replace(q, constexprs={**q.constexprs, "STORE_MODE": mode})
            assert check.compile_sm90(spec).asm["ptx"].count("div.rn.f32") == per_thread + 1, name


def test_every_matmul_is_an_fp8_wgmma_in_ttgir_ptx_and_sass(rows):
    assert set().union(*(MATMULS[r["name"]] for r in rows if r["head_dim"] == 128)) == set(range(1, 8))
    for r in rows:
        # every dot in the kernel is a warp-group dot on E4M3 operands, and nothing else issues an MMA
        assert r["dots"] == len(MATMULS[r["name"]]) * r["copies"], r
        assert r["fp8_wgmma_dots"] == r["dots"], r
        assert r["other_mma"] == 0, r
        # the PTX holds at least one e4m3 wgmma per dot (one per 32-deep K step), and none without a dot
        assert r["fp8_wgmma"] >= r["dots"] and (r["fp8_wgmma"] == 0) == (r["dots"] == 0), r
        assert r["qgmma"] == r["fp8_wgmma"], r  # one QGMMA in the SASS per wgmma.mma_async e4m3 in the PTX
        # the register count read from cuobjdump covers every register the SASS names
        assert 0 < r["sass_registers"] <= r["registers"] <= 255, r
        assert r["problems"] == [] and r["ok"], r


def test_tma_loads_need_no_more_registers_or_stack_than_pointer_loads(rows):
    """Tiles loaded through TMA descriptors go to shared memory without passing through registers. With Triton 3.6 at
    D = 128, causal: forward 167 registers and no stack (pointers: 255 and 208 B), dK 24 B of stack (1,288), dV none
    (1,032), dQ none (304). D = 128 launches TMA, so the pointer loads are the ``-pointers`` variants; the δ pass is
    launched through pointers (faster on the H200), so its TMA loads are ``-tma``."""
    kernels = {(r["name"], r["variant"]): r for r in rows if r["head_dim"] == 128}
    pairs = {name: (kernels[(name, "causal")], kernels[(name, "causal-pointers")])
             for name, v in kernels if v == "causal-pointers"}
    pairs.update({name: (kernels[(name, "causal-tma")], kernels[(name, "causal")])
                  for name, v in kernels if v == "causal-tma"})
    assert set(pairs) == {"attn_fwd", "attn_bwd_delta_matched", "attn_bwd_dk", "attn_bwd_dv", "attn_bwd_dq"}
    for tma, plain in pairs.values():
        assert tma["spill_bytes"] <= plain["spill_bytes"] and tma["registers"] <= plain["registers"], (tma, plain)
    assert sum(t["spill_bytes"] for t, _ in pairs.values()) < 0.1 * sum(p["spill_bytes"] for _, p in pairs.values())


def _row(**changes):
    good = dict(name="attn_fwd", variant="causal", head_dim=128, matmuls=2, copies=2, dots=4, fp8_wgmma_dots=4,
                fp8_wgmma=12, qgmma=12, other_mma=0, registers=255, sass_registers=255)
    return {**good, **changes}


@pytest.mark.parametrize("changes, problem", [
    ({}, None),
    (dict(fp8_wgmma=0, qgmma=0), "PTX: 0 e4m3"),  # the TTGIR says FP8 wgmma, the PTX has none
    (dict(qgmma=6), "SASS: 6 QGMMA"),
    (dict(qgmma=0), "SASS: 0 QGMMA"),
    (dict(fp8_wgmma_dots=3), "TTGIR"),
    (dict(other_mma=2), "not FP8 wgmma"),
    (dict(registers=32, sass_registers=40), "register count 32"),
    (dict(name="quant_pass", matmuls=0, copies=1, dots=0, fp8_wgmma_dots=0, fp8_wgmma=2, qgmma=2), "PTX: 2 e4m3"),
])
def test_cli_fails_when_ptx_or_sass_disagree(changes, problem, capsys, monkeypatch):
    def analyse(spec, head_dim):  # the counts of a compiled kernel, doctored; judged as ``analyse`` judges them
        row = _row(**changes)
        return {**row, "problems": check.problems(row), "ok": not check.problems(row)}

    monkeypatch.setattr(check, "kernel_specs", lambda d, causal, *variants: check.attention_specs(d, True)[:1])
    monkeypatch.setattr(check, "analyse", analyse)
    assert check.main(["--head-dims", "128"]) == (0 if problem is None else 1)
    (printed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (problem is None) == (printed["problems"] == [])
    assert problem is None or problem in printed["problems"][0]


def test_cli_prints_one_json_object_per_kernel(capsys, tmp_path, monkeypatch):
    seen = []

    def specs(d, causal, *variants):
        seen.append((causal, *variants))
        return check.quant_specs(d)[-1:]

    monkeypatch.setattr(check, "kernel_specs", specs)
    out = tmp_path / "check.jsonl"
    assert check.main(["--head-dims", "64", "--out", str(out)]) == 0
    assert seen == [((True, False), False, False)]  # both masks, the launched variants only, unless asked otherwise
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["name"], r["variant"]) for r in printed] == [("quant_do_delta_pass", "do_consistent")]
    assert printed[0]["ok"] and printed[0]["registers"] >= printed[0]["sass_registers"] > 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == printed
    check.main(["--head-dims", "64", "--causal", "no", "--store-variants"])
    assert seen[-1] == ((False,), False, True)


def test_cli_rejects_unknown_head_dim(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        check.main(["--head-dims", "96"])
    assert exit_.value.code == 2 and "head_dims [96]" in capsys.readouterr().err
    config = tmp_path / "check.yaml"  # what the pipeline writes from kernel.check
    config.write_text("head_dims: [64]\ncausal: sometimes\n")
    with pytest.raises(SystemExit):
        check.main(["--config", str(config)])
    assert "causal 'sometimes'" in capsys.readouterr().err
