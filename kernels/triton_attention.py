"""The Triton FP8 attention as one autograd function, and its backend for ``dm_attn_func``.

Forward: quantisation pass (Q̂ per 128 rows, K̂ centred and V̂ per 64 keys; token-major copies for the backward's B
operands) → forward kernel (``triton_fwd``). Backward: dÔ quantisation (+ stale/consistent δ) → matched δ (matched
only) → dK/dV → dQ (``triton_bwd``). ``stale``, ``consistent`` and ``matched`` share every kernel; they differ only in
which δ reaches the dS kernels. Saved for the backward: FP8 codes, FP32 block scales and one FP32 lse per row — O(N).

``matched_factored`` runs Delta-Matching in the factored scale layout (kernels/README.md): every kernel's scales are
constant along its dots' contraction, so the wgmma accumulates in place. Its forward also quantises V and the centred
K per channel (V̂ᶜ for PV, K̂ᶜ kept for dQ); its backward quantises dO per channel (dV) and Q' = s ⊙ Q per channel once
the δ pass has formed dŜ's row scales s (dK), so it also keeps Q for the backward.
"""

import math

import torch

from deltamatch.kernels.inputs import validate_attention_inputs
from deltamatch.kernels.triton_bwd import (attention_backward, cuda_kernels_selected, cuda_quant_selected,
                                          k_fragment_order)
from deltamatch.kernels.triton_fwd import attention_forward, cuda_forward_variant, forward_config
from deltamatch.kernels.triton_quant import (BLOCK_KV, BLOCK_Q, ONE_READ_SWITCH, centring_stats, env_switch,
                                             quantize_block_and_channel, quantize_do_and_delta, quantize_operand,
                                             quantize_per_channel, token_mean)
from deltamatch.methods import implemented_by

MODES = implemented_by("triton")
HEAD_DIMS = (64, 128, 256)
DTYPES = (torch.bfloat16, torch.float16)


SAVED = ("q8", "q8t", "k8", "k8t", "v8", "sq", "sk", "sv", "lse2", "m2")
"""What every mode's backward reads: FP8 codes, block scales, lse2 (``matched_factored``'s has no ``q8t``, ``k8t``:
None), and ``m2``, the row maxima the 128-key CUDA forward writes for the δ pass's ``cuda_lib.DELTA_ROW_MAX`` variants
(None from the other forwards)."""
FACTORED_SAVED = ("q", "k8t", "skc")
"""What ``matched_factored``'s backward also reads: Q (for Q' = s ⊙ Q) and K̂ᶜ (codes, channel scales)."""


