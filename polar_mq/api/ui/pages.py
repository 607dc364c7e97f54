"""The viewer's static files (`static/`: the page shell, its script and styles, the sign-in page)."""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"


def static_text(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")
