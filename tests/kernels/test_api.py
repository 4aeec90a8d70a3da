"""dm_attn_func: dispatch through the backend registry, and its errors."""

import warnings

import pytest
import torch

from deltamatch.kernels import dm_attn_func, register_backend, use_backend
from deltamatch.kernels.backends import registered_backends, select_backend
from deltamatch.kernels.reference import attention_reference


def inputs(n=40, dtype=torch.float32, d=32):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, n, 4, d, generator=gen, dtype=dtype)
    k = torch.randn(2, n, 2, d, generator=gen, dtype=dtype)
    v = torch.randn(2, n, 2, d, generator=gen, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("mode", ["bf16", "stale", "consistent", "matched"])
def test_cpu_dispatches_to_the_reference(mode):
    q, k, v = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the reference is the CPU's backend, not a fallback: no warning
        assert select_backend(q, k, v, True, mode).name == "reference"
    torch.testing.assert_close(dm_attn_func(q, k, v, True, mode), attention_reference(q, k, v, True, mode), rtol=0, atol=0)


def test_cudnn_fp8_off_gpu_is_its_simulation():
    q, k, v = inputs()
    expect = attention_reference(q, k, v, False, "cudnn_fp8_sim")
    torch.testing.assert_close(dm_attn_func(q, k, v, causal=False, mode="cudnn_fp8"), expect, rtol=0, atol=0)


def test_gradients_flow_through_dm_attn_func():
    q, k, v = (t.requires_grad_() for t in inputs(dtype=torch.bfloat16))
    dm_attn_func(q, k, v).float().pow(2).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad.float()).all() and t.grad.abs().sum() > 0 for t in (q, k, v))


def test_pinned_backend_and_registration():
    calls = []

    class Recording:
        name = "recording"

        def supports(self, q, k, v, causal, mode):
            return None if mode == "matched" else f"mode {mode} not offered"

        def apply(self, q, k, v, causal, mode, softmax_scale):
            calls.append(mode)
            return attention_reference(q, k, v, causal, mode, softmax_scale)

    register_backend("recording", Recording)
    try:
        q, k, v = inputs()
        dm_attn_func(q, k, v, mode="matched")
        assert calls == []  # registered last: the reference answered first
        with use_backend("recording"):
            dm_attn_func(q, k, v, mode="matched")
            with pytest.raises(ValueError, match="mode stale not offered"):
                dm_attn_func(q, k, v, mode="stale")
        assert calls == ["matched"]
    finally:
        from deltamatch.kernels import backends

        backends._FACTORIES.pop("recording"), backends._INSTANCES.pop("recording", None)
    assert "recording" not in registered_backends()


def test_errors_name_the_problem():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="unknown attention mode 'fast'"):
        dm_attn_func(q, k, v, mode="fast")
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        with use_backend("nope"):
            pass
    for bad in (-1.0, 0, True, float("inf"), float("nan"), "0.1"):
        with pytest.raises(ValueError, match="softmax_scale"):
            dm_attn_func(q, k, v, softmax_scale=bad)
    torch.testing.assert_close(dm_attn_func(q, k, v, mode="matched", softmax_scale=1),
                               attention_reference(q, k, v, True, "matched", 1.0), rtol=0, atol=0)


class _SaysCuda(torch.Tensor):
    """A CPU tensor that reports ``is_cuda``: enough for the backends' ``supports`` to judge it as a GPU input."""

    @property
    def is_cuda(self):
        return True


def test_cuda_inputs_the_triton_kernels_decline_warn_once_about_the_reference(monkeypatch):
    from deltamatch.kernels import backends

    monkeypatch.setattr(backends, "_WARNED", set())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    q, k, v = (t.as_subclass(_SaysCuda) for t in inputs(d=96))  # no Triton kernel has D = 96
    with pytest.warns(UserWarning, match=r"triton: head dim 96 is not one of .*using the reference simulation"):
        assert select_backend(q, k, v, True, "matched").name == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select_backend(q, k, v, True, "matched").name == "reference"  # once per reason
        with use_backend("reference"):
            select_backend(q, k, v, True, "matched")  # asked for by name: no warning
    q, k, v = (t.as_subclass(_SaysCuda) for t in inputs(d=128))  # FP32: the kernels take bf16 / fp16
    with pytest.warns(UserWarning, match=r"triton: dtype torch.float32 is not one of"):
        select_backend(q, k, v, True, "stale")


def test_triton_entry_point_validates_and_names_its_operands():
    from deltamatch.kernels.triton_attention import triton_attention
    from deltamatch.kernels.triton_quant import quantize_operand

    q, k, v = inputs(dtype=torch.bfloat16, d=64)
    with pytest.raises(ValueError, match="q must have rank 4"):
        triton_attention(q[0], k, v)
    with pytest.raises(ValueError, match="k and v shapes differ"):
        triton_attention(q, k, v[:, :-1])
    with pytest.raises(ValueError, match="softmax_scale"):
        triton_attention(q, k, v, softmax_scale=float("inf"))
    with pytest.raises(ValueError, match="head dims .* not 32"):
        triton_attention(*inputs(dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="^k must be"):
        quantize_operand(k[0], 64, centre=True, name="k")
