"""What a TaskRequest must pass before it is stored: its callback URL (callback_guard.py, 400)
and, for a non-admin token, the operator's submission policy (submit_policy.py, 403 naming the
rule). Both run before anything is written or enqueued (tests/trust/test_trust_roles.py)."""

from __future__ import annotations

from polar_mq.tasks.app import callback_guard
from polar_mq.api import submit_policy
from polar_mq.api.roles import Principal
from polar_mq.taskspec import TaskRequest
from polar_mq.api.problems import Problem, validation


def check_submit(task: TaskRequest, who: Principal) -> None:
    if task.callback_url is not None:
        why = callback_guard.refused(task.callback_url)
        if why is not None:
            raise validation("callback_url", why)
    if who.admin:
        return
    try:
        policy = submit_policy.load()
    except submit_policy.PolicyError as exc:
        raise Problem(503, f"the submission policy cannot be used, so no non-admin submit is accepted: {exc}",
                      kind="policy-unavailable")
    refusal = submit_policy.check(task, policy)
    if refusal is not None:
        raise Problem(403, refusal.detail, kind="forbidden", title="Refused by the submission policy",
                      rule=refusal.rule)


def check_builder(task: TaskRequest) -> None:
    """A built-in builder's whole config, checked by building it: a typo is a 400 at submit, not
    an ERROR at postrun (tests/merge/test_merge_lineage.py)."""
    from polar_mq.merge.registry import get_builder
    from polar_mq.taskspec import BUILDERS, ValidationError

    if task.builder.strategy not in BUILDERS:
        return
    try:
        get_builder(task.builder.strategy, task.builder.config)
    except ValueError as exc:
        text = str(exc)
        key = text.split("config key '", 1)[1].split("'")[0] if "config key '" in text else ""
        raise ValidationError(f"builder.config.{key}" if key else "builder.config", text) from None
