"""Semantic versions: MAJOR.MINOR.PATCH with an optional -prerelease."""

import re

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?$")


def parse_version(text: str) -> tuple[int, int, int, str]:
    m = _VERSION.match(text.strip())
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4) or ""


def _pre_key(pre: str) -> tuple:
    # A release sorts after its prereleases; numeric identifiers sort numerically, before words.
    if not pre:
        return (1,)
    return (0, *[(0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")])


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as version `a` is older than, the same as or newer than `b`."""
    ka, kb = (_key(parse_version(v)) for v in (a, b))
    return (ka > kb) - (ka < kb)


def _key(v: tuple[int, int, int, str]) -> tuple:
    return (v[0], v[1], v[2], _pre_key(v[3]))


def bump(text: str, part: str = "patch") -> str:
    """The next version: `part` is major, minor or patch; the parts after it reset to 0 and any
    prerelease is dropped."""
    major, minor, patch, _ = parse_version(text)
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    if part == "patch":
        return f"{major}.{minor}.{patch + 1}"
    raise ValueError(f"unknown part: {part!r}")
