"""URL slugs."""

import re
import unicodedata

_NOT_WORD = re.compile(r"[^a-z0-9]+")


def slugify(text: str, sep: str = "-", max_len: int | None = None) -> str:
    """Lower-case ASCII words of `text` joined by `sep`: accents are stripped, every run of other
    characters becomes one separator, and none leads or trails. `max_len` cuts at a word boundary
    when it can."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = _NOT_WORD.sub(sep, ascii_text.lower()).strip(sep)
    if max_len is not None and len(slug) > max_len:
        cut = slug[:max_len]
        if sep in cut and slug[max_len:max_len + len(sep)] != sep:
            cut = cut.rsplit(sep, 1)[0]
        slug = cut.strip(sep)
    return slug
