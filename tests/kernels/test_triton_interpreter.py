"""The Triton FP8 kernels in Triton's CPU interpreter, against the PyTorch reference simulation of the same spec.

The cases run in a child process under the interpreter, which poisons ``torch.empty`` with NaN (triton_child.py).
The interpreter casts FP32 to FP8 by truncation, so the kernels round to the E4M3 grid in FP32 first
(``ROUND_FP32``), which this also exercises.

Tolerances: kernel and reference see the same codes for Q, K, V, dO; they differ in accumulation order and in a few
FP8 roundings of P and dS (the kernel quantises P before normalising, and multiplies by the reciprocal scale), so the
kernel–reference distance must be far below the FP8 error itself (kernel or reference against FP64).
"""

import os

import pytest
import torch

from triton_child import child_main, patch_interpreter_index, run_child

CASES = [  # (mode, causal, n, h, h_kv, d); D = 64 runs the paired forward tiles and the fused dK/dV kernel
    ("matched", True, 130, 2, 1, 64),
    ("stale", True, 130, 2, 1, 64),
    ("consistent", False, 80, 2, 2, 64),
    ("matched", False, 80, 2, 2, 64),
    ("stale", True, 80, 2, 1, 128),  # D = 128 launches dK and dV separately (backward_config)
    ("matched_factored", True, 130, 4, 2, 128),  # the factored scale layout: every kernel FACTORED
    ("matched_factored", False, 80, 2, 2, 64),
]


def _grads_of(fn, q, k, v, do, dtype) -> list:
    """[O, dQ, dK, dV] of ``fn`` on copies of q, k, v in ``dtype``, backward from ``do``."""
    ins = [t.detach().clone().to(dtype).requires_grad_() for t in (q, k, v)]
    o = fn(*ins)
    o.backward(do.to(o.dtype))
    return [o.detach(), *(t.grad for t in ins)]


def _measure() -> dict:
    import torch

    from deltamatch.kernels import quant
    from deltamatch.kernels.measures import relative_error
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_quant import quantize_operand

    patch_interpreter_index()
    out = {"quant": {}, "cases": [], "poisoned": bool(torch.isnan(torch.empty(4)).all())}
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(1, 200, 2, 64, generator=gen) * 3).to(torch.bfloat16)
    x[:, :, :, 5] *= 40  # an outlier channel, so scales differ between blocks
    for rows in (64, 128):
        x8, x8t, scales = quantize_operand(x, rows)
        codes = x8[:, :, :200].float()
        deq = codes * scales.repeat_interleave(rows, dim=-1)[..., :200, None]
        ref, ref_scales = quant.quantize_tiles(x.float().transpose(1, 2), rows, None)
        out["quant"][rows] = dict(
            max_abs_diff=(deq - ref).abs().max().item(),
            scale_diff=(scales[..., : ref_scales.shape[-2]] - ref_scales[..., 0]).abs().max().item(),
            transposed_equal=bool(torch.equal(x8.float().transpose(-1, -2), x8t.float())),
            padding_zero=bool((x8[:, :, 200:].float() == 0).all()),
        )
    for mode, causal, n, h, h_kv, d in CASES:
        q = torch.randn(1, n, h, d, generator=gen) * 1.5
        k = torch.randn(1, n, h_kv, d, generator=gen) * 1.5 + 0.5  # an offset that K centring removes
        v = torch.randn(1, n, h_kv, d, generator=gen)
        do = torch.randn(1, n, h, d, generator=gen)
        results = {}
        for name, fn in (("kernel", lambda a, b, c: triton_attention(a, b, c, causal, mode)),
                         ("reference", lambda a, b, c: attention_reference(a, b, c, causal, mode)),
                         ("exact", lambda a, b, c: attention_exact(a, b, c, causal))):
            dtype = torch.float64 if name == "exact" else torch.bfloat16
            results[name] = [t.double() for t in _grads_of(fn, q, k, v, do, dtype)]
        row = dict(mode=mode, causal=causal, n=n)
        for i, part in enumerate(("o", "dq", "dk", "dv")):
            row[part] = dict(
                kernel_vs_reference=relative_error(results["kernel"][i], results["reference"][i]),
                kernel_vs_exact=relative_error(results["kernel"][i], results["exact"][i]),
                reference_vs_exact=relative_error(results["reference"][i], results["exact"][i]),
                finite=bool(torch.isfinite(results["kernel"][i]).all()),
            )
        out["cases"].append(row)
    out["tma"] = _tma_forward(gen)
    out["factored"] = _factored_outliers(gen)
    out["dq_atomic"] = _dq_atomic(gen)
    out["inverses"] = _row_scale_inverses(gen)
    return out


def _row_scale_inverses(gen) -> dict:
    """``triton_bwd.row_scale_inverses`` on a ragged length (not a multiple of its 1024-wide blocks; the output starts
    as the child's NaN-poisoned ``torch.empty``) against PyTorch's 1 / s: the interpreter divides as IEEE does."""
    import torch

    from deltamatch.kernels.triton_bwd import row_scale_inverses

    rs = torch.rand(3, 2, 250, generator=gen) * 1e-3 + 1e-6
    rs[0, 0, :7] = 1.0  # the padded rows' scale
    ours = row_scale_inverses(rs)
    return dict(equal=bool(torch.equal(ours, 1.0 / rs)), shape=list(ours.shape))


def _dq_atomic(gen) -> list[dict]:
    """dQ by atomic adds in the dK launch (``DELTAMATCH_KERNEL_DQ_ATOMIC=1``) against the reference simulation and FP64
    (the bar every kernel meets), beside the dQ kernel's; O, dK, dV must not change (GQA, ragged N, matched's δ)."""
    import torch

    from deltamatch.kernels.measures import relative_error
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import DQ_ATOMIC_SWITCH

    rows = []
    for mode, causal, n, h, h_kv, d in (("matched", True, 130, 4, 2, 128), ("stale", False, 70, 2, 2, 128)):
        q, k, v, do = (torch.randn(1, n, hh, d, generator=gen).to(torch.bfloat16) for hh in (h, h_kv, h_kv, h))
        outs = {}
        for name, fn in (("kernel", lambda a, b, c: triton_attention(a, b, c, causal, mode)),
                         ("atomic", lambda a, b, c: triton_attention(a, b, c, causal, mode)),
                         ("reference", lambda a, b, c: attention_reference(a, b, c, causal, mode)),
                         ("exact", lambda a, b, c: attention_exact(a, b, c, causal))):
            os.environ[DQ_ATOMIC_SWITCH] = "1" if name == "atomic" else "0"
            outs[name] = _grads_of(fn, q, k, v, do, torch.float64 if name == "exact" else torch.bfloat16)
        os.environ.pop(DQ_ATOMIC_SWITCH)
        dq = {name: grads[1].double() for name, grads in outs.items()}
        rows.append(dict(mode=mode, n=n, atomic_vs_reference=relative_error(dq["atomic"], dq["reference"]),
                         kernel_vs_reference=relative_error(dq["kernel"], dq["reference"]),
                         reference_vs_exact=relative_error(dq["reference"], dq["exact"]),
                         others_equal=all(torch.equal(a, b) for i, (a, b) in enumerate(zip(outs["kernel"],
                                                                                           outs["atomic"])) if i != 1),
                         finite=bool(torch.isfinite(outs["atomic"][1]).all())))
    return rows


