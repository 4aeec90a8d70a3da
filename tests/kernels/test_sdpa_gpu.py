"""GPU: the bf16 method on CUDA runs SDPA and matches the reference's BF16 numerics and FP64 exact attention."""

import pytest
import torch

from deltamatch.kernels import dm_attn_func
from deltamatch.kernels.backends import select_backend
from deltamatch.kernels.measures import relative_error
from deltamatch.kernels.reference import attention_exact, attention_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("causal", [True, False])
def test_bf16_on_cuda_is_sdpa_and_accurate(causal):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 333, 8, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 333, 2, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    assert select_backend(q, k, v, causal, "bf16").name == "sdpa"
    grads = []
    for fn in (lambda *a: dm_attn_func(*a, causal=causal, mode="bf16"),
               lambda *a: attention_reference(*a, causal, "bf16")):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = fn(*leaves)
        o.backward(do)
        grads.append([o, *(t.grad for t in leaves)])
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o64 = attention_exact(*leaves, causal)
    o64.backward(do.double())
    for ours, sim, exact in zip(grads[0], grads[1], [o64, *(t.grad for t in leaves)]):
        assert relative_error(ours, exact) < 2e-2
        assert relative_error(ours, sim) < 2e-2
