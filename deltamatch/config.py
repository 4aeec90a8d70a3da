"""The one YAML -> dataclass loader of the project: typed, every unknown key named.

``parse(cls, mapping)`` turns a YAML mapping into dataclass ``cls`` (nested dataclasses, lists, tuples, dicts,
``Literal``, unions with ``None``) and rejects what it cannot place: an unknown key or a value of the wrong type raises
``ValueError`` naming the dotted key (``optim.lr``), so a typo never silently falls back to a default; a dataclass's
``__post_init__`` checks what types cannot say (ranges, non-empty lists). ``load_yaml(cls, path)`` reads the file first.
The trainer (``dm-train``), the data build (``dm-prepare-data``) and the evaluation suites (``evals/suites/*.yaml``) read
their configs through it.

One YAML quirk is absorbed on purpose: PyYAML reads ``3e-4`` (no dot) as a string, so float fields accept strings that
``float()`` parses. Nothing else is coerced. A float must be finite: ``inf`` or ``nan`` (which YAML reads as ``.inf``,
``.nan``, and ``float()`` from ``"inf"``) is refused wherever a float is expected.

Standard library and PyYAML only: the workflow reads configs through it inside Snakemake's own process.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = ["load_with_flags", "load_yaml", "parse", "read_yaml"]




def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` as type ``tp`` or raise ``ValueError`` naming ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ValueError as err:
                errors.append(str(err))
        if len(errors) == 1:  # ``float | None``: the float's own message (e.g. not finite)
            raise ValueError(errors[0])
        raise ValueError(f"config key '{key}': expected {_type_name(tp)}, got {type(value).__name__} ({value!r})")
    if origin is Literal:
        if value not in args:
            raise ValueError(f"config key '{key}': expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"config key '{key}': expected a mapping, got {type(value).__name__}")
        return parse(tp, value, prefix=key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key '{key}': expected a list, got {type(value).__name__} ({value!r})")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ValueError(f"config key '{key}': expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        out = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"config key '{key}': expected a mapping, got {type(value).__name__} ({value!r})")
        return {str(k): _coerce(v, args[1] if args else Any, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"config key '{key}': expected bool, got {type(value).__name__} ({value!r})")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config key '{key}': expected int, got {type(value).__name__} ({value!r})")
        return value
    if tp is float:
        number = None
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        if number is None:
            raise ValueError(f"config key '{key}': expected float, got {type(value).__name__} ({value!r})")
        if not math.isfinite(number):
            raise ValueError(f"config key '{key}': expected a finite float, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"config key '{key}': expected str, got {type(value).__name__} ({value!r})")
        return value
    raise TypeError(f"config field '{key}' has unsupported annotation {tp!r}")


def parse(cls: type, mapping: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``mapping``; unknown or ill-typed keys raise ``ValueError`` naming the key."""
    mapping = {} if mapping is None else mapping
    if not isinstance(mapping, dict):
        raise ValueError(f"config section '{prefix or '<root>'}': expected a mapping, got {type(mapping).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in mapping:
        if key not in names:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise ValueError(f"unknown config key '{where}' (known keys: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in mapping.items()}
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        where = ", ".join(f"{prefix}.{m}" if prefix else m for m in missing)
        raise ValueError(f"missing required config key '{where}'")
    return cls(**kwargs)


def load_yaml(cls: type, path: str | Path) -> Any:
    """Read YAML file ``path`` and validate it into dataclass ``cls``."""
    return parse(cls, read_yaml(path))


def load_with_flags(cls: type, path: str | Path | None, flags: dict[str, Any]) -> Any:
    """Dataclass ``cls`` from the ``--config`` file ``path`` (if any) with the command-line ``flags`` the user set on
    top (a flag left at ``None`` keeps the file's value, or the field's default): every ``dm-*`` tool's one CLI style."""
    mapping = read_yaml(path) if path is not None else {}
    if not isinstance(mapping, dict):
        raise ValueError(f"config file {path}: expected a mapping at the top level, got {type(mapping).__name__}")
    config = parse(cls, mapping)
    # Flags arrive typed by argparse; the dataclass's own checks (__post_init__) judge them, in the flags' words.
    given = {k: tuple(v) if isinstance(getattr(config, k), tuple) and isinstance(v, list) else v
             for k, v in flags.items() if v is not None}
    return dataclasses.replace(config, **given) if given else config


def read_yaml(path: str | Path) -> Any:
    """The YAML document of ``path``; a missing, unreadable or malformed file is a ``ValueError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    try:
        with path.open() as fh:
            mapping = yaml.safe_load(fh)
    except yaml.YAMLError as err:
        raise ValueError(f"config file {path} is not valid YAML: {' '.join(str(err).split())}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"config file {path} cannot be read: {err}") from None
    return {} if mapping is None else mapping