def _factored_outliers(gen) -> list[dict]:
    """``matched_factored`` (every kernel in the factored scale layout: P̂ at the fixed scale 1/448 against V̂ and dÔ
    per channel, dŜ per query row against K̂ᶜ and Q' = s ⊙ Q per channel) on inputs with an outlier channel in one
    head of each operand — what per-channel scales are for, and under GQA the heads' channel scales differ, so dK and
    dV are rescaled per head — against the reference simulation and FP64."""
    import torch

    from deltamatch.kernels.measures import relative_error
    from deltamatch.kernels.reference import attention_exact, attention_reference
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_bwd import FACTORED_SEPARATE_SWITCH
    from deltamatch.kernels.triton_fwd import FACTORED_PAIRED_SWITCH, FACTORED_WIDE_SWITCH
    from deltamatch.kernels.triton_quant import ONE_READ_SWITCH

    rows = []
    for causal, n, h, h_kv, d in ((True, 130, 4, 2, 128), (False, 70, 2, 1, 64)):
        q, k, v, do = (torch.randn(1, n, hh, d, generator=gen) for hh in (h, h_kv, h_kv, h))
        for x, channel, factor in ((q, 5, 8.0), (k, 9, 8.0), (v, 3, 30.0), (do, 3, 20.0)):
            x[:, :, 0, channel] *= factor
        outs = {}
        outs_fn = lambda a, b, c: triton_attention(a, b, c, causal, "matched_factored")  # noqa: E731
        for name, fn in (("kernel", outs_fn),
                         ("reference", lambda a, b, c: attention_reference(a, b, c, causal, "matched_factored")),
                         ("exact", lambda a, b, c: attention_exact(a, b, c, causal))):
            dtype = torch.float64 if name == "exact" else torch.bfloat16
            outs[name] = [t.double() for t in _grads_of(fn, q, k, v, do, dtype)]
        os.environ[ONE_READ_SWITCH] = "1"  # K, V and dO's two copies from one read each, K's mean from its own pass
        outs["one_read"] = [t.double() for t in _grads_of(outs_fn, q, k, v, do, torch.bfloat16)]
        del os.environ[ONE_READ_SWITCH]
        os.environ[FACTORED_PAIRED_SWITCH] = "1"  # the forward's unmasked key tiles two at a time
        outs["paired"] = [t.double() for t in _grads_of(outs_fn, q, k, v, do, torch.bfloat16)]
        del os.environ[FACTORED_PAIRED_SWITCH]
        os.environ[FACTORED_WIDE_SWITCH] = "1"  # the forward's key tiles 128 keys wide
        outs["wide"] = [t.double() for t in _grads_of(outs_fn, q, k, v, do, torch.bfloat16)]
        del os.environ[FACTORED_WIDE_SWITCH]
        for name, separate in (("separate", "1"), ("fused", "0")):  # dK and dV in two launches, then in one
            os.environ[FACTORED_SEPARATE_SWITCH] = separate
            outs[name] = [t.double() for t in _grads_of(outs_fn, q, k, v, do, torch.bfloat16)]
        del os.environ[FACTORED_SEPARATE_SWITCH]
        row = {part: dict(kernel_vs_reference=relative_error(outs["kernel"][i], outs["reference"][i]),
                          one_read_vs_reference=relative_error(outs["one_read"][i], outs["reference"][i]),
                          paired_vs_reference=relative_error(outs["paired"][i], outs["reference"][i]),
                          wide_vs_reference=relative_error(outs["wide"][i], outs["reference"][i]),
                          reference_vs_exact=relative_error(outs["reference"][i], outs["exact"][i]),
                          fused_equal=torch.equal(outs["fused"][i], outs["separate"][i]),
                          finite=all(bool(torch.isfinite(outs[name][i]).all())
                                     for name in ("kernel", "one_read", "paired", "wide")))
               for i, part in enumerate(("o", "dq", "dk", "dv"))}
        with torch.no_grad():  # no backward follows: the forward skips the backward's copies
            o_alone = triton_attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), causal,
                                       "matched_factored")
        row["o"]["no_grad_equal"] = torch.equal(o_alone.double(), outs["kernel"][0])
        row["o"]["paired_differs"] = not torch.equal(outs["paired"][0], outs["kernel"][0])
        row["o"]["wide_differs"] = not torch.equal(outs["wide"][0], outs["kernel"][0])
        rows.append(row)
    return rows


