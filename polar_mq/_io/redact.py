"""Session keys out of log lines and error texts: a key opens a session, so logs never carry one
whole (tests/trust/test_trust_tokens.py)."""

from __future__ import annotations

import logging
import re

_KEY_PATTERN = re.compile(r"pmq-[A-Za-z0-9_-]{6,}")


def redact(text: str) -> str:
    """`text` with every session key shortened to its first characters (logs, error messages)."""
    return _KEY_PATTERN.sub(lambda m: m.group(0)[:8] + "…", text)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts session keys (werkzeug's request lines name /s/<key>/...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True
