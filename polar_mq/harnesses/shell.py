"""`shell` harness: any command, run with the session env (base URLs, key, instruction)."""

from __future__ import annotations

from polar_mq.harnesses.base import HarnessContext, Launch, session_env


class ShellHarness:
    name = "shell"

    def launch(self, ctx: HarnessContext) -> Launch:
        command = ctx.options["command"]
        env = {**session_env(ctx), **{k: str(v) for k, v in (ctx.options.get("env") or {}).items()}}
        return Launch(command=command, env=env)


HARNESS = ShellHarness  # what registry.py loads for agent.harness "shell"