def _tma_forward(gen) -> list[dict]:
    """Every kernel through TMA descriptors against the same kernel through pointers, on the same codes (GQA,
    ragged N, the paired forward tiles, matched's δ pass): the loads change, not the arithmetic."""
    import torch

    from deltamatch.kernels.triton_bwd import attention_backward, backward_config
    from deltamatch.kernels.triton_fwd import attention_forward, forward_config
    from deltamatch.kernels.triton_quant import BLOCK_KV, BLOCK_Q, quantize_do_and_delta, quantize_operand

    rows = []
    for mode, causal, n, h, h_kv, d in (("matched", True, 130, 4, 2, 64), ("stale", False, 80, 2, 2, 128)):
        q, k, v, do = (torch.randn(1, n, hh, d, generator=gen).to(torch.bfloat16) for hh in (h, h_kv, h_kv, h))
        q8, q8t, sq = quantize_operand(q, BLOCK_Q)
        k8, k8t, sk = quantize_operand(k, BLOCK_KV, centre=True)
        v8, v8t, sv = quantize_operand(v, BLOCK_KV)
        outs = []
        for tma in (False, True):
            o, lse2 = attention_forward(q8, k8, v8t, sq, sk, sv, q.shape, q.dtype, causal, d ** -0.5,
                                        config={**forward_config(d), "TMA": tma})
            saved = dict(q8=q8, q8t=q8t, k8=k8, k8t=k8t, v8=v8, v8t=v8t, sq=sq, sk=sk, sv=sv, lse2=lse2)
            do8, do8t, sdo, delta = quantize_do_and_delta(do, o, mode)
            grads = attention_backward(saved, do8, do8t, sdo, delta, mode, causal, d ** -0.5, n, (q.shape, k.shape),
                                       (q.dtype, k.dtype),
                                       config={kind: {**c, "TMA": tma} for kind, c in backward_config(d).items()})
            outs.append([o, lse2[..., :n], *grads])
        rows.append(dict(mode=mode, causal=causal, n=n, d=d,
                         equal={name: bool(torch.equal(a, b)) for name, a, b in zip(("o", "lse", "dq", "dk", "dv"),
                                                                                     *outs)},
                         finite=all(bool(torch.isfinite(t.float()).all()) for t in outs[1])))
    return rows


@pytest.fixture(scope="module")
def measured():
    return run_child(__file__, timeout=600)


def test_the_child_poisons_unwritten_memory(measured):
    assert measured["poisoned"]


def test_quant_pass_matches_reference_quantiser(measured):
    for rows, m in measured["quant"].items():
        assert m["max_abs_diff"] == 0.0, (rows, m)
        assert m["scale_diff"] == 0.0, (rows, m)
        assert m["transposed_equal"] and m["padding_zero"], (rows, m)


def test_tma_loads_give_the_bits_of_pointer_loads(measured):
    assert len(measured["tma"]) == 2
    for row in measured["tma"]:
        assert all(row["equal"].values()) and len(row["equal"]) == 5 and row["finite"], row


def test_row_scale_inverses_cover_every_element_of_a_ragged_tensor(measured):
    assert measured["inverses"] == dict(equal=True, shape=[3, 2, 250])


def test_atomic_dq_matches_the_reference_and_leaves_o_dk_dv_alone(measured):
    assert len(measured["dq_atomic"]) == 2
    for m in measured["dq_atomic"]:
        assert m["finite"] and m["others_equal"], m
        assert m["atomic_vs_reference"] < 0.25 * m["reference_vs_exact"], m


def test_factored_layout_matches_its_reference_simulation_with_outlier_channels(measured):
    assert len(measured["factored"]) == 2
    for row in measured["factored"]:
        for part, m in row.items():
            assert m["finite"], (part, m)
            assert m["kernel_vs_reference"] < 0.25 * m["reference_vs_exact"], (part, m)
            assert m["one_read_vs_reference"] < 0.25 * m["reference_vs_exact"], (part, m)  # DELTAMATCH_KERNEL_ONE_READ
            assert m["paired_vs_reference"] < 0.25 * m["reference_vs_exact"], (part, m)  # DELTAMATCH_KERNEL_FWD_PAIRED
            assert m["wide_vs_reference"] < 0.25 * m["reference_vs_exact"], (part, m)  # DELTAMATCH_KERNEL_FWD_WIDE
            assert m["fused_equal"], (part, m)  # DELTAMATCH_KERNEL_FACTORED_SEPARATE: one dK/dV launch or two
            assert m["reference_vs_exact"] < 0.12, (part, m)  # it is FP8, not garbage
    assert measured["factored"][0]["o"]["paired_differs"]  # causal, N = 130: row block 2's first 128 keys are a pair
    # and one wide tile; row block 1's diagonal a masked wide tile, as is every row block's at N = 70
    assert all(row["o"]["wide_differs"] for row in measured["factored"])
    assert all(row["o"]["no_grad_equal"] for row in measured["factored"])  # O without a backward to follow


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c[0]}-causal{c[1]}-n{c[2]}" for c in CASES])
def test_kernel_matches_reference_simulation(measured, index):
    row = measured["cases"][index]
    for part in ("o", "dq", "dk", "dv"):
        m = row[part]
        assert m["finite"], (part, m)
        assert m["kernel_vs_reference"] < 0.25 * m["reference_vs_exact"], (part, m)
        assert m["kernel_vs_exact"] < 1.15 * m["reference_vs_exact"] + 1e-3, (part, m)
        assert m["reference_vs_exact"] < 0.12, (part, m)  # it is FP8, not garbage


def test_tma_is_launched_at_the_head_dims_timed_faster_and_the_switch_overrides_it(monkeypatch):
    """TMA loads at D = 128 for every kernel but the δ pass (pointer loads: faster on the H200, session 16), and at
    D = 256 for every kernel but the δ pass and the paper layout's dQ (an H100, session 41); the factored layout's dQ
    takes them at both. The switch puts every kernel of every head dim on one or the other."""
    from deltamatch.kernels.triton_bwd import backward_config, factored_config
    from deltamatch.kernels.triton_fwd import TMA_SWITCH, forward_config

    def launched_with_tma(d):  # forward, dK/dV, dQ, δ; then the factored layout's forward, dK/dV, dQ
        paper = {"fwd": forward_config(d), **backward_config(d)}
        factored = {"fwd": forward_config(d, factored=True), **factored_config(backward_config(d), d)}
        return (tuple(bool(paper[k].get("TMA")) for k in ("fwd", "dkdv", "dq", "delta"))
                + tuple(bool(factored[k].get("TMA")) for k in ("fwd", "dkdv", "dq")))

    monkeypatch.delenv(TMA_SWITCH, raising=False)
    assert [launched_with_tma(d) for d in (64, 128, 256)] == [(False,) * 7, (True, True, True, False, True, True, True),
                                                              (True, True, False, False, True, True, True)]
    monkeypatch.setenv(TMA_SWITCH, "1")
    assert [launched_with_tma(d) for d in (64, 128, 256)] == [(True,) * 7] * 3
    monkeypatch.setenv(TMA_SWITCH, "0")
    assert [launched_with_tma(d) for d in (64, 128, 256)] == [(False,) * 7] * 3
    monkeypatch.setenv(TMA_SWITCH, "yes")
    with pytest.raises(ValueError, match="DELTAMATCH_KERNEL_TMA='yes'"):
        forward_config(128)



