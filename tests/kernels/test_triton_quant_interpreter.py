"""The quantisation passes in Triton's CPU interpreter: the per-channel pass (``quantize_per_channel``) bit for bit
against its PyTorch twin ``quantize_per_channel_torch`` and against ``quant.quantize_tiles(inner, None, 1)``, and every
code-store mode (``triton_quant.STORE_MODES``) of every pass bit for bit against the pointer stores.

The cases run in a child process under the interpreter (triton_child.py), which poisons ``torch.empty`` with NaN, so
a code, transposed code or scale the kernels leave unwritten differs from the twin's (or the pointer stores').
"""

import os

import pytest
import torch

from triton_child import child_main, patch_interpreter_index, run_child

CASES = [  # (name, dtype, b, n, h, d, mean, row_scales)
    ("plain bf16", "bfloat16", 2, 130, 3, 64, False, False),
    ("k centred", "bfloat16", 1, 70, 2, 128, True, False),
    ("q row-scaled", "bfloat16", 2, 130, 2, 64, False, True),
    ("centred and row-scaled", "float16", 1, 200, 2, 128, True, True),
    ("fp32 strided heads", "float32", 1, 64, 2, 64, False, False),
]


def _case_input(dtype, b, n, h, d, mean, row_scales, gen):
    """x with an outlier channel and an all-zero one; mean and row scales as the factored layout's K̂ᶜ and Q̂' use
    them (the row scales NaN past N, where the kernel must not read them)."""
    from deltamatch.kernels.triton_quant import padded_len

    x = torch.randn(b, n, h + 1, d, generator=gen) * 2 + 0.5  # one head more: x is a strided view
    x[..., 5] *= 60  # an outlier channel gets its own scale
    x[..., 9] = 0  # an all-zero channel: scale 1, zero codes
    x = x.to(getattr(torch, dtype))[:, :, :h]
    kwargs = {}
    if mean:
        kwargs["mean"] = x.mean(dim=1, dtype=torch.float32)
    if row_scales:
        rows = torch.rand(b, h, padded_len(n), generator=gen) + 0.5
        rows[:, :, n:] = float("nan")
        kwargs["row_scales"] = rows
    return x, kwargs


