"""One registry of attention backends behind ``dm_attn_func``.

A backend is an object with

- ``name``: str
- ``supports(q, k, v, causal, mode) -> str | None``: ``None`` when it can run these inputs, else the reason it cannot;
- ``apply(q, k, v, causal, mode, softmax_scale) -> o``: autograd-capable attention in the public layout.

Backends are registered as factories (``"module:attr"`` strings are imported lazily), so importing this module never
imports Triton or cuDNN and never probes a device. ``dm_attn_func`` walks the registry in order and takes the first
backend that supports the inputs; ``use_backend(name)`` pins one (tests run the fast path and its slow twin this way).
When CUDA inputs end up on the reference simulation (O(N²) memory) because every fast backend declined them, a
one-time warning names the reasons.
"""

import contextlib
import importlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

_FACTORIES: dict[str, Callable[[], Any] | str] = {}
_INSTANCES: dict[str, Any] = {}
_PINNED = threading.local()
_WARNED: set[str] = set()


def register_backend(name: str, factory: Callable[[], Any] | str, *, first: bool = False) -> None:
    """Register ``factory`` (a callable or ``"module:attr"``) under ``name``; ``first`` puts it ahead of the others."""
    _INSTANCES.pop(name, None)
    if first:
        items = list(_FACTORIES.items())
        _FACTORIES.clear()
        _FACTORIES[name] = factory
        _FACTORIES.update((k, v) for k, v in items if k != name)
    else:
        _FACTORIES[name] = factory


def registered_backends() -> list[str]:
    return list(_FACTORIES)


def get_backend(name: str) -> Any:
    if name not in _FACTORIES:
        raise ValueError(f"unknown attention backend {name!r}; registered: {registered_backends()}")
    if name not in _INSTANCES:
        factory = _FACTORIES[name]
        if isinstance(factory, str):
            module, attr = factory.split(":")
            factory = getattr(importlib.import_module(module), attr)
        _INSTANCES[name] = factory()
    return _INSTANCES[name]


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Pin the backend ``dm_attn_func`` uses inside the block (``None`` restores automatic choice)."""
    if name is not None:
        get_backend(name)  # fail early on a bad name
    previous = getattr(_PINNED, "name", None)
    _PINNED.name = name
    try:
        yield
    finally:
        _PINNED.name = previous


def select_backend(q, k, v, causal: bool, mode: str) -> Any:
    """The backend that will run these inputs: the pinned one (which must support them) or the first that does."""
    pinned = getattr(_PINNED, "name", None)
    names = [pinned] if pinned is not None else registered_backends()
    reasons = []
    for name in names:
        try:
            backend = get_backend(name)
        except ImportError as exc:  # an optional backend whose library is missing
            reasons.append(f"{name}: unavailable ({exc})")
            continue
        reason = backend.supports(q, k, v, causal, mode)
        if reason is None:
            if name == "reference" and pinned is None and q.is_cuda:
                _warn_once(f"dm_attn_func: no fast backend runs mode={mode!r} on these CUDA inputs ("
                           + "; ".join(reasons) + "); using the reference simulation, which materialises the N×N "
                           "scores (O(N²) memory and time)")
            return backend
        reasons.append(f"{name}: {reason}")
    raise ValueError(f"no attention backend can run mode={mode!r} on these inputs: " + "; ".join(reasons))


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=4)


# Order matters: the Hopper kernels first, the reference simulation last (it supports everything valid).
register_backend("triton", "deltamatch.kernels.triton_attention:TritonBackend")
register_backend("cudnn", "deltamatch.kernels.cudnn_fp8:CudnnFP8Backend")
register_backend("sdpa", "deltamatch.kernels.sdpa_backend:SDPABackend")
register_backend("reference", "deltamatch.kernels.reference:ReferenceBackend")
