"""The cuDNN FP8 baseline: a clear "unavailable" off Hopper or without the frontend; on an H200, its numerics."""

import pytest
import torch

from deltamatch.kernels.cudnn_fp8 import CudnnFP8Backend, cudnn_fp8_attention
from deltamatch.kernels.measures import relative_error
from deltamatch.kernels.reference import attention_exact, attention_reference


def test_backend_declines_cpu_tensors_and_other_modes():
    q = torch.randn(1, 8, 2, 128)
    backend = CudnnFP8Backend()
    assert "CUDA" in backend.supports(q, q, q, True, "cudnn_fp8")
    assert "cudnn_fp8" in backend.supports(q, q, q, True, "matched")


@pytest.mark.parametrize("d", [64, 256])
def test_backend_declines_head_dims_other_than_128(d):
    q = torch.randn(1, 8, 2, d)
    assert f"head dim {d}" in CudnnFP8Backend().supports(q, q, q, True, "cudnn_fp8")
    with pytest.raises(ValueError, match=f"head dim {d}"):
        cudnn_fp8_attention(q, q, q)


def test_gqa_shapes_are_accepted_and_uneven_groups_refused():
    q, kv = torch.randn(1, 8, 4, 128), torch.randn(1, 8, 2, 128)
    assert "GQA" not in (CudnnFP8Backend().supports(q, kv, kv, True, "cudnn_fp8") or "")  # K/V heads get expanded
    with pytest.raises(ValueError):
        cudnn_fp8_attention(q, torch.randn(1, 8, 3, 128), torch.randn(1, 8, 3, 128))


@pytest.mark.parametrize("mutate, message", [
    (lambda q, k, v: (q, k, v[0]), "v must have rank 4"),
    (lambda q, k, v: (q, k.half(), v), "dtypes differ"),
    (lambda q, k, v: (q, k[:, :-1], v[:, :-1]), "must agree"),
])
def test_direct_entry_point_validates_its_inputs(mutate, message):
    q, k, v = (torch.randn(1, 8, 2, 128) for _ in range(3))
    with pytest.raises(ValueError, match=message):
        cudnn_fp8_attention(*mutate(q, k, v))
    with pytest.raises(ValueError, match="softmax_scale"):
        cudnn_fp8_attention(q, k, v, softmax_scale=0.0)


def test_unavailable_frontend_is_reported_by_name(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_cudnn(name, *args, **kwargs):
        if name == "cudnn":
            raise ImportError("No module named 'cudnn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cudnn)
    reason = CudnnFP8Backend().unavailable_reason()
    assert reason is not None and "unavailable" in reason and "nvidia-cudnn-frontend" in reason
    with pytest.raises(ImportError, match="unavailable"):
        cudnn_fp8_attention(torch.randn(1, 8, 2, 128), torch.randn(1, 8, 2, 128), torch.randn(1, 8, 2, 128))


@pytest.mark.gpu
@pytest.mark.parametrize("causal,kv_heads", [(True, 4), (False, 4), (True, 1)])  # H_kv = 1: GQA, one KV head for 4
def test_cudnn_fp8_against_its_simulation_and_fp64(causal, kv_heads):
    pytest.importorskip("cudnn")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(2, 512, 4, 128, device="cuda", generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(2, 512, kv_heads, 128, device="cuda", generator=gen).bfloat16() for _ in range(2))
    results = {}
    for name, fn, dtype in (("cudnn", lambda a, b, c: cudnn_fp8_attention(a, b, c, causal), torch.bfloat16),
                            ("sim", lambda a, b, c: attention_reference(a, b, c, causal, "cudnn_fp8_sim"),
                             torch.bfloat16),
                            ("exact", lambda a, b, c: attention_exact(a, b, c, causal), torch.float64)):
        for _ in range(2 if name == "cudnn" else 1):  # the second call uses the delayed dS scale
            ins = [t.detach().clone().to(dtype).requires_grad_() for t in (q, k, v)]
            o = fn(*ins)
            o.backward(do.to(o.dtype))
        results[name] = [o.detach(), *(t.grad for t in ins)]
    for part, ours, sim, exact in zip(("o", "dq", "dk", "dv"), results["cudnn"], results["sim"], results["exact"]):
        assert torch.isfinite(ours).all(), part
        ours_err, sim_err = relative_error(ours, exact), relative_error(sim, exact)
        assert ours_err < 2.0 * sim_err + 0.02, (part, ours_err, sim_err)