def _bits(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.view(torch.int32)


def _store_mode_passes(gen) -> dict:
    """Each pass that stores codes, as a closure of its store mode: ragged N, strided heads, 64- and 128-row blocks,
    K's centring, the δ that reads the codes back (consistent), the per-channel scales."""
    from deltamatch.kernels.triton_quant import quantize_do_and_delta, quantize_operand, quantize_per_channel

    x, _ = _case_input("bfloat16", 1, 130, 2, 64, False, False, gen)
    k, _ = _case_input("bfloat16", 1, 70, 2, 128, False, False, gen)
    o = torch.randn(x.shape, generator=gen).to(torch.bfloat16)
    return {"q": lambda mode, lay="both": quantize_operand(x, 128, store_mode=mode, layouts=lay),
            "k centred": lambda mode, lay="both": quantize_operand(k, 64, centre=True, store_mode=mode, layouts=lay),
            "dO, consistent delta": lambda mode, lay="both": quantize_do_and_delta(x, o, "consistent", store_mode=mode,
                                                                                   layouts=lay),
            "per channel": lambda mode, lay="both": quantize_per_channel(x, "q", store_mode=mode, layouts=lay)}


def _measure() -> dict:
    from deltamatch.kernels import quant
    from deltamatch.kernels.triton_quant import (STORE_MODES, STORE_UNUSED_SWITCH, quantize_per_channel,
                                                 quantize_per_channel_torch)

    patch_interpreter_index()
    gen = torch.Generator().manual_seed(0)
    out = {"poisoned": bool(torch.isnan(torch.empty(4)).all()), "cases": {}}
    for name, dtype, b, n, h, d, mean, row_scales in CASES:
        x, kwargs = _case_input(dtype, b, n, h, d, mean, row_scales, gen)
        x8, x8t, scales = quantize_per_channel(x, "x", **kwargs)
        twin = quantize_per_channel_torch(x, "x", **kwargs)
        inner = x.float().transpose(1, 2)
        if mean:
            inner = inner - kwargs["mean"][:, :, None]
        if row_scales:
            inner = inner * kwargs["row_scales"][:, :, :n, None]
        expected, expected_scales = quant.quantize_tiles(inner, None, 1)
        out["cases"][name] = dict(
            shapes=[list(x8.shape), list(x8t.shape), list(scales.shape)],
            equal_to_twin=[bool(torch.equal(_bits(a), _bits(t))) for a, t in zip((x8, x8t, scales), twin)],
            equal_to_quantize_tiles=bool(torch.equal(scales, expected_scales[..., 0, :])
                                         and torch.equal(x8[:, :, :n].float() * scales[:, :, None], expected)),
            padding_zero=bool((_bits(x8[:, :, n:]) == 0).all() and (_bits(x8t[..., n:]) == 0).all()),
            zero_channel_scale=scales[..., 9].unique().tolist(),
            outlier_scale_ratio=(scales[..., 5] / scales[..., 4]).min().item(),
        )
    out["store_modes"], out["layouts"] = {}, {}
    for name, run in _store_mode_passes(gen).items():
        pointers = run(STORE_MODES["pointers"])
        out["store_modes"][name] = {
            mode_name: [bool(torch.equal(_bits(a), _bits(b))) for a, b in zip(run(mode), pointers)]
            for mode_name, mode in STORE_MODES.items() if mode_name != "pointers"}
        # one layout: its codes the bits of both's, the other None; under the switch both again
        out["layouts"][name] = {}
        for lay in ("token", "channel"):
            one = run(STORE_MODES["pointers"], lay)
            out["layouts"][name][lay] = ["none" if a is None else bool(torch.equal(_bits(a), _bits(b)))
                                         for a, b in zip(one, pointers)]
        os.environ[STORE_UNUSED_SWITCH] = "1"
        out["layouts"][name]["switch"] = [a is not None and bool(torch.equal(_bits(a), _bits(b)))
                                          for a, b in zip(run(STORE_MODES["pointers"], "token"), pointers)]
        del os.environ[STORE_UNUSED_SWITCH]
    out["block_and_channel"] = _block_and_channel(gen)
    out["fragment_order"] = _fragment_order(gen)
    return out


def _fragment_order(gen) -> dict:
    """The per-channel pass's channel-major codes in the CUDA dK/dV kernel's fragment order, per case, against the same
    pass's natural order permuted by PyTorch indexing, and against the twin's; the natural scales unchanged."""
    from deltamatch.kernels.triton_quant import (STORE_UNUSED_SWITCH, fragment_token_order, quantize_per_channel,
                                                 quantize_per_channel_torch)

    out = {}
    for name, dtype, b, n, h, d, mean, row_scales in CASES:
        x, kwargs = _case_input(dtype, b, n, h, d, mean, row_scales, gen)
        _, natural, scales = quantize_per_channel(x, "x", layouts="channel", **kwargs)
        _, ours, ours_scales = quantize_per_channel(x, "x", layouts="channel", fragment_order=True, **kwargs)
        _, twin, _ = quantize_per_channel_torch(x, "x", fragment_order=True, **kwargs)
        os.environ[STORE_UNUSED_SWITCH] = "1"  # it adds no token-major copy to a fragment-ordered pass
        switched = quantize_per_channel(x, "x", layouts="channel", fragment_order=True, **kwargs)
        del os.environ[STORE_UNUSED_SWITCH]
        order = fragment_token_order(natural.shape[-1])
        out[name] = dict(permuted_natural=bool(torch.equal(_bits(ours), _bits(natural[..., order]))),
                         twin=bool(torch.equal(_bits(ours), _bits(twin))),
                         scales=bool(torch.equal(_bits(ours_scales), _bits(scales))),
                         moved=not torch.equal(_bits(ours), _bits(natural)),
                         switch=switched[0] is None and bool(torch.equal(_bits(switched[1]), _bits(ours))))
    return out


BLOCK_AND_CHANNEL_CASES = [  # (name, dtype, b, n, h, d, block rows, centred, fragment order)
    ("k centred, fragment order", "bfloat16", 1, 70, 2, 128, 64, True, True),
    ("k centred, natural order", "bfloat16", 2, 200, 2, 64, 64, True, False),
    ("v", "float16", 2, 130, 2, 64, 64, False, False),
    ("dO, fragment order", "bfloat16", 1, 130, 3, 64, 128, False, True),
]


def _block_and_channel(gen) -> dict:
    """``centring_stats`` against PyTorch's mean and amax, and ``quantize_block_and_channel`` against the two passes it
    replaces (``quantize_operand(layouts="token")``, ``quantize_per_channel(layouts="channel")``) given that mean."""
    from deltamatch.kernels.triton_quant import (centring_stats, quantize_block_and_channel, quantize_operand,
                                                 quantize_per_channel)

    out = {}
    for name, dtype, b, n, h, d, rows, centred, fragment in BLOCK_AND_CHANNEL_CASES:
        x, _ = _case_input(dtype, b, n, h, d, False, False, gen)
        mean = amax = None
        m = {}
        if centred:
            mean, amax = centring_stats(x, "k")
            torch_mean = x.mean(dim=1, dtype=torch.float32)
            inner = x.float().transpose(1, 2) - mean[:, :, None]  # the centring of the passes, with this mean
            m["mean_close"] = bool(torch.allclose(mean, torch_mean, rtol=1e-5, atol=1e-6))
            m["mean_err"] = (mean - torch_mean).abs().max().item()
            m["amax_exact"] = bool(torch.equal(_bits(amax), _bits(inner.abs().amax(dim=2))))
        both = quantize_block_and_channel(x, rows, "x", mean=mean, amax=amax, fragment_order=fragment)
        if centred:  # the same codes with the amax launch of quantize_per_channel's instead of centring_stats'
            m["own_amax"] = [bool(torch.equal(_bits(a), _bits(c)))
                             for a, c in zip(both, quantize_block_and_channel(x, rows, "x", mean=mean,
                                                                              fragment_order=fragment))]
        x8, _, sx = quantize_operand(x, rows, centre=centred, mean=mean, layouts="token")
        _, x8t, sxc = quantize_per_channel(x, "x", mean=mean, layouts="channel", fragment_order=fragment)
        m["equal"] = [bool(torch.equal(_bits(a), _bits(c))) for a, c in zip(both, (x8, sx, x8t, sxc))]
        out[name] = m
    return out


@pytest.fixture(scope="module")
def measured():
    return run_child(__file__, timeout=300)


def test_the_child_poisons_unwritten_memory(measured):
    assert measured["poisoned"]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_per_channel_pass_equals_its_torch_twin_bit_for_bit(measured, case):
    name, _, b, n, h, d, _, _ = case
    m = measured["cases"][name]
    assert m["shapes"] == [[b, h, 256 if n > 128 else 128, d], [b, h, d, 256 if n > 128 else 128], [b, h, d]], m
    assert m["equal_to_twin"] == [True, True, True], m
    assert m["equal_to_quantize_tiles"] and m["padding_zero"], m
    assert m["zero_channel_scale"] == [1.0], m
    assert m["outlier_scale_ratio"] > 10, m  # the outlier channel has a scale of its own


def test_every_store_mode_stores_the_bits_of_the_pointer_stores(measured):
    """In the interpreter every mode is right, the two the H200 found wrong too: the interpreter runs the program's
    semantics, not Triton's layout conversions, so only the GPU test can admit a mode to VERIFIED_STORE_MODES."""
    from deltamatch.kernels.triton_quant import STORE_MODE, STORE_MODES, VERIFIED_STORE_MODES

    assert STORE_MODE in {STORE_MODES[m] for m in VERIFIED_STORE_MODES}

    assert set(measured["store_modes"]) == {"q", "k centred", "dO, consistent delta", "per channel"}
    for name, modes in measured["store_modes"].items():
        assert set(modes) == set(STORE_MODES) - {"pointers"}, name
        for mode, equal in modes.items():
            assert len(equal) == (4 if name.startswith("dO") else 3) and all(equal), (name, mode, equal)


def test_a_pass_asked_for_one_layout_stores_its_bits_and_leaves_the_other_out(measured):
    """``layouts="token"`` / ``"channel"`` (matched_factored's passes): the codes of that layout are the bits both
    layouts' launch stores, the other is None; scales and δ unchanged; ``DELTAMATCH_KERNEL_STORE_UNUSED=1`` stores
    both again."""
    assert set(measured["layouts"]) == {"q", "k centred", "dO, consistent delta", "per channel"}
    for name, lays in measured["layouts"].items():
        rest = [True] * (2 if name.startswith("dO") else 1)  # scales (and δ)
        assert lays["token"] == [True, "none", *rest], (name, lays)
        assert lays["channel"] == ["none", True, *rest], (name, lays)
        assert lays["switch"] == [True, True, *rest], (name, lays)


@pytest.mark.parametrize("case", BLOCK_AND_CHANNEL_CASES, ids=[c[0] for c in BLOCK_AND_CHANNEL_CASES])
def test_one_read_gives_both_factored_copies_bit_for_bit(measured, case):
    """K's mean and centred amax from one read (the amax exactly max |fl(x − mean)|, the mean within FP32 summation
    order of PyTorch's), and the block-scaled token-major and per-channel channel-major codes and scales of one pass
    the bits of the two passes they replace, in both token orders, ragged N, 64- and 128-row blocks."""
    m = measured["block_and_channel"][case[0]]
    assert m["equal"] == [True] * 4, m
    if case[7]:
        assert m["mean_close"] and m["amax_exact"], m
        assert m["own_amax"] == [True] * 4, m


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fragment_order_permutes_the_channel_major_codes_and_nothing_else(measured, case):
    assert measured["fragment_order"][case[0]] == dict(permuted_natural=True, twin=True, scales=True, moved=True,
                                                       switch=True)


def test_fragment_token_order_is_the_accumulator_lanes_bytes_at_the_a_fragments_positions():
    """Lane q of an FP8 wgmma accumulator row holds columns {2q, 2q+1, 8+2q, 9+2q} of each 16-column half; an A
    fragment's lane q holds k = 4q .. 4q+3: position 4q + j of a group must hold the j-th of lane q's columns."""
    from deltamatch.kernels.triton_quant import fragment_token_order

    lanes = [[2 * q, 2 * q + 1, 8 + 2 * q, 9 + 2 * q] for q in range(4)]
    expected = [16 * g + c for g in range(3) for lane in lanes for c in lane]
    assert fragment_token_order(48).tolist() == expected
    assert sorted(fragment_token_order(256).tolist()) == list(range(256))
    with pytest.raises(ValueError, match="n_pad = 40: expected a multiple of 16"):
        fragment_token_order(40)


def test_bad_inputs_are_refused_by_name_before_any_launch():
    from deltamatch.kernels.triton_quant import (centring_stats, padded_len, quantize_block_and_channel,
                                                 quantize_operand, quantize_per_channel)

    x = torch.randn(1, 130, 2, 64, dtype=torch.bfloat16)
    mean = torch.zeros(1, 2, 64)
    rows = torch.ones(1, 2, padded_len(130))
    with pytest.raises(ValueError, match=r"^v must be \(B, N, H, D\)"):
        quantize_per_channel(x[0], "v")
    with pytest.raises(ValueError, match=r"^v must be .* contiguous last dim"):
        quantize_per_channel(x.transpose(-1, -2), "v")
    with pytest.raises(ValueError, match=r"^mean must be FP32 \(B, H, D\)"):
        quantize_per_channel(x, "k", mean=mean.double())
    with pytest.raises(ValueError, match=r"^mean must be FP32 \(B, H, D\)"):
        quantize_per_channel(x, "k", mean=mean[:, :1])
    with pytest.raises(ValueError, match=r"^row_scales must be FP32 \(B, H, N_pad\)"):
        quantize_per_channel(x, "q", row_scales=rows[:, :, :130])
    with pytest.raises(ValueError, match=r"^row_scales must be FP32 \(B, H, N_pad\)"):
        quantize_per_channel(x, "q", row_scales=rows.bfloat16())
    with pytest.raises(ValueError, match=r"^layouts 'rows': expected one of \('token', 'channel', 'both'\)"):
        quantize_per_channel(x, "q", layouts="rows")
    with pytest.raises(ValueError, match=r"^amax must be a contiguous FP32 \(B, H, D\)"):
        quantize_per_channel(x, "v", amax=mean[:, :1])
    with pytest.raises(ValueError, match=r"^amax: nothing forms the row-scaled values' amax"):
        quantize_per_channel(x, "q", row_scales=rows, amax=mean)
    with pytest.raises(ValueError, match=r"^fragment_order: a channel-major layout, so layouts='channel'"):
        quantize_per_channel(x, "v", fragment_order=True)
    with pytest.raises(ValueError, match=r"^block_rows 32: expected 64 \(K, V\) or 128 \(Q, dO\)"):
        quantize_block_and_channel(x, 32, "v")
    with pytest.raises(ValueError, match=r"^amax must be a contiguous FP32 \(B, H, D\)"):
        quantize_block_and_channel(x, 64, "v", amax=mean[:, :1])
    with pytest.raises(ValueError, match=r"^k must be \(B, N, H, D\)"):
        centring_stats(x[0])


if __name__ == "__main__":
    child_main(_measure)
