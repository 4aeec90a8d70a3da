"""fla's autotuned Triton kernels: recorded launch choices (pins), and narrowed autotuning for tests.

fla autotunes most kernels over many launch configs (up to 36 each). On a fresh machine the first training step
compiles and times all of them — about 4 minutes for the 569M hybrid on an H200 — and the winner may differ from run
to run, so two runs of one model need not execute the same kernels. A *pin file* records the choices an autotuning
run made (kernel, tuning key, config), for one fla / Triton / GPU combination; :func:`apply_pins` hands them to the
autotuners before the first call, so those keys skip autotuning (one config compiled per kernel) and every run of
that combination launches exactly the configs that were recorded — the configs the GPU tests verified, where the
tests ran at the recorded keys. Keys not in the file autotune as usual.

Pin files live in ``models/train/fla_pins/``, named by GPU (``NVIDIA_H200.json``), and are written on the GPU by
``tools/device/profile_step.py ... --pins FILE`` after training steps at the shapes the harness trains.
``DELTAMATCH_FLA_PINS=0`` turns them off.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import re
import sys
from pathlib import Path

PINS_DIR = Path(__file__).resolve().parent / "fla_pins"
ENV_SWITCH = "DELTAMATCH_FLA_PINS"
PINNED_PACKAGES = ("fla.ops", "fla.modules")


def autotuner_of(value):
    """The Triton autotuner inside ``value`` (through ``heuristics`` wrappers), or None if it holds none."""
    while value is not None and not hasattr(value, "configs") and hasattr(value, "fn"):
        value = value.fn
    return value if hasattr(value, "configs") and hasattr(value, "cache") else None


def loaded_autotuners(*packages: str) -> dict[str, object]:
    """``{"module:function": autotuner}`` for every autotuned kernel in the loaded modules of ``packages`` (each
    package is imported first, which loads the modules its ops call), named by the module that defines it."""
    for package in packages:
        importlib.import_module(package)
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not any(name == p or name.startswith(f"{p}.") for p in packages):
            continue
        for value in list(vars(module).values()):
            tuner = autotuner_of(value)
            if tuner is not None:
                fn = tuner.base_fn  # named where it is defined, however many modules re-export it
                found[f"{fn.__module__}:{fn.__name__}"] = tuner
    return dict(sorted(found.items()))


# Each autotuner's own configs while a narrowing holds it (by id): a narrowing inside another chooses from all of a
# kernel's configs, not from what the outer one left.
_OWN_CONFIGS: dict[int, list] = {}


def own_configs(tuner) -> list:
    """All of ``tuner``'s configs, also inside a narrowing."""
    return _OWN_CONFIGS.get(id(tuner), tuner.configs)


@contextlib.contextmanager
def _narrowed(tuners: list, choose, keep_choices: bool = False):
    """Inside the block each autotuner tries only ``choose(all its configs)``; its earlier choices are forgotten
    unless ``keep_choices`` (then keys it already chose, pinned ones too, keep their config). Both are restored
    after."""
    saved = [(t.configs, dict(t.cache), id(t) in _OWN_CONFIGS) for t in tuners]
    try:
        for tuner in tuners:
            tuner.configs = choose(_OWN_CONFIGS.setdefault(id(tuner), tuner.configs))
            if not keep_choices:
                tuner.cache.clear()
        yield
    finally:
        for tuner, (configs, cache, nested) in zip(tuners, saved):
            tuner.configs = configs
            if not keep_choices:
                tuner.cache.clear()
                tuner.cache.update(cache)
            if not nested:
                _OWN_CONFIGS.pop(id(tuner), None)


@contextlib.contextmanager
def restrict_warps(kernel, num_warps: int):
    """Autotune ``kernel`` over its configs with ``num_warps`` warps only inside the block (all of them, also inside
    a :func:`narrow_autotuning`): the tests check each warp count a kernel may be tuned to."""
    tuner = autotuner_of(kernel)
    if not any(c.num_warps == num_warps for c in own_configs(tuner)):
        raise ValueError(f"{getattr(tuner, 'kernel_name', kernel)} has no config with {num_warps} warps")
    with _narrowed([tuner], lambda configs: [c for c in configs if c.num_warps == num_warps]):
        yield


