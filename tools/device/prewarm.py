"""Compile the Triton kernels for one (head dim, causal) into Triton's on-disk cache, so a benchmark process that
follows finds them built. ``python3 tools/device/prewarm.py D CAUSAL`` (several run in parallel in kernel_gpu.sh).

N = 256 specialises the integer arguments like every benchmark length (all multiples of 16)."""

import sys

import torch

from deltamatch.kernels.triton_attention import MODES, triton_attention

d, causal = int(sys.argv[1]), sys.argv[2] == "1"
h = 2048 // d
for mode in MODES:  # every FP8 mode the bench times (matched_factored launches kernels of its own)
    q, k, v, do = (torch.randn(1, 256, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    torch.autograd.grad(triton_attention(q, k, v, causal, mode), (q, k, v), do)
torch.cuda.synchronize()
