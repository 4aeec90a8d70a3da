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
  form, ``T = (I + tril(diag(beta) K K^T * Gamma, -1))^-1``, by forward substitution), so only the chunk-to-chunk
  state update is a Python loop. It is checked against fla's ``naive_recurrent_gated_delta_rule`` (outputs and all
  gradients) in the tests, on random inputs and on inputs like training's (keys that correlate, beta near 1).

The recurrent state is stored K-first, ``(B, H, K, V)``, as fla's naive reference and its kernels' default layout.
"""

import contextlib
import math
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .fla_hopper import fla_installed, training_backend
from .norm import GatedRMSNorm

_PINNED = threading.local()
BACKENDS = ("fla", "torch")


def gdn_backend(x: torch.Tensor, head_k_dim: int, mixer: str = "gdn") -> str:
    """The recurrence implementation for inputs like ``x``: the pinned one, else fla's kernels on CUDA when no
    gradient is needed, else what :func:`~deltamatch.models.layers.fla_hopper.training_backend` decides for this
    head dim (fla where its backward is trusted, else torch)."""
    pinned = getattr(_PINNED, "name", None)
    if pinned is not None:
        return pinned
    if x.is_cuda and not torch.is_grad_enabled() and fla_installed():
        return "fla"
    return training_backend(x.device, head_k_dim, mixer)[0]


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
    """Log-decay per token and head, ``-exp(A_log) * softplus(a + dt_bias)``, in FP32 (FP64 for FP64 inputs)."""
    dtype = torch.promote_types(a.dtype, torch.float32)
    return -A_log.to(dtype).exp() * F.softplus(a.to(dtype) + dt_bias.to(dtype))


def unit_lower_inverse(strict: torch.Tensor, block: int = 16) -> torch.Tensor:
    """``(I + A)^-1`` for strictly lower-triangular ``A (..., C, C)``, by blocked forward substitution.

    Forward substitution is backward stable: its error stays at FP32 round-off wherever the inverse itself is well
    scaled, which it is for the delta rule (entries of beta K K^T are cosines times beta <= 1). A power series in A
    (e.g. ``prod_i (I + (-A)^(2^i))``) is exact in theory but not in FP32: when the keys of a chunk correlate, the
    powers of A grow combinatorially (A^k holds binomial coefficients when all keys align) and cancel, so its error
    reached 1e-3 at cosine 0.5 and 1e8 at cosine 0.9 for C = 64 — and training makes keys correlate.

    Layout as in fla's kernels: the ``block x block`` diagonal blocks by row substitution (``block - 1`` batched
    mat-vecs for all blocks at once), then each block row below from the rows above with two matmuls. The backward
    is analytic (two matmuls), see :class:`_UnitLowerInverse`.
    """
    return _UnitLowerInverse.apply(strict, block)


def _solve_unit_lower(strict: torch.Tensor, block: int) -> torch.Tensor:
    C = strict.shape[-1]
    pad = (-C) % block
    a = F.pad(strict, (0, pad, 0, pad))  # zero rows/columns: an identity block, cropped away at the end
    n_blocks = a.shape[-1] // block
    blocks = [slice(i * block, (i + 1) * block) for i in range(n_blocks)]
    diag = torch.stack([a[..., b, b] for b in blocks], dim=-3)  # (..., n_blocks, block, block)
    x_diag = torch.eye(block, dtype=a.dtype, device=a.device).expand_as(diag).clone()
    for r in range(1, block):  # row r of a unit-lower inverse: X[r, :r] = -A[r, :r] X[:r, :r]
        x_diag[..., r, :r] = -(diag[..., r : r + 1, :r] @ x_diag[..., :r, :r]).squeeze(-2)
    inverse = torch.zeros_like(a)
    for i, rows in enumerate(blocks):
        inverse[..., rows, rows] = x_diag[..., i, :, :]
        if i:  # X[i, :i] = -X_ii (A[i, :i] X[:i, :i]): the rows above are final
            left = slice(0, rows.start)
            inverse[..., rows, left] = -x_diag[..., i, :, :] @ (a[..., rows, left] @ inverse[..., left, left])
    return inverse[..., :C, :C]


class _UnitLowerInverse(torch.autograd.Function):
    """``X = (I + A)^-1`` with ``dX = -X dA X``, so ``dL/dA = -(X^T G X^T)`` restricted to the strict lower part."""

    @staticmethod
    def forward(ctx, strict: torch.Tensor, block: int) -> torch.Tensor:
        inverse = _solve_unit_lower(strict, block)
        ctx.save_for_backward(inverse)
        return inverse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        inverse_t = inverse.transpose(-1, -2)
        return -(inverse_t @ grad @ inverse_t).tril(-1), None


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

    Returns ``o (B, T, H, V)`` and the final state ``(B, H, K, V)``, both in FP32 (FP64 when k is FP64: the GPU
    tests use the twin in FP64 as the reference for fla's kernels). q and k are used as given (normalise them first).
    Padding at the end of the last chunk has beta = k = 0, so it never touches the state.
    """
    # FP32 means FP32 under the trainer's bf16 autocast too: the WY inverse and the chunk-to-chunk state
    # recurrence lose too much in BF16 matmuls (fla's kernels accumulate these in FP32 as well).
    with torch.autocast(k.device.type, enabled=False):
        return _chunk_rule(q, k, v, g, beta, scale, initial_state, chunk_size)


def _chunk_rule(q, k, v, g, beta, scale, initial_state, chunk_size):
    B, T, H, K = k.shape
    scale = K**-0.5 if scale is None else scale
    dtype = torch.promote_types(k.dtype, torch.float32)
    C = min(chunk_size, T)
    pad = (-T) % C
    q, k, v, g, beta = (
        F.pad(x.to(dtype).transpose(1, 2), (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
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

    state = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
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

    mixer_kind = "gdn"  # for the backend decision; KDA overrides it

    def _backend(self, x: torch.Tensor) -> str:
        return gdn_backend(x, self.head_k_dim, self.mixer_kind)

    def _short_conv(self, x: torch.Tensor, cache) -> torch.Tensor:
        """q/k/v short convolutions as one depthwise conv over the concatenated channels; updates the conv cache."""
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight], dim=0)
        if cache is None and self._backend(x) == "fla":  # training and plain forwards: fla's fused Triton conv
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
        if self._backend(x) == "fla":
            return self._fla_rule(q, k, v, a, b, state, output_final_state)
        q, k, b = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q, k, b))
        return chunk_gated_delta_rule(
            l2_normalize(q), l2_normalize(k), v, gdn_gate(a, self.A_log, self.dt_bias), b.sigmoid(),
            initial_state=state,
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