def test_the_factored_forward_pairs_key_tiles_only_under_its_switch(monkeypatch):
    from deltamatch.kernels.triton_fwd import FACTORED_PAIRED_SWITCH, forward_config

    monkeypatch.delenv(FACTORED_PAIRED_SWITCH, raising=False)
    assert [forward_config(d, factored=True)["PAIRED"] for d in (64, 128, 256)] == [False] * 3
    assert forward_config(64)["PAIRED"]  # the paper layout's D = 64 forward pairs them regardless
    monkeypatch.setenv(FACTORED_PAIRED_SWITCH, "1")
    assert [forward_config(d, factored=True)["PAIRED"] for d in (64, 128, 256)] == [True] * 3
    monkeypatch.setenv(FACTORED_PAIRED_SWITCH, "on")
    with pytest.raises(ValueError, match="DELTAMATCH_KERNEL_FWD_PAIRED='on'"):
        forward_config(128, factored=True)


def test_the_factored_forward_widens_its_key_tiles_only_under_its_switch(monkeypatch):
    """128-key tiles at half the stages (the same shared memory a stage), for the factored forward alone; the
    paper layout's scales are per 64 keys, so its tiles stay 64 wide, and the pairs take precedence."""
    from deltamatch.kernels.triton_fwd import FACTORED_PAIRED_SWITCH, FACTORED_WIDE_SWITCH, forward_config

    monkeypatch.delenv(FACTORED_PAIRED_SWITCH, raising=False)
    monkeypatch.delenv(FACTORED_WIDE_SWITCH, raising=False)
    narrow = [forward_config(d, factored=True) for d in (64, 128, 256)]
    assert [c["BLOCK_N"] for c in narrow] == [64] * 3
    monkeypatch.setenv(FACTORED_WIDE_SWITCH, "1")
    wide = [forward_config(d, factored=True) for d in (64, 128, 256)]
    assert [c["BLOCK_N"] for c in wide] == [128] * 3
    assert [c["num_stages"] for c in wide] == [max(1, c["num_stages"] // 2) for c in narrow]
    assert [forward_config(d)["BLOCK_N"] for d in (64, 128, 256)] == [64] * 3
    monkeypatch.setenv(FACTORED_PAIRED_SWITCH, "1")
    assert forward_config(128, factored=True)["BLOCK_N"] == 64 and forward_config(128, factored=True)["PAIRED"]
    monkeypatch.setenv(FACTORED_WIDE_SWITCH, "2")
    monkeypatch.delenv(FACTORED_PAIRED_SWITCH)
    with pytest.raises(ValueError, match="DELTAMATCH_KERNEL_FWD_WIDE='2'"):
        forward_config(128, factored=True)


def test_factored_dots_promote_every_tile_unless_the_switch_says_0(monkeypatch):
    from deltamatch.kernels.triton_bwd import backward_config, factored_config
    from deltamatch.kernels.triton_fwd import ACC_PROMOTE_SWITCH, FACTORED_ACC_PROMOTE, forward_config

    def promotes():
        configs = [forward_config(128, factored=True), *factored_config(backward_config(128), 128).values()]
        return [c.get("ACC_PROMOTE") for c in configs]

    monkeypatch.delenv(ACC_PROMOTE_SWITCH, raising=False)
    assert promotes() == [FACTORED_ACC_PROMOTE] * 3 + [None]  # the δ pass has no in-place dot
    monkeypatch.setenv(ACC_PROMOTE_SWITCH, "0")
    assert promotes() == [None] * 4
    monkeypatch.setenv(ACC_PROMOTE_SWITCH, "2")
    with pytest.raises(ValueError, match="DELTAMATCH_KERNEL_ACC_PROMOTE='2'"):
        forward_config(128, factored=True)


def test_the_cuda_kernels_run_only_where_they_can_and_say_why_not(monkeypatch, tmp_path):
    """Unset, matched_factored's forward and its dK, dV and dQ stay on Triton wherever the CUDA kernels cannot run
    (here: no GPU); asked for by the switch, that is an error naming the reason."""
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_bwd import CUDA_SWITCH, cuda_kernels_selected

    monkeypatch.delenv(CUDA_SWITCH, raising=False)
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    for what in ("forward", "backward", "δ pass"):
        assert not cuda_kernels_selected(128, torch.bfloat16, what=what)
    monkeypatch.setattr("deltamatch.kernels.triton_bwd.CUDA_DEFAULT", {"forward": True, "backward": True,
                                                                       "δ pass": True})
    assert not cuda_kernels_selected(128, torch.bfloat16, what="forward")  # the library is missing
    monkeypatch.setenv(CUDA_SWITCH, "0")
    assert not cuda_kernels_selected(128, torch.bfloat16, stats=False, default_config=True)
    monkeypatch.setenv(CUDA_SWITCH, "1")
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA=1 but the CUDA backward kernels cannot run: .*missing"):
        cuda_kernels_selected(128, torch.bfloat16, stats=False, default_config=True)
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA=1 but the CUDA forward kernels cannot run: .*missing"):
        cuda_kernels_selected(128, torch.bfloat16, what="forward")
    # through dm_attn_func's Triton path on the CPU: the forward asks first, and says so
    q = torch.randn(1, 64, 1, 128, dtype=torch.bfloat16)
    from deltamatch.kernels.triton_attention import fp8_forward

    with pytest.raises(RuntimeError, match="CUDA forward kernels cannot run"):
        fp8_forward(q, q, q, True, "matched_factored", 128**-0.5)



def test_the_128_key_cuda_forward_is_the_default_only_where_it_can_run(monkeypatch, tmp_path):
    """``DELTAMATCH_KERNEL_CUDA_FWD`` unset: the 128-key CUDA forward wherever the library loads at D = 128 or 64 (not
    here: no GPU, so Triton's; at D = 64 its D = 64 build); a variant asked for where it cannot run, or one not built
    at that head dim, or a bad value, is an error naming the switch."""
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_attention import fp8_forward
    from deltamatch.kernels.triton_bwd import CUDA_SWITCH
    from deltamatch.kernels.triton_fwd import CUDA_FWD_DEFAULT, CUDA_FWD_SWITCH, cuda_forward_variant

    monkeypatch.delenv(CUDA_SWITCH, raising=False)
    monkeypatch.delenv(CUDA_FWD_SWITCH, raising=False)
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    assert cuda_forward_variant(128, torch.bfloat16) is None
    monkeypatch.setattr(cuda_lib, "load", lambda *a: (object(), ""))  # as if it loaded on an sm90 GPU
    assert cuda_forward_variant(128, torch.bfloat16) == CUDA_FWD_DEFAULT == "w4p"
    assert cuda_forward_variant(64, torch.bfloat16) == "w4p"  # the D = 64 build, the default since session 42
    assert cuda_forward_variant(256, torch.bfloat16) is None and cuda_forward_variant(128, torch.float32) is None
    monkeypatch.setenv(CUDA_SWITCH, "1")  # every kernel through CUDA with Triton's bits: fwd_factored.cu
    assert cuda_forward_variant(128, torch.bfloat16) is None
    monkeypatch.setenv(CUDA_FWD_SWITCH, "w4pp")
    assert cuda_forward_variant(128, torch.bfloat16) == "w4pp"
    monkeypatch.setenv(CUDA_FWD_SWITCH, "0")
    assert cuda_forward_variant(128, torch.bfloat16) is None
    monkeypatch.setenv(CUDA_FWD_SWITCH, "w9")
    with pytest.raises(ValueError, match="DELTAMATCH_KERNEL_CUDA_FWD='w9'"):
        cuda_forward_variant(128, torch.bfloat16)
    monkeypatch.setenv(CUDA_FWD_SWITCH, "w4")
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_FWD=w4 but the CUDA forward cannot run: head dim 256"):
        cuda_forward_variant(256, torch.bfloat16)
    with pytest.raises(ValueError, match=r"DELTAMATCH_KERNEL_CUDA_FWD='w4': expected one of \('w4p', 'w4pe8', "):
        cuda_forward_variant(64, torch.bfloat16)  # D = 64 is built as w4p and its emulating forms
    monkeypatch.setenv(CUDA_FWD_SWITCH, "w4pe4")
    assert cuda_forward_variant(64, torch.bfloat16) == "w4pe4"
    monkeypatch.undo()
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    monkeypatch.setenv(CUDA_FWD_SWITCH, "w4")
    q = torch.randn(1, 64, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_FWD=w4 but the CUDA forward cannot run: .*missing"):
        fp8_forward(q, q, q, True, "matched_factored", 128**-0.5)

def test_the_128_key_cuda_delta_pass_is_the_default_only_where_it_can_run(monkeypatch, tmp_path):
    """``DELTAMATCH_KERNEL_CUDA_DELTA`` unset: the δ pass over 128-key tiles wherever the library loads at D = 128 or 64
    with the default config and no diagnostics (not here: no GPU, so Triton's); ``DELTAMATCH_KERNEL_CUDA`` set either way
    keeps the δ pass it picks; a variant asked for where it cannot run, or a bad value, is an error naming the
    switch."""
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_bwd import CUDA_DELTA_DEFAULT, CUDA_DELTA_SWITCH, CUDA_SWITCH, cuda_delta_variant

    monkeypatch.delenv(CUDA_SWITCH, raising=False)
    monkeypatch.delenv(CUDA_DELTA_SWITCH, raising=False)
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    assert cuda_delta_variant(128) is None
    monkeypatch.setattr(cuda_lib, "load", lambda *a: (object(), ""))  # as if it loaded on an sm90 GPU
    assert cuda_delta_variant(128) == CUDA_DELTA_DEFAULT in cuda_lib.DELTA_WIDE_VARIANTS
    assert cuda_delta_variant(64) == CUDA_DELTA_DEFAULT in cuda_lib.DELTA_WIDE_D64_VARIANTS  # since session 42
    assert cuda_delta_variant(256) is None and cuda_delta_variant(64, stats=True) is None
    assert cuda_delta_variant(128, stats=True) is None and cuda_delta_variant(128, default_config=False) is None
    monkeypatch.setenv(CUDA_SWITCH, "0")
    assert cuda_delta_variant(128) is None
    monkeypatch.setenv(CUDA_DELTA_SWITCH, "w4")
    assert cuda_delta_variant(128) == "w4"
    monkeypatch.setenv(CUDA_DELTA_SWITCH, "0")
    assert cuda_delta_variant(128) is None
    monkeypatch.setenv(CUDA_DELTA_SWITCH, "w9")
    with pytest.raises(ValueError, match="DELTAMATCH_KERNEL_CUDA_DELTA='w9'"):
        cuda_delta_variant(128)
    monkeypatch.setenv(CUDA_DELTA_SWITCH, "w4p")
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_DELTA=w4p but the CUDA δ pass cannot run: head dim"):
        cuda_delta_variant(256)
    assert cuda_delta_variant(64) == "w4p"  # the D = 64 build's
    monkeypatch.setenv(CUDA_DELTA_SWITCH, "w4t")
    with pytest.raises(ValueError, match=r"DELTAMATCH_KERNEL_CUDA_DELTA='w4t': expected one of \('w4p', "):
        cuda_delta_variant(64)  # not built at D = 64
    monkeypatch.undo()
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    monkeypatch.setenv(CUDA_DELTA_SWITCH, "w4")
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_DELTA=w4 but the CUDA δ pass cannot run: .*missing"):
        cuda_delta_variant(128)


def test_the_d64_cuda_dkdv_is_the_default_only_where_it_can_run(monkeypatch, tmp_path):
    """``DELTAMATCH_KERNEL_CUDA_DKDV64`` unset: the CUDA dK/dV kernel's D = 64 build wherever the library loads at
    D = 64 with the default config, bf16 or fp16, no diagnostics and ``DELTAMATCH_KERNEL_CUDA`` unset (not here: no
    GPU, so Triton's launch); never at another head dim unless asked, and then an error; a bad value is an error naming
    the switch."""
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_bwd import (CUDA_DKDV64_DEFAULT, CUDA_DKDV64_SWITCH, CUDA_SWITCH,
                                               cuda_dkdv64_variant)

    monkeypatch.delenv(CUDA_SWITCH, raising=False)
    monkeypatch.delenv(CUDA_DKDV64_SWITCH, raising=False)
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    assert cuda_dkdv64_variant(64, torch.bfloat16) is None
    monkeypatch.setattr(cuda_lib, "load", lambda *a: (object(), ""))  # as if it loaded on an sm90 GPU
    assert cuda_dkdv64_variant(64, torch.bfloat16) == CUDA_DKDV64_DEFAULT in cuda_lib.DKDV_D64_WITH_DQ
    assert cuda_dkdv64_variant(64, torch.float16) == CUDA_DKDV64_DEFAULT
    assert cuda_dkdv64_variant(128, torch.bfloat16) is None and cuda_dkdv64_variant(256, torch.bfloat16) is None
    assert cuda_dkdv64_variant(64, torch.float32) is None
    assert cuda_dkdv64_variant(64, torch.bfloat16, stats=True) is None
    assert cuda_dkdv64_variant(64, torch.bfloat16, default_config=False) is None
    monkeypatch.setenv(CUDA_SWITCH, "0")
    assert cuda_dkdv64_variant(64, torch.bfloat16) is None
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "ws4")
    assert cuda_dkdv64_variant(64, torch.bfloat16) == "ws4"
    with pytest.raises(RuntimeError, match="ws4 but the CUDA dK/dV kernel cannot run: ds_stats diagnostics"):
        cuda_dkdv64_variant(64, torch.bfloat16, stats=True)  # Triton's launch forms them
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "0")
    assert cuda_dkdv64_variant(64, torch.bfloat16) is None
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "ws3xfdt")
    assert cuda_dkdv64_variant(64, torch.bfloat16) == "ws3xfdt"
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "ws3xfdp")  # built at D = 128 only
    with pytest.raises(ValueError, match=r"DELTAMATCH_KERNEL_CUDA_DKDV64='ws3xfdp': expected one of "
                                         r"\('ws3', 'ws4', 'ws3xfd', 'ws3xfdt'\)"):
        cuda_dkdv64_variant(64, torch.bfloat16)
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "ws3")
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_DKDV64=ws3 but the CUDA dK/dV kernel cannot run: "
                                           "head dim 128: built for D = 64 only"):
        cuda_dkdv64_variant(128, torch.bfloat16)
    with pytest.raises(RuntimeError, match="cannot run: dtype torch.float32"):
        cuda_dkdv64_variant(64, torch.float32)


