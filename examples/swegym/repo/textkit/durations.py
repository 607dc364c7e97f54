"""Durations written as `1h30m`, `90s`, `2d 4h`."""

import re

UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([wdhms])")


def parse_duration(text: str) -> float:
    """Seconds in `text` ("1h30m" -> 5400). A bare number is seconds. Raises ValueError on
    anything else."""
    text = text.strip().lower()
    if not text:
        raise ValueError("empty duration")
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if text[pos:m.start()].strip():
            raise ValueError(f"bad duration: {text!r}")
        total += float(m.group(1)) * UNITS[m.group(2)]
        pos = m.end()
    if pos == 0 or text[pos:].strip():
        raise ValueError(f"bad duration: {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """The shortest form of a whole number of seconds, largest unit first (5400 -> "1h30m");
    0 -> "0s"."""
    if seconds < 0:
        raise ValueError("negative duration")
    left = int(round(seconds))
    if left == 0:
        return "0s"
    parts = []
    for unit, size in UNITS.items():
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
