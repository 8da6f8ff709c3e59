"""The one loader of Gyre's configs: a TOML table into a typed dataclass.

Every config (``gyre train``, ``gyre simulate``, ``gyre bench``) is nested dataclasses
with a docstring per field. :func:`from_dict` fills one from a parsed TOML table,
refusing an unknown key or a wrong type with the dotted key named; :class:`ConfigError`
is the one error a bad config raises.

A field's class is its annotation, unless the table being read decides it: a dataclass
may define a classmethod ``config_types(data) -> {dotted field path: class}``, called with
the raw table before any of its fields is built. That gives a field whose class depends
on another key (a trainer's options on the run's ``backend``), or whose class lives in a
heavy module imported only when a config is read (its annotation is then only for type
checkers). The hook may also refuse the table with a ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
import typing


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and the cause."""


def from_dict(cls, data: dict, where: str = "", *, field_types: dict | None = None):
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types.

    ``field_types``: classes of fields below ``cls`` by dotted path (``{"optim": X}``,
    ``{"algorithm.optim": X}``), over their annotations and over ``cls.config_types``;
    a field so typed is built even when ``data`` leaves it out (from an empty table), so
    that its defaults are the chosen class's."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a table, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise ConfigError(f"unknown key {key!r}; known keys here: {sorted(fields)}")
    hook = getattr(cls, "config_types", None)
    chosen = {**(hook(data) if hook is not None else {}), **(field_types or {})}
    for path in chosen:
        name = path.split(".", 1)[0]
        if name in fields and name not in data:
            data = {**data, name: {}}
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        below = {p.split(".", 1)[1]: c for p, c in chosen.items() if p.startswith(f"{name}.")}
        tp = chosen[name] if name in chosen else _field_type(cls, name)
        kwargs[name] = _coerce(tp, value, key, below)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def _field_type(cls, name: str):
    """The annotation of field ``name``, from the class that declares it last (as
    ``typing.get_type_hints``, but one field at a time: a field whose class a
    ``config_types`` hook gives may be annotated with a name only type checkers see)."""
    for base in cls.__mro__:
        annotations = inspect.get_annotations(base)
        if name in annotations:
            tp = annotations[name]
            if isinstance(tp, str):
                module = sys.modules.get(base.__module__)
                tp = eval(tp, dict(vars(module)) if module else {}, dict(vars(base)))
            return tp
    raise ConfigError(f"{cls.__name__}.{name}: no annotation")


def _coerce(tp, value, key: str, below: dict | None = None):
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key, field_types=below)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key} must be one of {typing.get_args(tp)}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be a list, got {type(value).__name__} {value!r}")
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        items = [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)] if args else value
        return origin(items)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table, got {type(value).__name__} {value!r}")
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp in (int, str, bool):
        if type(value) is not tp:
            raise ConfigError(f"{key} must be {tp.__name__}, got {type(value).__name__} {value!r}")
        return value
    return value


def build(cls, data: dict, where: str):
    """``from_dict`` with any TypeError/ValueError of ``cls`` itself as a ConfigError
    naming ``where``."""
    try:
        return from_dict(cls, data, where)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e