def test_the_d64_dkdv_forms_dq_only_promoted_and_with_dq_in_the_launch(monkeypatch):
    """``DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfd`` or ``ws3xfdt`` (the D = 64 dK/dV with dQ in its launch) forms dQ only
    promoted (its one build) and while dQ in the dK/dV launch is asked for (``DELTAMATCH_KERNEL_DQ_ORDERED`` unset or 1, or
    ``DELTAMATCH_KERNEL_DQ_ATOMIC``); the forward then writes K̂ᶜ in fragment order, and only then. The forms without
    dQ never do."""
    from deltamatch.kernels import cuda_lib, triton_fwd
    from deltamatch.kernels.triton_bwd import (CUDA_DKDV64_SWITCH, CUDA_SWITCH, DQ_ATOMIC_SWITCH, DQ_ORDERED_SWITCH,
                                               dq_in_dkdv64, k_fragment_order)

    for name in (CUDA_SWITCH, DQ_ATOMIC_SWITCH, DQ_ORDERED_SWITCH, triton_fwd.ACC_PROMOTE_SWITCH,
                 "DELTAMATCH_KERNEL_CUDA_DQ64"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cuda_lib, "load", lambda *a: (object(), ""))  # as if it loaded on an sm90 GPU
    assert cuda_lib.DKDV_D64_WITH_DQ == ("ws3xfd", "ws3xfdt")
    monkeypatch.delenv(CUDA_DKDV64_SWITCH, raising=False)
    assert k_fragment_order(64, torch.bfloat16)  # the default forms dQ in its launch
    for form in cuda_lib.DKDV_D64_WITH_DQ:
        assert dq_in_dkdv64(form, True) and not dq_in_dkdv64(form, False)
    assert not any(dq_in_dkdv64(v, True) for v in (*cuda_lib.DKDV_D64_VARIANTS, None))
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "ws3")
    assert not k_fragment_order(64, torch.bfloat16)
    for form in cuda_lib.DKDV_D64_WITH_DQ:
        monkeypatch.setenv(CUDA_DKDV64_SWITCH, form)
        assert k_fragment_order(64, torch.bfloat16), form
    monkeypatch.setenv(CUDA_DKDV64_SWITCH, "ws3xfd")
    monkeypatch.setenv(triton_fwd.ACC_PROMOTE_SWITCH, "0")  # unpromoted: the D = 64 build without dQ, Triton's dQ
    assert not k_fragment_order(64, torch.bfloat16)
    monkeypatch.delenv(triton_fwd.ACC_PROMOTE_SWITCH)
    monkeypatch.setenv(DQ_ORDERED_SWITCH, "0")  # dK/dV, then the dQ launch
    assert not dq_in_dkdv64("ws3xfd", True) and not k_fragment_order(64, torch.bfloat16)
    monkeypatch.setenv(DQ_ATOMIC_SWITCH, "1")  # any order: dQ in the launch again
    assert dq_in_dkdv64("ws3xfd", True) and k_fragment_order(64, torch.bfloat16)


