"""Cheap value coercion for the command line's plain options, so a run does not import pydantic.

Typer ≥ 0.29 coerces every option value through a pydantic TypeAdapter built on first use: importing pydantic
and building the adapters of `analyze`'s options costs ~0.25 s, longer than parsing a 15 MB trace's events.
Our options are plain: text, paths, flags, integers and decimals within a range, and lists of paths. For those
`get_runtime_param` is replaced by a coercion that converts a value the way typer's adapter does when the
value is an ordinary one (digits for an integer, a plain decimal for a float, a non-empty path, any text) and
hands every other value (a sign, an exponent, `nan`, a value out of range, an empty path, a non-string) to
typer's own coercion, which then gives typer's own result or error message. tests/test_cli_fastparams.py
compares the two on every option of every command.

A typer without `_TyperParameter.get_runtime_param` (before 0.29: click types, no pydantic) is left alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

_INT = re.compile(r"[0-9]{1,18}")
_FLOAT = re.compile(r"[0-9]{1,15}(?:\.[0-9]{0,15})?|\.[0-9]{1,15}")
_DECLINE = object()  # the value is not plain: typer's own coercion decides


def _leaf(annotation: Any, info: Any):
    """A converter str -> value (or _DECLINE) for a plain annotation, or None when the annotation is not plain."""
    if info.parser is not None or getattr(info, "click_type", None) is not None:
        return None
    if annotation is str:
        return lambda v, param, ctx: v if type(v) is str else _DECLINE
    if annotation is bool:
        return lambda v, param, ctx: v if type(v) is bool else _DECLINE
    if annotation in (int, float):
        if info.clamp:
            return None
        lo, hi = info.min, info.max
        pattern = _INT if annotation is int else _FLOAT

        def number(v, param, ctx):
            if type(v) is not str or not pattern.fullmatch(v):
                return _DECLINE
            x = annotation(v)
            if (lo is not None and x < lo) or (hi is not None and x > hi):
                return _DECLINE
            return x

        return number
    if annotation is Path and info.path_type is None and not info.allow_dash:
        from typer._param_types import coerce_cli_path

        def path(v, param, ctx):
            if type(v) is not str or not v or "\x00" in v:
                return _DECLINE
            return coerce_cli_path(Path(v), info, path_type=Path, param=param, ctx=ctx)

        return path
    return None


def _converter(descriptor: Any):
    if descriptor.file_annotation is not None:
        return None
    annotation, info = descriptor.annotation, descriptor.parameter_info
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        one = _leaf(item, info)
        if one is None:
            return None

        def many(v, param, ctx):
            if not isinstance(v, (list, tuple)):
                return _DECLINE
            out = [one(x, param, ctx) for x in v]
            return _DECLINE if any(x is _DECLINE for x in out) else out

        return many
    return _leaf(annotation, info)


def install() -> None:
    """Give typer's parameters the cheap coercion where their annotation is plain (idempotent)."""
    try:
        from typer import _coercion, core
    except ImportError:  # an older typer: click's own types, nothing to do
        return
    cls = getattr(core, "_TyperParameter", None)
    build = getattr(_coercion, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if cls is None or build is None or base is None or getattr(cls, "_tracediag_fast", False):
        return
    original = cls.get_runtime_param

    class _Plain(base):
        """Converts plain values itself; any other value goes to typer's own coercion of the parameter."""

        def __init__(self, descriptor: Any, convert) -> None:
            object.__setattr__(self, "parameter_info", descriptor.parameter_info)
            object.__setattr__(self, "annotation", descriptor.annotation)
            object.__setattr__(self, "_descriptor", descriptor)
            object.__setattr__(self, "_convert", convert)
            object.__setattr__(self, "_typer", None)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            out = self._convert(value, param, ctx)
            if out is not _DECLINE:
                return out
            if self._typer is None:
                object.__setattr__(self, "_typer", build(self._descriptor))
            return self._typer._coerce_value(value, param=param, ctx=ctx)

    def get_runtime_param(self):
        if self._runtime_param is None:
            convert = _converter(self.type_descriptor)
            if convert is not None:
                self._runtime_param = _Plain(self.type_descriptor, convert)
        return original(self)

    cls.get_runtime_param = get_runtime_param
    cls._tracediag_fast = True
