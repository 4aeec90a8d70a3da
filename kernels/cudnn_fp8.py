"""The cuDNN / Transformer Engine FP8 attention baseline (method ``cudnn_fp8``), through nvidia-cudnn-frontend.

cuDNN's FP8 SDPA (``pygraph.sdpa_fp8`` / ``sdpa_fp8_backward``) takes E4M3 Q, K, V, dO with one FP32 scale per tensor
(``descale`` multiplies the codes back, ``scale`` divides before a cast) and quantises P with a fixed scale (P ∈ [0, 1]
→ 448·P), O per tensor, dS ("dP" in cuDNN's names) per tensor. Its numerics twin is the reference's ``cudnn_fp8_sim``.

Scales: Q, K, V, dO from their current amax (amax / 448). O is a convex combination of V's rows, so |O| ≤ amax(V) and
``scale_o = 448 / amax(V)`` never saturates without a second pass. dS has no such bound: like Transformer Engine's
delayed scaling, its scale comes from the amax cuDNN reported on the previous call of the same shape (history of one);
the first call of a shape runs the backward twice. On Hopper cuDNN writes dQ, dK, dV only in FP8 (BF16 gradients
need Blackwell), so they get delayed scales the same way and are dequantised to the input dtype.

GQA: cuDNN's FP8 graph on Hopper takes H == H_kv, so K and V are expanded to the query heads before quantisation
(``repeat_interleave``; one per-tensor scale either way, so the codes are those of the replicated heads) and autograd
sums each KV head's gradient over its query group, as the reference's simulation does.

Importing this module never imports cuDNN; ``CudnnFP8Backend.supports`` says "unavailable" with the reason when
``cudnn`` (the frontend) cannot be imported or the GPU is not Hopper.
"""

import math
import threading

import torch

from deltamatch.kernels.inputs import validate_attention_inputs
from deltamatch.methods import implemented_by

E4M3_MAX = 448.0
HEAD_DIM = 128
"""The one head dim cuDNN's FP8 SDPA supports on Hopper."""
_GRAPHS: dict = {}
_DS_AMAX: dict = {}
_LOCK = threading.Lock()


def _cudnn():
    try:
        import cudnn
    except Exception as exc:  # ImportError, or a missing shared library inside it
        raise ImportError(f"cuDNN FP8 attention is unavailable: cannot import nvidia-cudnn-frontend ({exc})") from exc
    return cudnn


def _bhnd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)  # a view: cuDNN takes (B, H, N, D) dims with any strides


def _quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.abs().amax().float()
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale.reshape(1, 1, 1, 1)


def _tensor(graph, cudnn, t, dtype=None):
    return graph.tensor(dim=tuple(t.shape), stride=tuple(t.stride()),
                        data_type=dtype if dtype is not None else cudnn.data_type.FP8_E4M3)


def _scalar(graph, cudnn):
    return graph.tensor(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=cudnn.data_type.FLOAT)


def _build(graph, cudnn):
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    return graph


def _forward_graph(q8, k8, v8, causal, attn_scale):
    cudnn = _cudnn()
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT)
    t = dict(q=_tensor(graph, cudnn, q8), k=_tensor(graph, cudnn, k8), v=_tensor(graph, cudnn, v8))
    for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        t[name] = _scalar(graph, cudnn)
    o, stats, amax_s, amax_o = graph.sdpa_fp8(
        q=t["q"], k=t["k"], v=t["v"], descale_q=t["descale_q"], descale_k=t["descale_k"], descale_v=t["descale_v"],
        descale_s=t["descale_s"], scale_s=t["scale_s"], scale_o=t["scale_o"], generate_stats=True,
        attn_scale=attn_scale, use_causal_mask=causal)
    b, h, n, d = q8.shape
    o.set_output(True).set_dim((b, h, n, d)).set_stride((h * n * d, n * d, d, 1)).set_data_type(
        cudnn.data_type.FP8_E4M3)
    stats.set_output(True).set_dim((b, h, n, 1)).set_stride((h * n, n, 1, 1)).set_data_type(cudnn.data_type.FLOAT)
    for amax in (amax_s, amax_o):
        amax.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(cudnn.data_type.FLOAT)
    t.update(o=o, stats=stats, amax_s=amax_s, amax_o=amax_o)
    return _build(graph, cudnn), t