def test_the_d64_cuda_dq_runs_only_when_asked(monkeypatch, tmp_path):
    """``DELTAMATCH_KERNEL_CUDA_DQ64``: the CUDA dQ kernel's D = 64 build (not yet timed) runs only where the switch names
    a form, and then the forward writes K̂ᶜ in fragment order; named where it cannot run (another head dim, no
    library), or a bad value, is an error naming the switch."""
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_bwd import CUDA_DQ64_SWITCH, CUDA_SWITCH, cuda_dq64_variant, k_fragment_order

    monkeypatch.delenv(CUDA_SWITCH, raising=False)
    monkeypatch.delenv(CUDA_DQ64_SWITCH, raising=False)
    monkeypatch.setenv("DELTAMATCH_KERNEL_CUDA_DKDV64", "ws3")  # its default forms dQ in its launch (K̂ᶜ then ordered)
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    monkeypatch.setenv(CUDA_DQ64_SWITCH, "ws3")
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_DQ64=ws3 but the CUDA dQ kernel cannot run: .*missing"):
        cuda_dq64_variant(64, torch.bfloat16)
    monkeypatch.setattr(cuda_lib, "load", lambda *a: (object(), ""))  # as if it loaded on an sm90 GPU
    assert cuda_dq64_variant(64, torch.bfloat16) == "ws3" and k_fragment_order(64, torch.bfloat16)
    with pytest.raises(RuntimeError, match="ws3 but the CUDA dQ kernel cannot run: ds_stats diagnostics"):
        cuda_dq64_variant(64, torch.bfloat16, stats=True)
    with pytest.raises(RuntimeError, match="dtype torch.float32: the CUDA dQ kernel writes bf16 or fp16"):
        cuda_dq64_variant(64, torch.float32)
    with pytest.raises(RuntimeError, match="head dim 128: built for D = 64 only"):
        cuda_dq64_variant(128, torch.bfloat16)
    monkeypatch.setenv(CUDA_DQ64_SWITCH, "ws4")
    with pytest.raises(ValueError, match=r"DELTAMATCH_KERNEL_CUDA_DQ64='ws4': expected one of \('ws3',\)"):
        cuda_dq64_variant(64, torch.bfloat16)
    for value in ("0", ""):
        monkeypatch.setenv(CUDA_DQ64_SWITCH, value)
        assert cuda_dq64_variant(64, torch.bfloat16) is None and not k_fragment_order(64, torch.bfloat16)