def fp8_forward(q, k, v, causal: bool, mode: str, softmax_scale: float, backward: bool = True):
    """Quantise and run the forward kernel: ``(o, saved, factored)`` — ``saved`` the tensors of ``SAVED``,
    ``factored`` those of ``FACTORED_SAVED`` for ``matched_factored`` (else None). ``backward=False`` (a forward no
    gradient will follow; ``saved`` and ``factored`` None): ``matched_factored`` skips the copies only its backward
    reads — V̂ token-major (dP̂) and K̂ᶜ (dQ) — and O is the same either way."""
    wide = cuda_forward_variant(q.shape[-1], q.dtype) if mode == "matched_factored" else None
    cuda = mode == "matched_factored" and cuda_kernels_selected(q.shape[-1], q.dtype, what="forward")
    # K̂ᶜ goes to the CUDA dQ in its A fragments' key order (triton_bwd.attention_backward reorders it for Triton's)
    k_fragment = mode == "matched_factored" and k_fragment_order(q.shape[-1], k.dtype)
    factored = m2 = None
    if mode == "matched_factored":
        # the factored layout reads each block-scaled operand token-major only, each per-channel one channel-major only
        if cuda_quant_selected(q):
            from deltamatch.kernels import cuda_lib

            (q8, sq), q8t = cuda_lib.quantize_block(q, BLOCK_Q), None
        else:
            q8, q8t, sq = quantize_operand(q, BLOCK_Q, name="q", layouts="token")
        k8t = v8t = None
        if backward and cuda_quant_selected(k) and cuda_quant_selected(v):  # each copy pair from two reads
            from deltamatch.kernels import cuda_lib

            k8, sk, k8t_c, sk_c, _ = cuda_lib.quantize_block_and_channel(k, BLOCK_KV, centre=True,
                                                                         fragment_order=k_fragment)
            v8, sv, v8t_c, sv_c, _ = cuda_lib.quantize_block_and_channel(v, BLOCK_KV, fragment_order=bool(wide))
        elif env_switch(ONE_READ_SWITCH):  # both copies of K and of V from one read each (slower on the H200)
            k_mean, k_amax = centring_stats(k)
            k8, sk, k8t_c, sk_c = quantize_block_and_channel(k, BLOCK_KV, "k", mean=k_mean, amax=k_amax,
                                                             fragment_order=k_fragment)
            v8, sv, v8t_c, sv_c = quantize_block_and_channel(v, BLOCK_KV, "v")
        else:
            k_mean = token_mean(k)
            k8, _, sk = quantize_operand(k, BLOCK_KV, centre=True, name="k", mean=k_mean, layouts="token")
            # the 128-key CUDA forward reads V̂ᶜ in its A fragments' key order (cuda_lib.fwd_wide)
            _, v8t_c, sv_c = quantize_per_channel(v, "v", layouts="channel", fragment_order=bool(wide))
            if backward:  # V̂ token-major for dP̂, K̂ᶜ for dQ: the backward's alone
                v8, _, sv = quantize_operand(v, BLOCK_KV, name="v", layouts="token")
                _, k8t_c, sk_c = quantize_per_channel(k, "k", mean=k_mean, layouts="channel",
                                                      fragment_order=k_fragment)
        config = forward_config(q.shape[-1], factored=True)
        if wide:
            from deltamatch.kernels import cuda_lib

            # the row maxima beside lse2 where a backward follows (one FP32 a row): a δ pass of DELTA_ROW_MAX reads them
            m2 = torch.empty(q8.shape[:3], device=q8.device, dtype=torch.float32) if backward else None
            o, lse2 = cuda_lib.fwd_wide(q8, k8, v8t_c, sq, sk, sv_c, tuple(q.shape), causal,
                                        softmax_scale * math.log2(math.e), dtype=q.dtype,
                                        promote=config.get("ACC_PROMOTE") is not None, variant=wide, row_max=m2)
        elif cuda:
            from deltamatch.kernels import cuda_lib

            o, lse2 = cuda_lib.fwd_factored(q8, k8, v8t_c, sq, sk, sv_c, tuple(q.shape), causal,
                                            softmax_scale * math.log2(math.e), dtype=q.dtype,
                                            promote=config.get("ACC_PROMOTE") is not None)
        else:
            o, lse2 = attention_forward(q8, k8, v8t_c, sq, sk, sv_c, q.shape, q.dtype, causal, softmax_scale,
                                        config=config)
        factored = dict(q=q, k8t=k8t_c, skc=sk_c) if backward else None
    else:
        k_mean = token_mean(k)
        q8, q8t, sq = quantize_operand(q, BLOCK_Q, name="q")
        k8, k8t, sk = quantize_operand(k, BLOCK_KV, centre=True, name="k", mean=k_mean)
        v8, v8t, sv = quantize_operand(v, BLOCK_KV, name="v")
        o, lse2 = attention_forward(q8, k8, v8t, sq, sk, sv, q.shape, q.dtype, causal, softmax_scale)
    if not backward:
        return o, None, None
    saved = dict(q8=q8, q8t=q8t, k8=k8, k8t=k8t, v8=v8, sq=sq, sk=sk, sv=sv, lse2=lse2, m2=m2)
    return o, saved, factored


