"""Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024): the linear-attention mixer of the hybrids.

Per head, a state ``S`` (K x V) is decayed and corrected by the delta rule at every token t:

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,     o_t = S_t^T q_t * K^-1/2

with q, k short-convolved, SiLU'd and L2-normalised, ``beta = sigmoid(b_proj x)`` and the Mamba-2 style gate
``g = -exp(A_log) * softplus(a_proj x + dt_bias)``; the output is RMS-normalised per head, gated by ``silu(g_proj x)``
and projected back. Parameter names and shapes are those of ``fla.layers.GatedDeltaNet`` (``q_proj``, ``k_proj``,
``v_proj``, ``a_proj``, ``b_proj``, ``A_log``, ``dt_bias``, ``{q,k,v}_conv1d.weight``, ``g_proj``, ``o_norm.weight``,
``o_proj``), so a state dict moves between fla's layer, the CUDA path and the CPU path unchanged.

Two implementations of the recurrence, chosen by :func:`gdn_backend` (tests pin one with :func:`use_gdn_backend`):

- ``fla``: flash-linear-attention's Triton chunk kernel (training, prefill) and fused recurrent kernel (decoding);
- ``torch``: :func:`chunk_gated_delta_rule`, the chunked algorithm in plain PyTorch (autograd gives the backward).
  Within a chunk of C tokens the sequential corrections are folded into one unit-lower-triangular inverse (the WY
  form, ``T = (I + tril(diag(beta) K K^T * Gamma, -1))^-1``), so only the chunk-to-chunk state update is a Python loop.
  It is checked against fla's ``naive_recurrent_gated_delta_rule`` (outputs and all gradients) in the tests.

The recurrent state is stored K-first, ``(B, H, K, V)``, as fla's naive reference and its kernels' default layout.
"""

import contextlib
import functools
import math
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .norm import GatedRMSNorm

_PINNED = threading.local()
BACKENDS = ("fla", "torch")


def gdn_backend(x: torch.Tensor) -> str:
    """The recurrence implementation for inputs like ``x``: the pinned one, else fla's kernels on CUDA (where fla
    trusts its own backward when gradients are needed), else torch."""
    pinned = getattr(_PINNED, "name", None)
    if pinned is not None:
        return pinned
    if not x.is_cuda or not fla_installed():
        return "torch"
    return "fla" if not torch.is_grad_enabled() or fla_backward_supported(x.device) else "torch"


@functools.cache
def fla_installed() -> bool:
    """Whether flash-linear-attention can be imported (the Hub copy of this file runs without it, on the twin)."""
    import importlib.util

    return importlib.util.find_spec("fla") is not None


@functools.cache
def fla_backward_supported(device: torch.device) -> bool:
    """fla 0.6 refuses its gated chunk backward on Hopper under Triton >= 3.4, < 3.7.1 (fla issue #640: wrong
    gradients) unless tilelang is installed. There the pure-torch twin trains on the GPU; fla still runs inference."""
    import importlib.util

    # In try blocks here and below: optional at import time, also for transformers' check of a Hub copy's imports.
    try:
        import triton
        from packaging.version import Version
    except ImportError:
        return False
    hopper = torch.cuda.get_device_capability(device)[0] == 9
    affected = Version("3.4.0") <= Version(triton.__version__.split("+")[0]) < Version("3.7.1")
    return not (hopper and affected) or importlib.util.find_spec("tilelang") is not None


@contextlib.contextmanager
def use_gdn_backend(name: str | None) -> Iterator[None]:
    """Pin the linear-attention backend (``fla`` or ``torch``) inside the block; ``None`` restores the default."""
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown GDN backend {name!r}; choose one of {BACKENDS}")
    previous = getattr(_PINNED, "name", None)
    _PINNED.name = name
    try:
        yield
    finally:
        _PINNED.name = previous


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum x^2 + eps)`` over the last dimension (fla's ``l2norm``)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def gdn_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Log-decay per token and head, ``-exp(A_log) * softplus(a + dt_bias)``, in FP32."""
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())