def test_the_cuda_dkdv_form_with_dq_is_ws3xfdt_unless_asked(monkeypatch):
    """``$DELTAMATCH_KERNEL_CUDA_DKDV`` picks the form of the CUDA dK/dV launch that also forms dQ: unset, ``ws3xfdt``
    (dŜ's tile by lane exchange, 448 folded, dQ's product in a warpgroup of its own, dK and dV by tensor stores);
    ``ws3`` (byte stores), ``ws3x``, ``ws3xf`` or ``ws3xp`` (persistent) when asked; a form not built with dQ, a bad
    value, or ``ws3xp`` with the adds asked in any order, an error naming the switch."""
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_bwd import CUDA_DKDV_DEFAULT, CUDA_DKDV_SWITCH, cuda_dkdv_variant

    monkeypatch.delenv(CUDA_DKDV_SWITCH, raising=False)
    assert cuda_dkdv_variant() == CUDA_DKDV_DEFAULT == "ws3xfdt" in cuda_lib.DKDV_FOLDED
    monkeypatch.setenv(CUDA_DKDV_SWITCH, "ws3")
    assert cuda_dkdv_variant() == "ws3" in cuda_lib.DKDV_WITH_DQ
    for bad in ("ws4", "fast"):
        monkeypatch.setenv(CUDA_DKDV_SWITCH, bad)
        with pytest.raises(ValueError, match=f"DELTAMATCH_KERNEL_CUDA_DKDV='{bad}': expected one of"):
            cuda_dkdv_variant()
    monkeypatch.setenv(CUDA_DKDV_SWITCH, "ws3xp")  # the persistent form: ordered adds only
    assert cuda_dkdv_variant() == "ws3xp" in cuda_lib.DKDV_ORDERED_ONLY
    with pytest.raises(ValueError, match="DELTAMATCH_KERNEL_CUDA_DKDV='ws3xp' is built with its dQ adds ordered only, "
                                         "and DELTAMATCH_KERNEL_DQ_ATOMIC asks for them in any order"):
        cuda_dkdv_variant(ordered=False)
    monkeypatch.setenv(CUDA_DKDV_SWITCH, "ws3x")
    assert cuda_dkdv_variant(ordered=False) == "ws3x"
    monkeypatch.setenv(CUDA_DKDV_SWITCH, "ws3xf")  # 448 folded into the row terms, either order of the adds
    assert cuda_dkdv_variant() == cuda_dkdv_variant(ordered=False) == "ws3xf" in cuda_lib.DKDV_FOLDED


if __name__ == "__main__":
    child_main(_measure)


