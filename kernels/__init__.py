"""deltamatch.kernels: FP8 attention numerics (reference and Hopper kernels), backends and residual measures.

``from deltamatch.kernels import dm_attn_func`` is the public entry point; kernels/README.md is the numerics spec.
"""

from deltamatch.kernels.api import dm_attn_func
from deltamatch.kernels.backends import register_backend, use_backend
from deltamatch.methods import METHODS, AttentionMethod, get_method, public_methods

PUBLIC_MODES = public_methods()
"""What a user may ask ``dm_attn_func`` for (the registry's public methods, ``deltamatch.methods``)."""

__all__ = ["METHODS", "PUBLIC_MODES", "AttentionMethod", "dm_attn_func", "get_method", "register_backend", "use_backend"]