def unit_lower_inverse(strict: torch.Tensor) -> torch.Tensor:
    """``(I + A)^-1`` for strictly lower-triangular ``A (..., C, C)``, by repeated squaring.

    A is nilpotent, so ``(I + A)^-1 = sum_k (-A)^k = prod_i (I + (-A)^(2^i))`` is exact after ceil(log2 C) factors:
    a handful of batched matmuls, whose backward is far cheaper on the CPU than ``solve_triangular``'s (30x at C=64).
    """
    C = strict.shape[-1]
    inverse = torch.eye(C, dtype=strict.dtype, device=strict.device) - strict
    power = -strict
    for _ in range(max(C - 1, 1).bit_length() - 1):
        power = power @ power
        inverse = inverse + inverse @ power
    return inverse


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule in chunks. q, k ``(B, T, H, K)``, v ``(B, T, H, V)``, g (log decay) and beta ``(B, T, H)``.

    Returns ``o (B, T, H, V)`` and the final state ``(B, H, K, V)``, both in FP32. q and k are used as given
    (normalise them first). Padding at the end of the last chunk has beta = k = 0, so it never touches the state.
    """
    # FP32 means FP32 under the trainer's bf16 autocast too: the nilpotent inverse and the chunk-to-chunk state
    # recurrence lose too much in BF16 matmuls (fla's kernels accumulate these in FP32 as well).
    with torch.autocast(k.device.type, enabled=False):
        return _chunk_rule_fp32(q, k, v, g, beta, scale, initial_state, chunk_size)


def _chunk_rule_fp32(q, k, v, g, beta, scale, initial_state, chunk_size):
    B, T, H, K = k.shape
    scale = K**-0.5 if scale is None else scale
    C = min(chunk_size, T)
    pad = (-T) % C
    q, k, v, g, beta = (
        F.pad(x.float().transpose(1, 2), (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
        for x in (q, k, v, g, beta)
    )
    N = (T + pad) // C
    q, k, v = (x.reshape(B, H, N, C, -1) for x in (q * scale, k, v))
    g, beta = g.reshape(B, H, N, C), beta.reshape(B, H, N, C)

    g = g.cumsum(-1)  # log decay from the chunk start, inclusive
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    # Gamma[i, j] = exp(g_i - g_j) for j <= i; masking before exp keeps the unused upper half from overflowing
    gamma = (g[..., :, None] - g[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    k_beta = k * beta[..., None]
    strict = (k_beta @ k.transpose(-1, -2) * gamma).tril(-1)
    wy = unit_lower_inverse(strict)
    u = wy @ (v * beta[..., None])  # the corrected values, before the state's contribution
    w = wy @ (k_beta * g.exp()[..., None])  # how much of the incoming state each token removes
    qk = (q @ k.transpose(-1, -2) * gamma).masked_fill(~lower, 0.0)

    state = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.float()
    outputs = []
    for n in range(N):
        v_new = u[:, :, n] - w[:, :, n] @ state
        outputs.append((q[:, :, n] * g[:, :, n, :, None].exp()) @ state + qk[:, :, n] @ v_new)
        g_last = g[:, :, n, -1, None]
        k_decayed = k[:, :, n] * (g_last - g[:, :, n]).exp()[..., None]
        state = state * g_last.exp()[..., None] + k_decayed.transpose(-1, -2) @ v_new
    o = torch.stack(outputs, dim=2).reshape(B, H, N * C, -1)[:, :, :T]
    return o.transpose(1, 2), state


def causal_depthwise_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SiLU(causal depthwise conv) over time. x ``(B, D, L)``, weight ``(D, 1, W)``; output ``(B, D, L)``."""
    width = weight.shape[-1]
    return F.silu(F.conv1d(F.pad(x, (width - 1, 0)), weight.to(x.dtype), groups=x.shape[1]))


