"""Instrumentation for the paper's figures and Table 9.

- :func:`gain_concentration`: the QK-norm gains of an attention layer enter every logit as
  ``sum_c g_q,c g_k,c q_c k_c``; the share of the largest channel in ``sum_c (g_q,c g_k,c)^2`` says how far the gains have collapsed onto a few
  channels (the paper's signature of the stale-delta bias pushed into dK and the gains).
- :func:`capture_attention_io`: runs one forward and backward on real tokens and returns, for every attention layer,
  the inputs of its attention core ``q, k, v (B, N, H, D)`` and the gradient ``dO`` of the core's output, which is
  exactly what ``deltamatch.kernels.reference.probe_backward`` / ``measures.residual_summary`` take.
"""

import torch
from torch import nn

from deltamatch.kernels.reference import probe_backward


def gain_concentration(q_gain: torch.Tensor, k_gain: torch.Tensor, top_k: int = 5) -> tuple[float, list[int]]:
    """Share of the largest channel in ``sum_c (g_q,c g_k,c)^2`` and the ``top_k`` channels by that product.

    Gains are ``(D,)`` or per head ``(H, D)`` (then averaged over heads first).
    """
    q_gain, k_gain = (g.detach().float().cpu() for g in (q_gain, k_gain))
    q_gain, k_gain = (g.mean(0) if g.dim() == 2 else g for g in (q_gain, k_gain))
    if q_gain.dim() != 1 or q_gain.shape != k_gain.shape:
        shapes = f"{tuple(q_gain.shape)} and {tuple(k_gain.shape)}"
        raise ValueError(f"gains must be (D,) or (H, D) with equal D; got {shapes}")
    energy = (q_gain * k_gain).pow(2)
    total = energy.sum()
    share = float(energy.max() / total) if total > 0 else 0.0
    top = torch.argsort(energy, descending=True)[:top_k]
    return share, [int(c) for c in top]


def attention_gains(model: nn.Module) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{layer: (q gain, k gain)}`` for every attention layer with QK-norm."""
    return {
        i: (attn.q_norm.weight, attn.k_norm.weight)
        for i, attn in model.attention_layers()
        if getattr(attn, "q_norm", None) is not None
    }


def capture_attention_io(
    model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor
) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Forward + backward of the LM loss; per attention layer the core's ``(q, k, v, dO)``, detached, in the layout
    and dtype the core saw. Parameter ``.grad`` is left untouched (the gradient is taken w.r.t. the core outputs only).
    """
    inputs: dict[int, tuple[torch.Tensor, ...]] = {}
    outputs: dict[int, torch.Tensor] = {}
    handles = []
    for layer, attn in model.attention_layers():

        def hook(module, args, out, layer=layer):
            inputs[layer] = tuple(t.detach().clone() for t in args[:3])
            outputs[layer] = out

        handles.append(attn.core.register_forward_hook(hook))
    try:
        with torch.enable_grad():
            loss = model(input_ids=input_ids, labels=labels, use_cache=False).loss
            layers = sorted(outputs)
            if not layers:
                raise ValueError("the model has no attention layer to capture")
            if not all(outputs[i].requires_grad for i in layers):
                raise ValueError("attention outputs do not require grad: enable requires_grad on the parameters")
            grads = torch.autograd.grad(loss, [outputs[i] for i in layers])
    finally:
        for handle in handles:
            handle.remove()
    return {i: (*inputs[i], g.detach()) for i, g in zip(layers, grads)}


def delta_error_effects(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                        softmax_scale: float | None = None) -> dict[str, dict]:
    """What each inexact δ does to one step, measured against Delta-Matching's δ on the same activations (the paper's
    Figure 4, left and middle). For δ kind X, the error in the score gradient is ``E = dS_X − dS_matched =
    −P ⊙ (δ_X − δ)``, a per-row multiple of P; a descent step adds ``η (δ_X − δ)_i P_ij`` to row i's logits, which
    lowers the row's entropy (sharpens it) where ``δ_X − δ > 0`` and raises it (flattens it) where it is negative
    (d/dc H(softmax(s + cP)) = −Cov_P(P, log P) ≤ 0 at c = 0).

    ``sharpened`` / ``flattened``: share of query rows (batch, head, row; the first row, which sees one key and has no
    entropy to change, left out) the error sharpens / flattens.
    ``push``: per QK channel c, the error's gradient on a gain multiplying channel c of every query and key,
    ``e_c = scale · Σ_{b,h,i,j} E_ij q_ic k_jc``, normalised by Σ_c |e_c|; negative means descent raises that channel's
    gain. ``push_consistency``: per channel, |Σ_{b,h} e_{bhc}| / Σ_{b,h} |e_{bhc}| (1 when every head and sequence
    pushes the channel the same way), and its median over channels. ``q, k, v, do`` as ``capture_attention_io``
    returns them (B, N, H, D), k/v may have fewer heads (GQA).
    """
    probes = probe_backward(q, k, v, do, causal=True, softmax_scale=softmax_scale)
    reference = probes["matched"]
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    group = q.shape[2] // k.shape[2]
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=2)
    out = {}
    for kind, probe in probes.items():
        if kind == "matched":
            continue
        shift = (probe.delta - reference.delta).double()[..., 1:]  # (B, H, N-1): row 0 sees one key, no entropy
        error = (probe.ds_before_cast - reference.ds_before_cast).float()  # (B, H, N, N)
        per_head = scale * torch.einsum("bhij,bihc,bjhc->bhc", error, qf, kf).double()  # (B, H, D)
        total = per_head.sum((0, 1))
        consistency = total.abs() / per_head.abs().sum((0, 1)).clamp_min(1e-300)
        norm = total.abs().sum().clamp_min(1e-300)
        out[kind] = {"sharpened": float((shift > 0).double().mean()), "flattened": float((shift < 0).double().mean()),
                     "push": [float(x) for x in total / norm],
                     "push_consistency_per_channel": [float(x) for x in consistency],
                     "push_consistency": float(consistency.median())}
    return out
