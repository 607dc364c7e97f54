"""OpenAI's error object, one for both OpenAI APIs (Chat Completions and Responses).

`{"message", "type", "param", "code"}`: the openai SDKs raise on `type`/status, and clients read
`code` to tell errors apart (Codex stops retrying on `context_length_exceeded`; opencode and pi show
`invalid_api_key`). An error may name its own `param` / `code` in `GatewayError.detail`.

Tests: tests/adapters/test_adapter_kit.py.
"""

from __future__ import annotations

from typing import Any

from polar_mq.proxy_app.adapters.base import GatewayError

# Error kind -> (type, code), as OpenAI spells them.
ERROR_TYPES: dict[str, tuple[str, str | None]] = {
    "invalid_request": ("invalid_request_error", None),
    "authentication": ("authentication_error", "invalid_api_key"),
    "permission": ("permission_error", None),
    "not_found": ("not_found_error", None),
    "too_large": ("invalid_request_error", "request_too_large"),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "rate_limit": ("rate_limit_error", "rate_limit_exceeded"),
    "upstream_error": ("server_error", "server_error"),
    "upstream_unavailable": ("server_error", "server_error"),
    "store_unavailable": ("server_error", "server_error"),
    "upstream_timeout": ("server_error", "server_error"),
    "internal": ("server_error", "server_error"),
}


def error_object(err: GatewayError) -> dict[str, Any]:
    """The inner error object."""
    typ, code = ERROR_TYPES.get(err.kind, ("server_error", "server_error"))
    return {"message": err.message, "type": typ, "param": err.detail.get("param"),
            "code": err.detail.get("code") or code}


def error_response(err: GatewayError) -> tuple[int, dict[str, Any]]:
    """An HTTP error in OpenAI's shape: {"error": {message, type, param, code}}."""
    return err.status, {"error": error_object(err)}
