"""polar_mq: rollouts for RL of LLM agents through unmodified agent harnesses.

A gateway proxy records every model call a harness makes (exact token ids and logprobs), a
message-queue pipeline runs sessions at scale, and builders turn the recordings into trajectories.

The package follows the data flow (README, "Layout"): `api` -> `tasks` -> `runtimes`/`harnesses`
-> `proxy_app` -> `merge` -> `graders` -> `rl`, over `store` (Redis) and the foundations at this
root (`model`, `taskspec`, `sampling`, `states`, `settings`, `auth`, `client`). Module names of the
earlier flat layout keep importing (`_MOVED` below; tests/pipeline/test_layout.py guards it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Any, Callable

__version__ = "0.1.0"

# Old module name -> where it lives now. An import of an old name returns the module itself
# (one module object, so isinstance and monkeypatching keep working).
_MOVED = {
    "polar_mq.tokens": "polar_mq.auth",
    "polar_mq.tasks.taskspec": "polar_mq.taskspec",
    "polar_mq.locks": "polar_mq._io.locks",
    "polar_mq.fast_send": "polar_mq._io.fast_send",
    "polar_mq.idle_socket": "polar_mq._io.idle_socket",
    "polar_mq.token_ids": "polar_mq._io.token_ids",
    "polar_mq.jsonsafe": "polar_mq._io.jsonsafe",
    "polar_mq.plugins": "polar_mq._io.plugins",
    "polar_mq.cleanup": "polar_mq._io.cleanup",
    "polar_mq.gunicorn_tuning": "polar_mq._io.gunicorn_tuning",
    "polar_mq.serving": "polar_mq._io.serving",
    "polar_mq.record_codec": "polar_mq.store.codec",
    "polar_mq.redis_wire": "polar_mq.store.wire",
    "polar_mq.replies": "polar_mq.store.replies",
    "polar_mq.session_cas": "polar_mq.store.session_cas",
    "polar_mq.group_queue": "polar_mq.store.groups",
    "polar_mq.pause_state": "polar_mq.store.pause",
    "polar_mq.histograms": "polar_mq.store.histograms",
    "polar_mq.retention": "polar_mq.store.retention",
    "polar_mq.tasks.pipeline_store": "polar_mq.store.pipeline",
    "polar_mq.cli_dataset": "polar_mq.cli.dataset",
    "polar_mq.cli_trainer": "polar_mq.cli.trainer",
    "polar_mq.client_cli": "polar_mq.cli.client_commands",
    "polar_mq.demo": "polar_mq.cli.demo",
    "polar_mq.up": "polar_mq.cli.up",
    "polar_mq.top": "polar_mq.cli.top",
    "polar_mq.cluster_status": "polar_mq.cli.cluster_status",
    "polar_mq.embedded_redis": "polar_mq.cli.embedded_redis",
    "polar_mq.preflight": "polar_mq.cli.preflight",
    "polar_mq.cli_tokens": "polar_mq.cli.tokens",
    "polar_mq.slots": "polar_mq.cli.slots",
    "polar_mq.roles": "polar_mq.api.roles",
    "polar_mq.submit_policy": "polar_mq.api.submit_policy",
    "polar_mq.callback_guard": "polar_mq.tasks.app.callback_guard",
    "polar_mq.redis_url": "polar_mq.store.redis_url",
    "polar_mq.replicated": "polar_mq.store.replicated",
    "polar_mq.supervise": "polar_mq._io.supervise",
    "polar_mq.tasks.host_loss": "polar_mq.tasks.worker.host_loss",
    "polar_mq.demo_harness": "polar_mq.cli.demo_harness",
    "polar_mq.logcap": "polar_mq.runtimes.logcap",
    "polar_mq.advantages": "polar_mq.rl.advantages",
    "polar_mq.weight_versions": "polar_mq.rl.weight_versions",
    "polar_mq.group_stream": "polar_mq.rl.group_stream",
    "polar_mq.trainers": "polar_mq.rl.trainers",
    "polar_mq.datasets": "polar_mq.rl.datasets",
    "polar_mq.export": "polar_mq.rl.export",
    "polar_mq.tasks.celery_app": "polar_mq.tasks.app.celery",
    "polar_mq.tasks.routing": "polar_mq.tasks.app.routing",
    "polar_mq.tasks.publish": "polar_mq.tasks.app.publish",
    "polar_mq.tasks.broker": "polar_mq.tasks.app.broker",
    "polar_mq.tasks.endings": "polar_mq.tasks.app.endings",
    "polar_mq.tasks.callbacks": "polar_mq.tasks.app.callbacks",
    "polar_mq.tasks.causes": "polar_mq.tasks.app.causes",
    "polar_mq.tasks.early_stop": "polar_mq.tasks.app.early_stop",
    "polar_mq.tasks.priority": "polar_mq.tasks.app.priority",
    "polar_mq.tasks.stages": "polar_mq.tasks.worker.stages",
    "polar_mq.tasks.janitor": "polar_mq.tasks.worker.janitor",
    "polar_mq.tasks.recovery": "polar_mq.tasks.worker.recovery",
    "polar_mq.tasks.lease": "polar_mq.tasks.worker.lease",
    "polar_mq.tasks.fencing": "polar_mq.tasks.worker.fencing",
    "polar_mq.tasks.cancel_watch": "polar_mq.tasks.worker.cancel_watch",
    "polar_mq.tasks.context": "polar_mq.tasks.app.context",
    "polar_mq.tasks.leftovers": "polar_mq.tasks.worker.leftovers",
    "polar_mq.tasks.ticker": "polar_mq.tasks.worker.ticker",
    "polar_mq.proxy_app.http11": "polar_mq.proxy_app.upstream.http11",
    "polar_mq.proxy_app.vllm_wire": "polar_mq.proxy_app.upstream.vllm_wire",
    "polar_mq.proxy_app.app": "polar_mq.proxy_app.web.app",
    "polar_mq.proxy_app.fastpath": "polar_mq.proxy_app.web.fastpath",
    "polar_mq.proxy_app.lean_worker": "polar_mq.proxy_app.web.lean_worker",
    "polar_mq.proxy_app.serve": "polar_mq.proxy_app.web.serve",
    "polar_mq.proxy_app.sessions_api": "polar_mq.proxy_app.web.sessions_api",
    "polar_mq.proxy_app.metrics": "polar_mq.proxy_app.web.metrics",
    "polar_mq.api.ui_auth": "polar_mq.api.ui.auth",
    "polar_mq.api.ui_gateway": "polar_mq.api.ui.gateway",
    "polar_mq.api.ui_views": "polar_mq.api.ui.views",
    "polar_mq.api.ui_tree": "polar_mq.api.ui.tree",
    "polar_mq.model_server": "polar_mq.dev.model_server",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return importlib.import_module(self.target)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        return None

    def get_code(self, fullname: str):  # type: ignore[no-untyped-def]
        """`python -m <old name>` runs the moved module's code."""
        spec = importlib.util.find_spec(self.target)
        return spec.loader.get_code(self.target) if spec and spec.loader else None  # type: ignore[attr-defined]

    def is_package(self, fullname: str) -> bool:
        spec = importlib.util.find_spec(self.target)
        return bool(spec and spec.submodule_search_locations is not None)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        new = _moved_name(fullname)
        if new is None:
            return None
        loader = _AliasLoader(new)
        return importlib.machinery.ModuleSpec(fullname, loader, is_package=loader.is_package(fullname))


def _moved_name(name: str) -> str | None:
    if name in _MOVED:
        return _MOVED[name]
    head, _, tail = name.rpartition(".")
    while head:
        if head in _MOVED:
            return _MOVED[head] + "." + name[len(head) + 1:]
        head, _, _ = head.rpartition(".")
    return None


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())  # before PathFinder: one module object per moved name


def _forward(package: str, module: str) -> Callable[[str], Any]:
    """The module `__getattr__` of a package that took the place of a flat-layout module: its
    names are found in `module` (`from polar_mq.store import Keys` finds store.core's)."""
    def __getattr__(name: str) -> Any:
        target = importlib.import_module(module)
        try:
            return getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
    return __getattr__
