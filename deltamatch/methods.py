"""The attention methods the paper compares, as data: the one registry every method list in the project derives from.

Ground level (standard library only), so every stage may import it: the kernels (numerics and backends), the models
(config validation, model cards), the workflow (a config's ``methods`` are checked against it), the reports (row
order, labels) and the benchmarks. Nothing else spells out the list of methods.

A method is its numerics (FP8 or not, which δ its backward subtracts, how operands are scaled), its names (config name,
table label, one sentence for a model card), which ``dm_attn_func`` backends implement it, and whether a user may ask
for it. A method whose backends do not include ``reference`` names the reference method that simulates its numerics
(``simulated_by``): ``cudnn_fp8`` runs on cuDNN on Hopper and as ``cudnn_fp8_sim`` everywhere else.

Adding a method: one entry below; a method the reference runs needs nothing else unless its numerics are new (then the
reference, ``kernels/reference.py``, learns them). ``tests/test_methods.py`` checks that every consumer sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

DELTA_KINDS = ("stale", "consistent", "matched")
"""The δ a backward can subtract (BF16's exact δ is computed by the stale formula on unquantised numbers)."""
BACKENDS = ("triton", "cudnn", "sdpa", "reference")
"""``dm_attn_func`` backends (``deltamatch.kernels.backends`` registers them under these names)."""


@dataclass(frozen=True)
class AttentionMethod:
    name: str
    """Config name (``attn_method``, ``runs[].methods``, ``dm_attn_func(mode=...)``)."""
    fp8: bool
    """Whether the seven attention matmuls run on FP8 operands."""
    delta: str
    """Which δ the backward subtracts: ``exact`` (Σ dO·O on BF16 numbers), ``stale`` (Σ dO·O from the dO and O the
    backward receives: the input dO and BF16 O under block scales; the FP8 dÔ and E4M3 Ô under per-tensor scales, as
    cuDNN's FP8 backward forms it), ``consistent`` (Σ dÔ·O) or ``matched`` (Σ_j P dP̂)."""
    scaling: str
    """``block`` (the paper's Appendix B.6 block scales), ``tensor`` (per-tensor, cuDNN/TE) or ``none`` (BF16)."""
    label: str
    """Name used in tables and figures."""
    description: str
    """One or two sentences for a model card: what the method is."""
    backends: tuple[str, ...]
    """The ``dm_attn_func`` backends that implement it (names of ``BACKENDS``)."""
    public: bool = True
    """Whether a config or a user may name it (False: an internal numerics twin, e.g. a simulation)."""
    simulated_by: str | None = None
    """For a method the reference does not run itself: the reference method with its numerics."""
    dp_operands: str = "fp8"
    """Operands of dP = dO Vᵀ: ``fp8`` (dÔ and V̂, as the other six matmuls) or ``bf16`` (dO and V rounded to BF16,
    the paper's Appendix C.4 "BF16 dP" alternative: one matmul in BF16)."""
    p_encoding: str = "block"
    """How the forward's P is cast for O = P̂V̂: ``block`` (one scale per row and 64 keys) or ``row_max`` (the max-shift
    encoding of Appendix C.4: P / max_j P_ij, whose row maximum is 1, cast with the fixed scale that maps 1 to E4M3's
    448, and the row's max multiplied back onto O in FP32; dV's P̂ᵀ keeps its block scales) or ``running_max`` (the
    same against the running max a one-pass kernel holds when it casts each 64-key tile: the factored layout's)."""
    scale_layout: str = "tile"
    """Where the block scales sit: ``tile`` (the paper's Appendix B.6 layout, kernels/README.md: scales that vary
    along the contraction of five of the seven matmuls, so a kernel promotes every tile's product) or ``factored``
    (every operand's scale constant along its matmul's contraction, so a kernel applies it once after the
    accumulation: kernels/README.md, "A factored scale layout"). ``factored`` implies ``p_encoding="running_max"``."""

    def __post_init__(self) -> None:
        if self.delta not in ("exact", *DELTA_KINDS):
            raise ValueError(f"method {self.name!r}: unknown delta {self.delta!r}")
        if self.scaling not in ("block", "tensor", "none"):
            raise ValueError(f"method {self.name!r}: unknown scaling {self.scaling!r}")
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown or not self.backends:
            raise ValueError(f"method {self.name!r}: backends {list(self.backends)} must be some of {BACKENDS}")
        if ("reference" in self.backends) == (self.simulated_by is not None):
            raise ValueError(f"method {self.name!r}: exactly one of 'reference' in backends or simulated_by")
        if self.dp_operands not in ("fp8", "bf16") or self.p_encoding not in ("block", "row_max", "running_max"):
            raise ValueError(f"method {self.name!r}: dp_operands {self.dp_operands!r} must be fp8 or bf16, "
                             f"p_encoding {self.p_encoding!r} block, row_max or running_max")
        if self.scale_layout not in ("tile", "factored"):
            raise ValueError(f"method {self.name!r}: scale_layout {self.scale_layout!r} must be tile or factored")
        if (self.scale_layout == "factored") != (self.p_encoding == "running_max"):
            raise ValueError(f"method {self.name!r}: the factored layout, and only it, encodes P by its running max "
                             "(p_encoding running_max)")
        if (self.dp_operands, self.p_encoding, self.scale_layout) != ("fp8", "block", "tile") \
                and self.scaling != "block":
            raise ValueError(f"method {self.name!r}: dp_operands, p_encoding and scale_layout vary the block-scaled "
                             "FP8 numerics "
                             f"only (scaling {self.scaling!r})")

    @property
    def delta_kind(self) -> str:
        """The δ formula its backward uses (BF16's exact δ is FlashAttention's, i.e. the stale formula)."""
        return "stale" if self.delta == "exact" else self.delta


_BLOCK_FP8 = ("triton", "reference")

METHODS: dict[str, AttentionMethod] = {
    m.name: m
    for m in (
        AttentionMethod("bf16", False, "exact", "none", "BF16/FP32",
                        "BF16 operands with FP32 accumulation: the paper's mixed-precision reference.",
                        ("sdpa", "reference")),
        AttentionMethod("stale", True, "stale", "block", "naive FP8 (stale δ)",
                        "naive FP8: all seven attention matmuls in FP8 (E4M3, FP32 block scales), the softmax-gradient "
                        "δ from the saved BF16 output and the unquantised dO (FlashAttention's shortcut, stale under "
                        "FP8).", _BLOCK_FP8),
        AttentionMethod("consistent", True, "consistent", "block", "consistent-dO",
                        "FP8 attention with δ from the dequantised FP8 dO (the paper's consistent-dO ablation).",
                        _BLOCK_FP8),
        AttentionMethod("matched", True, "matched", "block", "Delta-Matching",
                        "Delta-Matching: FP8 attention whose δ_i = Σ_j P_ij dP̂_ij is recomputed from the unquantised P "
                        "and the FP32 products of the FP8 operands, so each row of dS sums to zero before its FP8 "
                        "cast.", _BLOCK_FP8),
        AttentionMethod("bf16_dp", True, "stale", "block", "BF16 dP (stale δ)",
                        "FP8 attention whose dP = dO Vᵀ runs on BF16 operands (the paper's Appendix C.4 alternative, "
                        "as this harness reads it): dP and the stale δ both see the unquantised dO, at the cost of "
                        "one BF16 matmul; the other six matmuls are FP8.", ("reference",), dp_operands="bf16"),
        AttentionMethod("maxshift", True, "stale", "block", "max-shift P (stale δ)",
                        "FP8 attention whose forward encodes P by its row maximum (the max-shift encoding of the "
                        "paper's Appendix C.4, as this harness reads it: P / max_j P_ij in E4M3 at a fixed scale, the "
                        "max multiplied back in FP32), with the stale δ.", ("reference",), p_encoding="row_max"),
        AttentionMethod("stale_factored", True, "stale", "block", "naive FP8, factored scales (stale δ)",
                        "naive FP8 (stale δ) under the factored scale layout proposed for a faster kernel: every "
                        "operand's scale constant along its matmul's contraction (per-channel V, dO, K and Q for the "
                        "key- and query-contracting products, P by its running max, dS per query row).",
                        ("reference",), p_encoding="running_max", scale_layout="factored"),
        AttentionMethod("matched_factored", True, "matched", "block", "Delta-Matching, factored scales",
                        "Delta-Matching under the factored scale layout, which lets the kernels accumulate FP8 "
                        "products in place (every operand's scale constant along its matmul's contraction); δ as in "
                        "Delta-Matching, from the FP32 products of the FP8 dÔ and V̂.", _BLOCK_FP8,
                        p_encoding="running_max",
                        scale_layout="factored"),
        AttentionMethod("cudnn_fp8", True, "stale", "tensor", "cuDNN/TE FP8",
                        "the cuDNN / Transformer Engine FP8 attention baseline (per-tensor scales).",
                        ("cudnn",), simulated_by="cudnn_fp8_sim"),
        AttentionMethod("cudnn_fp8_sim", True, "stale", "tensor", "cuDNN/TE FP8 (simulated)",
                        "the reference simulation of the cuDNN / Transformer Engine FP8 baseline's numerics.",
                        ("reference",), public=False),
    )
}


def public_methods() -> tuple[str, ...]:
    """Names a config or ``dm_attn_func`` user may ask for, in registry order."""
    return tuple(name for name, m in METHODS.items() if m.public)


def implemented_by(backend: str) -> tuple[str, ...]:
    """Names of the methods ``backend`` runs, in registry order."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
    return tuple(name for name, m in METHODS.items() if backend in m.backends)


def reference_twin(name: str) -> str:
    """The method whose numerics the reference runs for ``name`` (itself, or its ``simulated_by``)."""
    method = get_method(name)
    return method.simulated_by or method.name


def simulated_methods() -> tuple[str, ...]:
    """Every public method's reference twin: what a CPU experiment compares (the sweep, the reference benchmark)."""
    return tuple(dict.fromkeys(reference_twin(name) for name in public_methods()))


def get_method(name: str) -> AttentionMethod:
    """The method called ``name`` (any, public or not); ``ValueError`` naming the choices otherwise."""
    if name not in METHODS:
        raise ValueError(f"unknown attention method {name!r}; choose one of {sorted(METHODS)}")
    return METHODS[name]


def check_public(name: object, key: str = "attn_method") -> str:
    """``name`` if a config may name it, else ``ValueError`` naming the config ``key`` and the choices."""
    if not isinstance(name, str) or name not in METHODS or not METHODS[name].public:
        raise ValueError(f"config key {key}: unknown attention method {name!r}; choose one of {list(public_methods())}")
    return name
