"""The adapter of each provider API, keyed by the provider names of the canonical model.

`model.PROVIDERS` is the one list of provider names (records, metrics and routes speak it); each
name is also the adapter module's name here, so the registry is exactly those keys and adding a
provider is one module plus one name. Every registered module is checked against `base.Adapter`
by mypy (below) and by tests/adapters/test_adapter_kit.py at run time.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, cast

from polar_mq.model import PROVIDERS
from polar_mq.proxy_app.adapters.base import Adapter

ADAPTERS: dict[str, Adapter] = {
    name: cast(Adapter, import_module(f"{__package__}.{name}")) for name in PROVIDERS}


def adapter(provider: str) -> Adapter:
    """The adapter serving `provider` (KeyError for a name outside model.PROVIDERS)."""
    return ADAPTERS[provider]


if TYPE_CHECKING:  # the static conformance check: each module is an Adapter as written
    from polar_mq.proxy_app.adapters import anthropic, gemini, openai_chat, openai_responses

    _CHECKED: tuple[Adapter, ...] = (anthropic, gemini, openai_chat, openai_responses)