@torch.no_grad()
def copy_into(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return param.copy_(value)


def gate_init(num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's gate initialisation: A ~ U(0, 16), dt = exp(U(log 1e-3, log 0.1)) >= 1e-4, dt_bias = softplus^-1(dt)."""
    A_log = torch.rand(num_heads).mul(16).clamp(min=1e-4).log()
    dt = torch.exp(torch.rand(num_heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
    return A_log, dt + torch.log(-torch.expm1(-dt))


class ShortConvolution(nn.Module):
    """Holds the depthwise kernel ``weight (D, 1, W)`` under fla's name; the layer fuses q/k/v convs into one call."""

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, 1, width) / math.sqrt(width))


class DeltaRuleMixer(nn.Module):
    """What GDN and KDA share: q/k/v projections with short convolutions, padding and cache handling, the per-head
    gated output norm and the output projection. Subclasses supply ``_rule`` (the recurrence) and ``_output_gate``."""

    def _init_qkv(self, hidden_size: int, num_heads: int, head_dim: int, expand_v: float, conv_size: int,
                  layer_idx: int):
        head_v_dim = head_dim * expand_v
        if head_v_dim != int(head_v_dim):
            raise ValueError(f"expand_v={expand_v} times head_dim={head_dim} is not an integer")
        self.num_heads, self.head_k_dim, self.head_v_dim = num_heads, head_dim, int(head_v_dim)
        self.key_dim, self.value_dim = num_heads * head_dim, num_heads * self.head_v_dim
        self.conv_size, self.layer_idx = conv_size, layer_idx
        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.q_conv1d = ShortConvolution(self.key_dim, conv_size)
        self.k_conv1d = ShortConvolution(self.key_dim, conv_size)
        self.v_conv1d = ShortConvolution(self.value_dim, conv_size)

    def _short_conv(self, x: torch.Tensor, cache) -> torch.Tensor:
        """q/k/v short convolutions as one depthwise conv over the concatenated channels; updates the conv cache."""
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight], dim=0)
        if cache is None and gdn_backend(x) == "fla":  # training and plain forwards: fla's fused Triton conv
            try:
                from fla.modules.convolution import causal_conv1d
            except ImportError as err:
                raise ImportError(f"the fla GDN backend needs flash-linear-attention: {err}") from err

            return causal_conv1d(x=qkv, weight=weight.squeeze(1), activation="silu")[0]
        qkv = qkv.transpose(1, 2)
        T = x.shape[1]
        if cache is not None:
            # the cache hands back the last W inputs of the previous call in front of the new ones
            qkv = cache.update_conv_state(qkv, self.layer_idx, conv_kernel_size=self.conv_size)
        return causal_depthwise_conv(qkv, weight)[..., -T:].transpose(1, 2)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        B, T, _ = x.shape
        if attention_mask is not None:
            # Zeroed inputs give k = v = 0 at padding, so (left) padding never reaches the state.
            x = x * attention_mask[:, -T:, None].to(x.dtype)
        has_state = cache is not None and cache.has_previous_state(self.layer_idx)
        q, k, v = self._short_conv(x, cache).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = (t.reshape(B, T, self.num_heads, self.head_k_dim) for t in (q, k))
        v = v.reshape(B, T, self.num_heads, self.head_v_dim)
        state = cache.layers[self.layer_idx].recurrent_states[0] if has_state else None
        o, final = self._rule(x, q, k, v, state, output_final_state=cache is not None)
        if cache is not None:
            cache.update_recurrent_state(final, self.layer_idx)
        gate = self._output_gate(x).reshape(B, T, self.num_heads, self.head_v_dim)
        o = self.o_norm(o.to(x.dtype), gate)
        return self.o_proj(o.reshape(B, T, self.value_dim))


class GatedDeltaNet(DeltaRuleMixer):
    """The GDN mixer; see the module docstring. ``forward(x, attention_mask, cache)`` returns ``(B, T, hidden)``."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        expand_v: float = 2.0,
        conv_size: int = 4,
        norm_eps: float = 1e-5,
        layer_idx: int = 0,
    ):
        super().__init__()
        self._init_qkv(hidden_size, num_heads, head_dim, expand_v, conv_size, layer_idx)
        self.a_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(num_heads))
        self.dt_bias = nn.Parameter(torch.zeros(num_heads))
        self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.o_norm = GatedRMSNorm(self.head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.A_log._no_weight_decay = self.dt_bias._no_weight_decay = True
        if not self.A_log.is_meta:
            self.reset_mixer_parameters()

    def reset_mixer_parameters(self, copy_=copy_into) -> None:
        """Draw the gate parameters afresh (the linear layers get the model's normal init). The model passes
        transformers' ``init.copy_``, which leaves weights loaded from a checkpoint alone."""
        A_log, dt_bias = gate_init(self.num_heads)
        copy_(self.A_log, A_log)
        copy_(self.dt_bias, dt_bias)

    def _output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return self.g_proj(x)

    def _rule(self, x, q, k, v, state, output_final_state: bool):
        a, b = self.a_proj(x), self.b_proj(x)
        if gdn_backend(x) == "fla":
            return self._fla_rule(q, k, v, a, b, state, output_final_state)
        return chunk_gated_delta_rule(
            l2_normalize(q.float()), l2_normalize(k.float()), v, gdn_gate(a, self.A_log, self.dt_bias),
            b.float().sigmoid(), initial_state=state,
        )
    def _fla_rule(self, q, k, v, a, b, state, output_final_state: bool):
        """fla's kernels with gate, beta sigmoid and q/k L2 norm fused in, as ``fla.layers.GatedDeltaNet`` calls them."""
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent
        except ImportError as err:
            raise ImportError(f"the fla GDN backend needs flash-linear-attention: {err}") from err

        decoding = not torch.is_grad_enabled() and q.shape[1] <= 64
        kernel = fla_recurrent if decoding else fla_chunk
        o, final = kernel(
            q=q, k=k, v=v, g=a, beta=b, initial_state=state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True,
            A_log=self.A_log, dt_bias=self.dt_bias,
        )
        return o, final
