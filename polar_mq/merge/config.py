"""Builder config validation: a typo in a task's ``builder.config`` must fail loudly and name the
key, not silently fall back to a default that produces a different trajectory."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union

C = TypeVar("C")


def parse_config(cls: type[C], data: Any, *, builder: str) -> C:
    """Build a ``cls`` dataclass from ``data`` (None, an instance, or a mapping), checking keys and
    types. Raises ValueError naming the builder and the offending key."""
    if data is None:
        return cls()
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ValueError(
            f"builder {builder!r}: config must be a mapping, got {type(data).__name__}"
        )
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key, value in data.items():
        if key not in known:
            raise ValueError(
                f"builder {builder!r}: unknown config key {key!r} "
                f"(known keys: {', '.join(known) or 'none'})"
            )
        if not _matches(value, hints[key]):
            raise ValueError(
                f"builder {builder!r}: config key {key!r} must be {_describe(hints[key])}, "
                f"got {type(value).__name__} {value!r}"
            )
    try:
        return cls(**dict(data))
    except (TypeError, ValueError) as exc:  # __post_init__ range checks
        raise ValueError(f"builder {builder!r}: {exc}") from None


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint))