def _backward_graph(q8, k8, v8, o8, do8, stats, causal, attn_scale):
    cudnn = _cudnn()
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT)
    t = {name: _tensor(graph, cudnn, x) for name, x in (("q", q8), ("k", k8), ("v", v8), ("o", o8), ("do", do8))}
    t["stats"] = graph.tensor(dim=tuple(stats.shape), stride=tuple(stats.stride()), data_type=cudnn.data_type.FLOAT)
    names = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_do", "descale_s", "descale_dp",
             "scale_s", "scale_dq", "scale_dk", "scale_dv", "scale_dp")
    for name in names:
        t[name] = _scalar(graph, cudnn)
    outs = graph.sdpa_fp8_backward(
        q=t["q"], k=t["k"], v=t["v"], o=t["o"], dO=t["do"], stats=t["stats"],
        descale_q=t["descale_q"], descale_k=t["descale_k"], descale_v=t["descale_v"], descale_o=t["descale_o"],
        descale_dO=t["descale_do"], descale_s=t["descale_s"], descale_dP=t["descale_dp"], scale_s=t["scale_s"],
        scale_dQ=t["scale_dq"], scale_dK=t["scale_dk"], scale_dV=t["scale_dv"], scale_dP=t["scale_dp"],
        attn_scale=attn_scale, use_causal_mask=causal)
    dq, dk, dv, *amaxes = outs
    for out, ref in ((dq, q8), (dk, k8), (dv, v8)):
        b, h, n, d = ref.shape
        out.set_output(True).set_dim((b, h, n, d)).set_stride((h * n * d, n * d, d, 1)).set_data_type(
            cudnn.data_type.FP8_E4M3)
    for amax in amaxes:
        amax.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(cudnn.data_type.FLOAT)
    t.update(dq=dq, dk=dk, dv=dv, amax_dq=amaxes[0], amax_dk=amaxes[1], amax_dv=amaxes[2], amax_dp=amaxes[3])
    return _build(graph, cudnn), t


def _cached(key, make):
    with _LOCK:
        if key not in _GRAPHS:
            _GRAPHS[key] = make()
        return _GRAPHS[key]


def _execute(graph, tensors, values: dict, device):
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    graph.execute({tensors[name]: value for name, value in values.items()}, workspace)


def _key(*xs):
    return tuple((tuple(x.shape), tuple(x.stride())) if isinstance(x, torch.Tensor) else x for x in xs)