def test_a_forward_without_a_backward_skips_the_backwards_copies(monkeypatch):
    """matched_factored under ``torch.no_grad`` (evaluation): the forward quantises V token-major (the backward's dP̂)
    and K per channel (its dQ) only when a backward can follow; every launch here is a stand-in that records it."""
    from deltamatch.kernels import triton_attention as ta

    calls = []

    def operand(x, block, *, name, layouts, **_):
        calls.append(("block", name, layouts))
        return torch.zeros(1, dtype=torch.uint8), None, torch.ones(1)

    def per_channel(x, name, *, layouts, **_):
        calls.append(("channel", name, layouts))
        return None, torch.zeros(1, dtype=torch.uint8), torch.ones(1)

    def forward(q8, k8, v8t, sq, sk, sv, shape, dtype, causal, scale, config=None):
        calls.append(("forward",))
        return torch.zeros(shape, dtype=dtype), torch.zeros(1)

    for name, stand_in in (("quantize_operand", operand), ("quantize_per_channel", per_channel),
                           ("token_mean", lambda k: torch.zeros(1)), ("attention_forward", forward),
                           ("cuda_forward_variant", lambda *a: None), ("cuda_kernels_selected", lambda *a, **kw: False),
                           ("k_fragment_order", lambda *a: False)):
        monkeypatch.setattr(ta, name, stand_in)
    monkeypatch.delenv(ta.ONE_READ_SWITCH, raising=False)
    q, k, v = (torch.randn(1, 64, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        ta.triton_attention(q, k, v, True, "matched_factored")
    alone, calls[:] = list(calls), []
    ta.triton_attention(*(x.requires_grad_() for x in (q, k, v)), True, "matched_factored")
    backward_copies = [("block", "v", "token"), ("channel", "k", "channel")]
    assert all(c in calls for c in backward_copies) and not any(c in alone for c in backward_copies), (calls, alone)
    assert [c for c in calls if c not in backward_copies] == alone  # the forward's own launches, in its order


def test_the_cuda_quantisation_runs_only_where_it_can_and_says_why_not(monkeypatch, tmp_path):
    """``DELTAMATCH_KERNEL_CUDA_QUANT`` unset: matched_factored's K, V and dO through the CUDA passes wherever the
    library loads and takes the tensor (not here: no GPU, so Triton's); ``DELTAMATCH_KERNEL_CUDA`` or the one-read
    switch set keep Triton's; asked for where it cannot run, an error that names the switch and the reason — and
    ``cuda_lib.quantize_block_and_channel`` itself refuses what it is not built for before it needs a GPU."""
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_bwd import CUDA_QUANT_SWITCH, CUDA_SWITCH, cuda_quant_selected
    from deltamatch.kernels.triton_quant import ONE_READ_SWITCH

    for name in (CUDA_SWITCH, CUDA_QUANT_SWITCH, ONE_READ_SWITCH):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    k = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16)
    assert not cuda_quant_selected(k)
    monkeypatch.setattr(cuda_lib, "load", lambda *a: (object(), ""))  # as if it loaded on an sm90 GPU
    assert not cuda_quant_selected(k)  # a CPU tensor
    monkeypatch.setattr(cuda_lib, "quant_reason", lambda x: "")  # as if k were a CUDA tensor
    assert cuda_quant_selected(k)
    assert cuda_quant_selected(k[..., :64])  # the D = 64 build runs unasked too
    for name in (CUDA_SWITCH, ONE_READ_SWITCH):
        monkeypatch.setenv(name, "1")
        assert not cuda_quant_selected(k), name
        monkeypatch.setenv(CUDA_QUANT_SWITCH, "1")
        assert cuda_quant_selected(k), name
        monkeypatch.delenv(CUDA_QUANT_SWITCH)
        monkeypatch.delenv(name)
    monkeypatch.setenv(CUDA_QUANT_SWITCH, "0")
    assert not cuda_quant_selected(k)
    monkeypatch.setenv(CUDA_QUANT_SWITCH, "2")
    with pytest.raises(ValueError, match="DELTAMATCH_KERNEL_CUDA_QUANT='2'"):
        cuda_quant_selected(k)
    monkeypatch.undo()
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    monkeypatch.setenv(CUDA_QUANT_SWITCH, "1")
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_QUANT=1 but the CUDA quantisation cannot run: "
                                           ".*missing"):
        cuda_quant_selected(k)
    # the wrapper's checks, each naming the problem
    assert cuda_lib.quant_reason(k) == "x is on cpu, expected a CUDA tensor"
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)))  # CUDA-like tensors
    assert cuda_lib.quant_reason(k) == ""
    assert cuda_lib.quant_reason(k[..., :64]) == ""  # D = 64 is built too
    for x, why in ((k[0], "x has 3 dims"), (k.float(), "torch.float32"), (k[..., :32], "head dim 32"),
                   (k[:, :0], "no tokens")):
        assert why in cuda_lib.quant_reason(x), (why, cuda_lib.quant_reason(x))
    odd = torch.empty(1, 64, 2, 132, dtype=torch.bfloat16)[..., 2:130]  # rows 4 bytes off a 16-byte boundary
    with pytest.raises(ValueError, match="rows are not 16-byte aligned"):
        cuda_lib.quantize_block_and_channel(odd, 64)
    packed = torch.randn(1, 64, 6, 128, dtype=torch.bfloat16)[:, :, :2]  # a view the passes take
    with pytest.raises(ValueError, match="block_rows 32"):
        cuda_lib.quantize_block_and_channel(packed, 32)
    with pytest.raises(ValueError, match="stats_rows 100"):
        cuda_lib.quantize_block_and_channel(packed, 64, stats_rows=100)
    with pytest.raises(ValueError, match="block_rows 64: the token-major pass alone is built for 128-row blocks"):
        cuda_lib.quantize_block(packed, 64)
    with pytest.raises(ValueError, match="x has 3 dims"):
        cuda_lib.quantize_block(packed[0])


def test_the_cuda_quantisation_of_q_prime_says_why_not(monkeypatch, tmp_path):
    """``DELTAMATCH_KERNEL_CUDA_QPRIME`` unset: Q'ᶜ by the CUDA passes (``CUDA_QPRIME_DEFAULT``) where they can run,
    Triton's where the library does not load; ``1`` selects the CUDA passes where they can run and is an error naming
    the switch and the reason where they cannot; ``cuda_lib.quantize_channel_scaled`` refuses row scales of the wrong
    dtype, shape or device, and statistics blocks that are no multiple of 128 rows, before it needs a GPU."""
    from deltamatch.kernels import cuda_lib
    from deltamatch.kernels.triton_bwd import CUDA_QPRIME_DEFAULT, CUDA_QPRIME_SWITCH, cuda_qprime_selected

    monkeypatch.delenv(CUDA_QPRIME_SWITCH, raising=False)
    monkeypatch.setenv(cuda_lib.LIBRARY_ENV, str(tmp_path / "missing.so"))
    q = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16)
    assert not cuda_qprime_selected(q)
    monkeypatch.setenv(CUDA_QPRIME_SWITCH, "1")
    with pytest.raises(RuntimeError, match="DELTAMATCH_KERNEL_CUDA_QPRIME=1 but the CUDA quantisation of Q'ᶜ cannot "
                                           "run: .*missing"):
        cuda_qprime_selected(q)
    monkeypatch.setattr(cuda_lib, "load", lambda *a: (object(), ""))  # as if it loaded on an sm90 GPU
    with pytest.raises(RuntimeError, match="x is on cpu, expected a CUDA tensor"):
        cuda_qprime_selected(q)
    monkeypatch.setattr(cuda_lib, "quant_reason", lambda x: "")  # as if q were a CUDA tensor
    assert cuda_qprime_selected(q)
    monkeypatch.delenv(CUDA_QPRIME_SWITCH)
    assert cuda_qprime_selected(q) is CUDA_QPRIME_DEFAULT is True
    assert cuda_qprime_selected(q[..., :64])  # the D = 64 build runs unasked too
    monkeypatch.setenv(CUDA_QPRIME_SWITCH, "0")
    assert not cuda_qprime_selected(q)
    monkeypatch.setenv(CUDA_QPRIME_SWITCH, "yes")
    with pytest.raises(ValueError, match="DELTAMATCH_KERNEL_CUDA_QPRIME='yes'"):
        cuda_qprime_selected(q)
    monkeypatch.undo()
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)))  # CUDA-like tensors
    rs = torch.ones(1, 2, 128)
    for scales, why in ((rs.double(), "torch.float64"), (rs[:, :, :64], r"\(1, 2, 64\)"), (rs[0], r"\(2, 128\)")):
        with pytest.raises(ValueError, match=f"row_scales is .*{why}.*expected torch.float32 \\(1, 2, 128\\)"):
            cuda_lib.quantize_channel_scaled(q, scales)
    with pytest.raises(ValueError, match="stats_rows 100"):
        cuda_lib.quantize_channel_scaled(q, rs, stats_rows=100)
    with pytest.raises(ValueError, match="head dim 32"):  # D = 128 and 64 are built
        cuda_lib.quantize_channel_scaled(q[..., :32], rs)
