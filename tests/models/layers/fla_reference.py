"""fla's Gated DeltaNet and KDA chunk kernels against FP64/FP32 references, shared by
tests/models/layers/test_fla_gpu.py and tools/device/profile_step.py (its ``verify`` and ``kda`` items print the errors on the H200).

Inputs are like training's rather than random: keys pulled toward a shared direction (cosines near 0.5), beta from
a sigmoid of a positive-biased logit, gates with the layer's own A_log/dt_bias parametrisation.
"""

import torch
import torch.nn.functional as F

from deltamatch.kernels.measures import relative_error
from deltamatch.models.layers.gdn import chunk_gated_delta_rule, gdn_gate, l2_normalize


def gdn_inputs(B, T, H, K, V, initial_state: bool, seed=0, device="cuda", kda=False):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shared = torch.randn(B, 1, H, K, generator=gen)
    q = torch.randn(B, T, H, K, generator=gen)
    k = 0.5 * shared + 0.5 * torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    a = torch.randn(B, T, H, K, generator=gen) if kda else torch.randn(B, T, H, generator=gen)
    b = torch.randn(B, T, H, generator=gen) + 1.5  # beta ~ 0.8
    A_log = torch.empty(H).uniform_(0, 16, generator=gen).clamp_min(1e-4).log()
    dt = torch.exp(torch.rand(H * K if kda else H, generator=gen) * (torch.log(torch.tensor(0.1))
                                                                      - torch.log(torch.tensor(1e-3)))
                   + torch.log(torch.tensor(1e-3)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    h0 = 0.1 * torch.randn(B, H, K, V, generator=gen) if initial_state else None
    tensors = dict(q=q, k=k, v=v, g=a, beta=b, A_log=A_log, dt_bias=dt_bias, initial_state=h0)
    return {n: t.to(device).requires_grad_() for n, t in tensors.items() if t is not None}


def _grads(outputs, inputs: dict, seed=1):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outputs]
    loss = sum((o * c).sum() for o, c in zip(outputs, cotangents))
    return dict(zip(inputs, torch.autograd.grad(loss, list(inputs.values()))))


def _token_sum(terms: torch.Tensor, shape) -> torch.Tensor:
    """Per-token terms (B, T, H[, K]) summed to a parameter's ``shape`` ((H,) or (H·K,))."""
    summed = terms.sum((0, 1))
    return summed.reshape(shape) if summed.numel() == shape.numel() else summed.sum(-1).reshape(shape)


def _errors(outputs, inputs: dict, ref_outputs, ref_inputs: dict, ref_gate: torch.Tensor) -> dict[str, float]:
    """Relative errors of the output, the final state and every input's gradient (same random cotangents) against
    the reference's.

    dA_log and ddt_bias are sums over every token of terms that largely cancel: at T = 63 with an initial state the
    terms of dA_log sum in absolute value to 700-780x the result (measured on the CPU in the reference), so an error
    of 5e-3 in each term (what dg shows) is 0.17 of |dA_log|. Their error is therefore taken against the size of
    those terms, ||sum_t |term_t| ||, as for any ill-conditioned sum: the terms are dgate * gate for A_log (the gate
    is proportional to exp(A_log)) and dg itself for dt_bias (g and dt_bias enter the gate as g + dt_bias)."""
    (o, h_t), (o_ref, h_t_ref) = outputs, ref_outputs
    errors = {"o": relative_error(o, o_ref), "final_state": relative_error(h_t, h_t_ref)}
    grads, grads_ref = _grads(outputs, inputs), _grads(ref_outputs, {**ref_inputs, "gate": ref_gate})
    token_sums = {"A_log": grads_ref["gate"] * ref_gate, "dt_bias": grads_ref["g"]}  # their terms, per token
    for name in inputs:
        if name in token_sums:
            scale = _token_sum(token_sums[name].abs(), ref_inputs[name].shape).norm()
            diff = grads[name].double() - grads_ref[name].double().to(grads[name].device)
            errors[f"d{name}"] = (diff.norm() / scale).item()
        else:
            errors[f"d{name}"] = relative_error(grads[name], grads_ref[name])
    return errors


def _as_fla_calls(inputs: dict, dtype) -> dict:
    """The kernel's inputs as the layer hands them over: q, k, v and the gate projection in ``dtype``, the rest FP32."""
    return {n: t.detach().to(dtype if t.dim() == 4 and n != "initial_state" else torch.float32).requires_grad_()
            for n, t in inputs.items()}


# fla's chunk kernels called as the layers call them: gate, beta sigmoid and q/k L2 norm inside the kernel.
IN_KERNEL = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 use_gate_in_kernel=True)


def _layer_operands(raw: dict, gate) -> tuple:
    """What the in-kernel options compute, written out for a reference: L2-normalised q and k, v, the layer's gate
    from (g, A_log, dt_bias), and sigmoid(beta)."""
    return (l2_normalize(raw["q"]), l2_normalize(raw["k"]), raw["v"], gate(raw["g"], raw["A_log"], raw["dt_bias"]),
            raw["beta"].sigmoid())


def gdn_errors(B, T, H, K, V, initial_state: bool, dtype=torch.float32) -> dict[str, float]:
    """Relative RMS error of fla's ``chunk_gated_delta_rule`` (gate, beta sigmoid and q/k L2 norm in the kernel, as
    the layer calls it) against the pure-torch twin in FP64, for the output, the final state and every gradient."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

    inputs = gdn_inputs(B, T, H, K, V, initial_state)
    fla_in = _as_fla_calls(inputs, dtype)
    o, hT = fla_chunk(**fla_in, **IN_KERNEL)
    ref_in = {n: t.detach().double().requires_grad_() for n, t in inputs.items()}
    operands = _layer_operands(ref_in, gdn_gate)
    o_ref, hT_ref = chunk_gated_delta_rule(*operands, initial_state=ref_in.get("initial_state"))
    return _errors((o.float(), hT), fla_in, (o_ref, hT_ref), ref_in, operands[3])


def kda_errors(B, T, H, K, V, initial_state: bool, dtype=torch.bfloat16) -> dict[str, float]:
    """fla's ``chunk_kda`` (q, k, v and gate in ``dtype``, as training's autocast hands them over) against fla's
    token-by-token ``naive_recurrent_kda`` (FP32 inside, no chunking, no triangular inverse) on the same rounded
    values, with the layer's gate and normalisations written out.

    BF16 by default: at K = 128, V = 256, FP32 inputs make every launch config of fla's KDA state backward
    (``chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64`` with a per-key gate) need >= 240 KiB of shared memory,
    more than an H100/H200 block may use (227 KiB), so fla cannot run that case on Hopper at all."""
    from fla.ops.kda import chunk_kda
    from fla.ops.kda.naive import naive_recurrent_kda

    from deltamatch.models.layers.kda import kda_gate

    inputs = gdn_inputs(B, T, H, K, V, initial_state, kda=True)
    fla_in = _as_fla_calls(inputs, dtype)
    o, hT = chunk_kda(**fla_in, **IN_KERNEL)
    ref_in = {n: t.detach().double().requires_grad_() for n, t in fla_in.items()}
    operands = _layer_operands(ref_in, kda_gate)
    o_ref, hT_ref = naive_recurrent_kda(*operands, initial_state=ref_in.get("initial_state"), output_final_state=True)
    return _errors((o.float(), hT), fla_in, (o_ref, hT_ref), ref_in, operands[3])
