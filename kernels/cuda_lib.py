"""ctypes binding of ``libdm_attn_sm90.so`` (the CUDA C++ kernels, ``kernels/cuda/``) and torch wrappers of its entry
points.

The library is plain ``extern "C"`` with the CUDA runtime linked statically (``cuda_build``), so it loads under any
torch: no torch C++ ABI is involved. Its runtime shares the driver's primary context with torch, so torch's pointers
and streams are valid in it; every call passes the tensor's device and ``torch.cuda.current_stream(device)``, so the
kernels run in order with the caller's torch work.

``load()`` never raises: it returns the library and an empty reason, or ``None`` and why it cannot be used (the file
is missing, it does not load, its ABI version differs, no CUDA GPU, not sm90). Importing this module does nothing.
The wrappers check shapes, dtypes, devices and layout first (``ValueError``), then need the library (``RuntimeError``
with the reason).

Primitives (M1 of kernels/CUDA_BACKWARD.md), on E4M3 codes given as ``torch.float8_e4m3fn`` or ``uint8`` tensors:

- ``wgmma_ss_tile(a [64, 128], b [N, 128])`` → ``a @ b.T`` in FP32 [64, N] by one warpgroup's wgmma, both operands
  from shared memory (N = 64 or 128; ``swizzle=False`` lays them out without the 128-byte swizzle, N = 64 only);
- ``wgmma_rs_tile`` → the same with ``a`` from registers (``from_accumulator=True``: loaded in FP32-accumulator order
  and permuted into the A fragment, as P and dS will be);
- ``quantize_e4m3(x, mul)`` → ``e4m3(x * mul)`` with ``cvt.rn.satfinite`` (saturating at ±448; ``kernels/cuda/quant.cuh``).
"""

import ctypes
import functools
import os
from pathlib import Path

import torch

from deltamatch.kernels.cuda_build import BUILD_DIR, LIBRARY

ABI_VERSION = 1
"""Must equal ``dm_attn_sm90_abi_version()`` in ``kernels/cuda/primitives.cu``."""
LIBRARY_ENV = "DELTAMATCH_CUDA_LIB"
"""Environment variable naming the library to load (default ``build/cuda/libdm_attn_sm90.so``)."""
TILE_M, TILE_K = 64, 128
TILE_N = (64, 128)
_P, _I, _I64, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
SIGNATURES = {
    "dm_attn_sm90_abi_version": ((), _I),
    "dm_attn_sm90_error_string": ((_I,), ctypes.c_char_p),
    "dm_wgmma_ss_tile": ((_P, _P, _P, _I, _I, _I, _P), _I),
    "dm_wgmma_rs_tile": ((_P, _P, _P, _I, _I, _I, _P), _I),
    "dm_quant_e4m3_launch": ((_P, _P, _I64, _F, _I, _P), _I),
}


def library_path() -> Path:
    return Path(os.environ.get(LIBRARY_ENV) or BUILD_DIR / LIBRARY)


@functools.cache
def _open(path: str) -> tuple[ctypes.CDLL | None, str]:
    if not os.path.exists(path):
        return None, f"{path} is missing: build it with dm-cuda-build (needs nvcc 13)"
    try:
        lib = ctypes.CDLL(path)
        for name, (args, result) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, result
    except (OSError, AttributeError) as err:
        return None, f"cannot load {path}: {err}"
    if (found := lib.dm_attn_sm90_abi_version()) != ABI_VERSION:
        return None, f"{path} has ABI version {found}, this code needs {ABI_VERSION}: rebuild it (dm-cuda-build)"
    return lib, ""


def load(path: str | os.PathLike | None = None) -> tuple[ctypes.CDLL | None, str]:
    """The library and ``""``, or ``None`` and the reason it cannot run here. Never raises."""
    lib, reason = _open(str(path or library_path()))
    if reason:
        return None, reason
    if not torch.cuda.is_available():
        return None, "no CUDA GPU (torch.cuda.is_available() is False)"
    if (cap := torch.cuda.get_device_capability()) != (9, 0):
        return None, f"the kernels are built for sm_90a only; this GPU is sm_{cap[0]}{cap[1]}"
    return lib, ""


