"""The per-channel quantisation pass (``quantize_per_channel``) in Triton's CPU interpreter, bit for bit against its
PyTorch twin ``quantize_per_channel_torch`` and against ``quant.quantize_tiles(inner, None, 1)``.

The cases run in a child process under the interpreter (triton_child.py), which poisons ``torch.empty`` with NaN, so
a code, transposed code or scale the kernels leave unwritten differs from the twin's.
"""

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


def _measure() -> dict:
    from deltamatch.kernels import quant
    from deltamatch.kernels.triton_quant import quantize_per_channel, quantize_per_channel_torch


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


def test_bad_inputs_are_refused_by_name_before_any_launch():
    from deltamatch.kernels.triton_quant import padded_len, quantize_per_channel

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


if __name__ == "__main__":
    child_main(_measure)
