"""deltamatch.kernels: FP8 attention numerics (reference and Hopper kernels), backends and residual measures.

``from deltamatch.kernels import dm_attn_func`` is the public entry point; kernels/README.md is the numerics spec.
"""

from deltamatch.kernels.api import dm_attn_func
from deltamatch.kernels.backends import register_backend, use_backend
from deltamatch.kernels.methods import METHODS, PUBLIC_MODES, AttentionMethod, get_method

__all__ = ["METHODS", "PUBLIC_MODES", "AttentionMethod", "dm_attn_func", "get_method", "register_backend", "use_backend"]