def _library() -> ctypes.CDLL:
    lib, reason = load()
    if lib is None:
        raise RuntimeError(f"the CUDA kernels cannot run: {reason}")
    return lib


def _call(lib: ctypes.CDLL, name: str, *args) -> None:
    if err := getattr(lib, name)(*args):
        raise RuntimeError(f"{name}: CUDA error {err} ({lib.dm_attn_sm90_error_string(err).decode()})")


def _codes(name: str, t: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """``t`` as uint8 codes after checking it is an E4M3 tensor on a CUDA device, contiguous and 16-byte aligned."""
    if t.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise ValueError(f"{name}: dtype {t.dtype}, expected torch.float8_e4m3fn or uint8 E4M3 codes")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {shape}")
    if t.device.type != "cuda":
        raise ValueError(f"{name}: on {t.device}, expected a CUDA tensor")
    if not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(f"{name}: must be contiguous and 16-byte aligned")
    return t.view(torch.uint8)


def _tile_operands(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if b.dim() != 2 or b.shape[0] not in TILE_N:
        raise ValueError(f"b: shape {tuple(b.shape)}, expected (N, {TILE_K}) with N in {TILE_N}")
    a8, b8 = _codes("a", a, (TILE_M, TILE_K)), _codes("b", b, (b.shape[0], TILE_K))
    if a.device != b.device:
        raise ValueError(f"a on {a.device} and b on {b.device}: expected one device")
    return a8, b8, torch.empty(TILE_M, b.shape[0], dtype=torch.float32, device=a.device)


def _launch_args(t: torch.Tensor) -> tuple[int, int]:
    return t.device.index, torch.cuda.current_stream(t.device).cuda_stream


def wgmma_ss_tile(a: torch.Tensor, b: torch.Tensor, swizzle: bool = True) -> torch.Tensor:
    """``a [64, 128] @ b [N, 128]ᵀ`` in FP32 by FP8 wgmma with both operands in shared memory."""
    a8, b8, c = _tile_operands(a, b)
    if not swizzle and b.shape[0] != 64:
        raise ValueError("swizzle=False is built for N = 64 only")
    _call(_library(), "dm_wgmma_ss_tile", a8.data_ptr(), b8.data_ptr(), c.data_ptr(), b.shape[0], int(swizzle),
          *_launch_args(c))
    return c


def wgmma_rs_tile(a: torch.Tensor, b: torch.Tensor, from_accumulator: bool = False) -> torch.Tensor:
    """``a [64, 128] @ b [N, 128]ᵀ`` in FP32 by FP8 wgmma with ``a`` in registers (``from_accumulator``: permuted from
    the accumulator's register order)."""
    a8, b8, c = _tile_operands(a, b)
    _call(_library(), "dm_wgmma_rs_tile", a8.data_ptr(), b8.data_ptr(), c.data_ptr(), b.shape[0],
          int(from_accumulator), *_launch_args(c))
    return c


def quantize_e4m3(x: torch.Tensor, mul: float = 1.0) -> torch.Tensor:
    """``e4m3(x · mul)`` (RNE, saturating to ±448, NaN stays NaN) as a ``torch.float8_e4m3fn`` tensor of x's shape."""
    if x.dtype != torch.float32:
        raise ValueError(f"x: dtype {x.dtype}, expected torch.float32")
    if x.device.type != "cuda" or not x.is_contiguous():
        raise ValueError(f"x: on {x.device}, contiguous {x.is_contiguous()}: expected a contiguous CUDA tensor")
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    _call(_library(), "dm_quant_e4m3_launch", x.data_ptr(), codes.data_ptr(), x.numel(), float(mul),
          *_launch_args(x))
    return codes.view(torch.float8_e4m3fn)
