"""fla's fused kernels that the model uses on CUDA against their plain-PyTorch twins (layers/fused.py)."""

import pytest
import torch
import torch.nn.functional as F

from deltamatch.models.layers.fused import linear_cross_entropy, use_fused
from deltamatch.models.layers.mlp import SwiGLU
from deltamatch.models.layers.norm import GatedRMSNorm, RMSNorm
from numerics import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]


def _both(module, *inputs):
    """Output and input/parameter gradients with the fused path and with the twin, on the same CUDA inputs."""
    results = []
    for fused in (True, False):
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        module.zero_grad(set_to_none=True)
        with use_fused(fused), torch.autocast("cuda", dtype=torch.bfloat16):
            y = module(*xs)
        y.float().pow(2).sum().backward()
        results.append((y, [x.grad for x in xs] + [p.grad for p in module.parameters()]))
    return results


@pytest.mark.parametrize("module,shapes", [
    (lambda: RMSNorm(1536), [(2, 257, 1536)]),
    (lambda: GatedRMSNorm(256, activation="swish"), [(2, 257, 9, 256), (2, 257, 9, 256)]),
    (lambda: GatedRMSNorm(256, activation="sigmoid"), [(2, 257, 9, 256), (2, 257, 9, 256)]),
    (lambda: SwiGLU(512, 1376), [(2, 257, 512)]),
])
def test_fused_layers_match_their_twins(module, shapes):
    torch.manual_seed(0)
    layer = module().cuda()
    for p in layer.parameters():
        if p.dim() == 1:
            torch.nn.init.uniform_(p, 0.5, 1.5)
    inputs = [torch.randn(s, device="cuda") for s in shapes]
    (y_fused, g_fused), (y_twin, g_twin) = _both(layer, *inputs)
    assert y_fused.dtype == y_twin.dtype and relative_error(y_fused, y_twin) < 1e-2
    for a, b in zip(g_fused, g_twin):
        assert relative_error(a, b) < 2e-2


def test_linear_cross_entropy_matches_logits_then_cross_entropy():
    torch.manual_seed(0)
    hidden = torch.randn(2, 1023, 512, device="cuda", requires_grad=True)
    weight = (torch.randn(32000, 512, device="cuda") * 0.02).requires_grad_()
    labels = torch.randint(0, 32000, (2, 1023), device="cuda")
    labels[0, :5] = -100
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fused = linear_cross_entropy(hidden, weight, labels)
        plain = F.cross_entropy((hidden @ weight.T).float().reshape(-1, 32000), labels.reshape(-1))
    g_fused = torch.autograd.grad(fused, (hidden, weight))
    g_plain = torch.autograd.grad(plain, (hidden, weight))
    assert abs(float(fused) - float(plain)) < 1e-2 * float(plain)
    for a, b in zip(g_fused, g_plain):
        assert relative_error(a, b) < 2e-2