def fp8_backward(saved: dict, factored: dict | None, o, do, causal: bool, mode: str, softmax_scale: float,
                 shapes: tuple, dtypes: tuple, ds_stats: dict | None = None):
    """Quantise dO (and form the stale / consistent δ), run the backward kernels: ``(dq, dk, dv)``. ``ds_stats``:
    the dS row-sum diagnostics of ``triton_bwd.attention_backward``."""
    do = do.contiguous()
    cuda_quant = factored is not None and cuda_quant_selected(do)
    if factored and (cuda_quant or env_switch(ONE_READ_SWITCH)):  # dÔ block-scaled (dP) and per channel (dV)
        fragment = k_fragment_order(do.shape[-1], do.dtype)  # the order the CUDA dK/dV reads dÔᶜ in
        if cuda_quant:
            from deltamatch.kernels import cuda_lib

            do8, sdo, do8t_c, sdoc, _ = cuda_lib.quantize_block_and_channel(do, BLOCK_Q, fragment_order=fragment)
        else:
            do8, sdo, do8t_c, sdoc = quantize_block_and_channel(do, BLOCK_Q, "do", fragment_order=fragment)
        factored = dict(factored, do8t=do8t_c, sdoc=sdoc, do_fragment=fragment)
        return attention_backward(saved, do8, None, sdo, None, mode, causal, softmax_scale, shapes[0][1], shapes,
                                  dtypes, ds_stats=ds_stats, factored=factored)  # δ: the δ pass's own
    layouts = "token" if mode == "matched_factored" else "both"  # its dV reads dÔ per channel (triton_bwd)
    do8, do8t, sdo, delta = quantize_do_and_delta(do, o, mode, layouts=layouts)
    return attention_backward(saved, do8, do8t, sdo, delta, mode, causal, softmax_scale, shapes[0][1], shapes, dtypes,
                              ds_stats=ds_stats, factored=dict(factored, do=do) if factored else None)


class _TritonFP8Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, mode: str, softmax_scale: float):
        o, saved, factored = fp8_forward(q, k, v, causal, mode, softmax_scale)
        ctx.save_for_backward(o, *saved.values(), *(factored.values() if factored else ()))
        ctx.meta = (causal, mode, softmax_scale, (q.shape, k.shape), (q.dtype, k.dtype))
        return o

    @staticmethod
    def backward(ctx, do):
        causal, mode, softmax_scale, shapes, dtypes = ctx.meta
        o, *tensors = ctx.saved_tensors
        saved = dict(zip(SAVED, tensors))
        factored = dict(zip(FACTORED_SAVED, tensors[len(SAVED):])) if len(tensors) > len(SAVED) else None
        dq, dk, dv = fp8_backward(saved, factored, o, do, causal, mode, softmax_scale, shapes, dtypes)
        return dq, dk, dv, None, None, None


def triton_attention(q, k, v, causal: bool = True, mode: str = "matched", softmax_scale: float | None = None):
    """FP8 attention through the Triton kernels; q (B, N, H, D), k/v (B, N, H_kv, D). Also runs in the interpreter."""
    validate_attention_inputs(q, k, v, mode, softmax_scale)
    if mode not in MODES:
        raise ValueError(f"the Triton kernels run modes {MODES}, not {mode!r}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"the Triton kernels run head dims {HEAD_DIMS}, not {q.shape[-1]}")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):  # no backward will follow
        return fp8_forward(q, k, v, causal, mode, float(softmax_scale), backward=False)[0]
    return _TritonFP8Attention.apply(q, k, v, causal, mode, float(softmax_scale))


class TritonBackend:
    """``dm_attn_func`` backend: the Hopper FP8 kernels, for sm90 CUDA tensors."""

    name = "triton"

    def supports(self, q, k, v, causal, mode) -> str | None:
        if mode not in MODES:
            return f"mode {mode!r} is not one of {MODES}"
        if not q.is_cuda:
            return "inputs are not CUDA tensors"
        if torch.cuda.get_device_capability(q.device) != (9, 0):
            return f"needs an sm90 (Hopper) GPU, found sm{''.join(map(str, torch.cuda.get_device_capability(q.device)))}"
        if q.shape[-1] not in HEAD_DIMS:
            return f"head dim {q.shape[-1]} is not one of {HEAD_DIMS}"
        if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
            return f"dtype {q.dtype} is not one of {DTYPES}"
        return None

    def apply(self, q, k, v, causal, mode, softmax_scale):
        return triton_attention(q, k, v, causal, mode, softmax_scale)
