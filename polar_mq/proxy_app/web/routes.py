"""The one table of provider endpoints: every provider call (Anthropic, OpenAI Chat and
Responses, Gemini, their token counts) is matched here and served by FastPath (fastpath.py);
the lean worker takes exactly these paths too. Everything else is the Flask app's.
tests/gateway/test_gateway.py, tests/adapters/test_gemini.py and tests/gateway/test_lean_worker.py guard it."""

from __future__ import annotations

from dataclasses import dataclass

# path (after an optional /s/<key> prefix) -> (provider, whether it counts tokens)
ROUTES: dict[str, tuple[str, bool]] = {
    "/v1/messages": ("anthropic", False),
    "/v1/messages/count_tokens": ("anthropic", True),
    "/v1/chat/completions": ("openai_chat", False),
    "/chat/completions": ("openai_chat", False),
    "/v1/responses": ("openai_responses", False),
    "/v1/responses/input_tokens": ("openai_responses", True),
}
# Gemini's method is in the path: <prefix><model>:<action>
GEMINI_PREFIXES = ("/v1beta/models/", "/v1/models/")
GEMINI_ACTIONS = {"generateContent": (False, False), "streamGenerateContent": (True, False),
                  "countTokens": (False, True)}


@dataclass(frozen=True)
class ProviderRoute:
    key: str | None  # the session key of a /s/<key> prefix
    provider: str
    count: bool  # a token count, not a generation
    model: str | None = None  # Gemini: the model named in the path
    stream: bool = False  # Gemini: streamGenerateContent
    unknown: str | None = None  # Gemini: a method that does not exist (answered 404 in its shape)


def provider_route(path: str) -> ProviderRoute | None:
    """The provider call a POST to `path` is, or None when it is none."""
    key = None
    if path.startswith("/s/"):
        key, sep, rest = path[3:].partition("/")
        if not key or not sep:
            return None
        path = "/" + rest
    found = ROUTES.get(path)
    if found is not None:
        return ProviderRoute(key, found[0], found[1])
    for prefix in GEMINI_PREFIXES:
        if path.startswith(prefix) and len(path) > len(prefix):
            target = path[len(prefix):]
            model, _, action = target.rpartition(":")
            if action not in GEMINI_ACTIONS or not model:
                return ProviderRoute(key, "gemini", False, unknown=target)
            stream, count = GEMINI_ACTIONS[action]
            return ProviderRoute(key, "gemini", count, model=model, stream=stream)
    return None


def provider_for_path(path: str) -> str:
    """Which provider's error shape a path expects (used before routing succeeded, too)."""
    if "/messages" in path:
        return "anthropic"
    if "/responses" in path:
        return "openai_responses"
    if "/models/" in path and ":" in path:
        return "gemini"
    return "openai_chat"
