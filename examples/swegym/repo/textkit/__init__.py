"""textkit: small text utilities (slugs, durations, roman numerals, versions, CSV rows, wrapping)."""

from textkit.csvrow import join_row, split_row
from textkit.durations import format_duration, parse_duration
from textkit.roman import from_roman, to_roman
from textkit.slug import slugify
from textkit.versions import bump, compare, parse_version
from textkit.wrap import wrap

__version__ = "0.3.0"
__all__ = ["bump", "compare", "format_duration", "from_roman", "join_row", "parse_duration", "parse_version",
           "slugify", "split_row", "to_roman", "wrap"]