class _CudnnFP8Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, attn_scale):
        q8, sq = _quant(_bhnd(q))
        k8, sk = _quant(_bhnd(k))
        v8, sv = _quant(_bhnd(v))
        b, h, n, d = q8.shape
        graph, t = _cached(("fwd", _key(q8, k8, v8), causal, attn_scale),
                           lambda: _forward_graph(q8, k8, v8, causal, attn_scale))
        o8 = torch.empty((b, h, n, d), device=q.device, dtype=torch.float8_e4m3fn)
        stats = torch.empty((b, h, n, 1), device=q.device, dtype=torch.float32)
        amax = [torch.empty((1, 1, 1, 1), device=q.device, dtype=torch.float32) for _ in range(2)]
        v_amax = sv * E4M3_MAX
        so = (E4M3_MAX / v_amax).reshape(1, 1, 1, 1)  # |O| <= amax(V): O never saturates
        one = torch.ones((1, 1, 1, 1), device=q.device, dtype=torch.float32)
        _execute(graph, t, dict(q=q8, k=k8, v=v8, descale_q=sq, descale_k=sk, descale_v=sv,
                                descale_s=one / E4M3_MAX, scale_s=one * E4M3_MAX, scale_o=so,
                                o=o8, stats=stats, amax_s=amax[0], amax_o=amax[1]), q.device)
        ctx.save_for_backward(q8, k8, v8, sq, sk, sv, o8, 1.0 / so, stats)
        ctx.causal, ctx.attn_scale, ctx.dtype = causal, attn_scale, q.dtype
        return (o8.float() / so).to(q.dtype).transpose(1, 2)

    @staticmethod
    def backward(ctx, do):
        q8, k8, v8, sq, sk, sv, o8, s_o, stats = ctx.saved_tensors
        do8, sdo = _quant(_bhnd(do))
        key = ("bwd", _key(q8, k8, v8, o8, do8), ctx.causal, ctx.attn_scale)
        graph, t = _cached(key, lambda: _backward_graph(q8, k8, v8, o8, do8, stats, ctx.causal, ctx.attn_scale))
        one = torch.ones((1, 1, 1, 1), device=do.device, dtype=torch.float32)
        codes = [torch.empty(x.shape, device=do.device, dtype=torch.float8_e4m3fn) for x in (q8, k8, v8)]
        amax = [torch.empty((1, 1, 1, 1), device=do.device, dtype=torch.float32) for _ in range(4)]  # dQ dK dV dS
        for _ in range(2):
            history = _DS_AMAX.get(key)
            s_dq, s_dk, s_dv, s_ds = (one if history is None else torch.where(a > 0, a / E4M3_MAX, one)
                                      for a in (history or [None] * 4))
            _execute(graph, t, dict(
                q=q8, k=k8, v=v8, o=o8, do=do8, stats=stats, descale_q=sq, descale_k=sk, descale_v=sv,
                descale_o=s_o, descale_do=sdo, descale_s=one / E4M3_MAX, descale_dp=s_ds,
                scale_s=one * E4M3_MAX, scale_dq=one / s_dq, scale_dk=one / s_dk, scale_dv=one / s_dv,
                scale_dp=one / s_ds, dq=codes[0], dk=codes[1], dv=codes[2], amax_dq=amax[0], amax_dk=amax[1],
                amax_dv=amax[2], amax_dp=amax[3]), do.device)
            _DS_AMAX[key] = [a.clone() for a in amax]  # delayed scaling: the next call of this shape uses these
            if history is not None:
                break
        grads = [(c.float() * s).to(ctx.dtype).transpose(1, 2) for c, s in zip(codes, (s_dq, s_dk, s_dv))]
        return grads[0], grads[1], grads[2], None, None


def cudnn_fp8_attention(q, k, v, causal: bool = True, softmax_scale: float | None = None):
    """cuDNN's FP8 SDPA forward and backward; q/k/v (B, N, H, D) BF16 or FP16 on a Hopper GPU."""
    validate_attention_inputs(q, k, v, "cudnn_fp8", softmax_scale)
    reason = unsupported_shape(q, k)
    if reason is not None:
        raise ValueError(f"cuDNN FP8 attention: {reason}")
    _cudnn()
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    group = q.shape[2] // k.shape[2]
    if group > 1:  # GQA: cuDNN's FP8 graph needs H == H_kv (see the module docstring)
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    return _CudnnFP8Attention.apply(q, k, v, bool(causal), float(softmax_scale))


def unsupported_shape(q, k) -> str | None:
    """Why cuDNN's FP8 SDPA cannot take these shapes (its graph check would raise ``cudnnGraphNotSupportedError``)."""
    if q.shape[-1] != HEAD_DIM:
        return f"head dim {q.shape[-1]}: cuDNN's FP8 attention on Hopper runs only D = {HEAD_DIM}"
    return None


class CudnnFP8Backend:
    """``dm_attn_func`` backend for mode ``cudnn_fp8`` on CUDA."""

    name = "cudnn"

    def unavailable_reason(self) -> str | None:
        try:
            _cudnn()
        except ImportError as exc:
            return str(exc)
        return None

    def supports(self, q, k, v, causal, mode) -> str | None:
        if mode not in implemented_by("cudnn"):
            return f"runs only modes {implemented_by('cudnn')}, not {mode!r}"
        shape = unsupported_shape(q, k)
        if shape is not None:
            return shape
        if not q.is_cuda:
            return "inputs are not CUDA tensors"
        if torch.cuda.get_device_capability(q.device)[0] < 9:
            return "cuDNN FP8 attention needs Hopper (sm90) or newer"
        if q.dtype not in (torch.bfloat16, torch.float16):
            return f"dtype {q.dtype} is not bf16/fp16"
        return self.unavailable_reason()

    def apply(self, q, k, v, causal, mode, softmax_scale):
        return cudnn_fp8_attention(q, k, v, causal, softmax_scale)
