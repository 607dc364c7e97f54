"""The harness interface: how to launch one agent CLI headless against a gateway session."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class HarnessContext:
    session_id: str
    instruction: str
    model: str
    key: str  # the gateway session key, used as every provider's API key
    base_urls: dict[str, str]  # {"anthropic", "openai", "gemini"} from the gateway
    home: Path  # the session's HOME (config files go here)
    workdir: Path
    options: dict[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None  # the served model's context length (None: unknown)
    sampling: dict[str, Any] = field(default_factory=dict)  # the task's agent.sampling


@dataclass
class Launch:
    command: str | list[str]
    env: dict[str, str]


def session_env(ctx: HarnessContext) -> dict[str, str]:
    """What every harness gets: the base URLs, the session key as every API key, the task."""
    return {
        "OPENAI_BASE_URL": ctx.base_urls["openai"],
        "OPENAI_API_KEY": ctx.key,
        "ANTHROPIC_BASE_URL": ctx.base_urls["anthropic"],
        "ANTHROPIC_API_KEY": ctx.key,
        "GOOGLE_GEMINI_BASE_URL": ctx.base_urls["gemini"],
        "GEMINI_API_KEY": ctx.key,
        "GOOGLE_API_KEY": ctx.key,
        "POLAR_SESSION_ID": ctx.session_id,
        "POLAR_INSTRUCTION": ctx.instruction,
        "POLAR_MODEL": ctx.model,
    }


class Harness(Protocol):
    name: str

    def launch(self, ctx: HarnessContext) -> Launch:
        """Write config files into ctx.home and return the headless command and its env."""
