"""Resolve `package.module:Name` references: how builders, graders, runtimes and harnesses are
named by configuration (built-ins map to one, users pass their own)."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(spec: str) -> Any:
    """The object `spec` names ("pkg.module:Class" or "pkg.module:Class.attr"); a ValueError
    that says what could not be found otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form 'module:Name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attr!r}") from None
    return obj