@contextlib.contextmanager
def narrow_autotuning(*packages: str, num_warps: int = 4, max_stages: int = 2, keep_choices: bool = False):
    """Inside the block, every autotuned kernel loaded from ``packages`` (e.g. ``"fla.ops.kda"``) tries only its
    configs with ``num_warps`` warps (if it has any), and of those the ones with at most ``max_stages`` stages (if any);
    yields how many kernels it narrowed.

    A correctness test needs a valid config, not the fastest: fla's kernels autotune over up to 36 configs each, and
    compiling them all for every shape a test uses takes longer than the GPU suite may (its 2026-12-01 runs stopped
    in fla's autotuning). Choices made before the block are forgotten inside it and restored after, unless
    ``keep_choices`` (the GPU suite's narrowing keeps pinned choices, so tests at training's keys run the pinned
    configs)."""
    tuners = list(loaded_autotuners(*packages).values())
    if not tuners:
        raise ValueError(f"no autotuned kernels loaded in {', '.join(packages)}")

    def choose(configs):
        configs = [c for c in configs if c.num_warps == num_warps] or configs
        return [c for c in configs if c.num_stages <= max_stages] or configs

    with _narrowed(tuners, choose, keep_choices):
        yield len(tuners)


def _config_record(config) -> dict:
    if config.pre_hook is not None:
        raise ValueError(f"config {config} has a pre_hook, which a pin file cannot record")
    return {"kwargs": dict(config.kwargs), "num_warps": config.num_warps, "num_stages": config.num_stages,
            "num_ctas": config.num_ctas, "maxnreg": config.maxnreg}


def versions() -> dict[str, str]:
    """The combination a pin file is valid for."""
    import fla
    import torch
    import triton

    return {"fla": fla.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name(0)}


def record_choices(tuners: dict[str, object]) -> dict[str, list[dict]]:
    """What autotuning chose so far: ``{kernel: [{"key": [...], "config": {...}}, ...]}``."""
    return {name: [{"key": list(key), "config": _config_record(config)} for key, config in tuner.cache.items()]
            for name, tuner in sorted(tuners.items()) if tuner.cache}


def pin_choices(tuners: dict[str, object], kernels: dict[str, list[dict]]) -> int:
    """Give each autotuner the recorded choices of its kernel (keys it already chose keep their choice); returns how
    many choices were pinned. A kernel of the file that is not loaded is skipped (another fla build)."""
    import triton

    pinned = 0
    for name, entries in kernels.items():
        tuner = tuners.get(name)
        if tuner is None:
            continue
        for entry in entries:
            key = tuple(entry["key"])
            if key not in tuner.cache:
                record = entry["config"]
                tuner.cache[key] = triton.Config(dict(record["kwargs"]), num_warps=record["num_warps"],
                                                 num_stages=record["num_stages"], num_ctas=record["num_ctas"],
                                                 maxnreg=record["maxnreg"])
                pinned += 1
    return pinned


def pin_file(gpu_name: str) -> Path:
    return PINS_DIR / f"{re.sub(r'[^0-9A-Za-z]+', '_', gpu_name).strip('_')}.json"


@functools.cache
def apply_pins() -> str:
    """Pin this GPU's recorded choices into fla's autotuners (once per process); returns a line for the log."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"fla autotuning: pins off ({ENV_SWITCH}=0)"
    now = versions()
    path = pin_file(now["gpu"])
    if not path.exists():
        return f"fla autotuning: no pin file for {now['gpu']} ({path.name}); autotuning as usual"
    data = json.loads(path.read_text())
    recorded = {k: data.get(k) for k in now}
    if recorded != now:
        return f"fla autotuning: {path.name} was recorded for {recorded}, this is {now}; autotuning as usual"
    pinned = pin_choices(loaded_autotuners(*PINNED_PACKAGES), data["kernels"])
    return f"fla autotuning: {pinned} recorded choices pinned from {path.name} (recorded {data.get('recorded', '?')})"
