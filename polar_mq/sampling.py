"""The sampling policy of a task (`agent.sampling`): what the trainer needs the behaviour policy to be.

Harnesses pick their own temperature, top_p and max tokens; GRPO's importance ratios assume the
trainer knows what sampled each token. A task's policy is validated here, handed to the gateway
with each of its sessions, and applied over whatever the harness asked for on every call:
`temperature`, `top_p`, `top_k`, `seed` and `stop` replace the harness's values, `max_tokens`
caps them (a harness asking for less keeps its smaller limit). The record keeps both.
"""

from __future__ import annotations

from typing import Any, TypeGuard

FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop")


class PolicyError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(policy: Any, where: str = "agent.sampling") -> dict[str, Any]:
    """A clean policy dict (only the fields that are set); raises PolicyError naming the field."""
    if policy is None:
        return {}
    if not isinstance(policy, dict):
        raise PolicyError(where, "must be an object")
    unknown = sorted(set(policy) - set(FIELDS))
    if unknown:
        raise PolicyError(f"{where}.{unknown[0]}", f"unknown field (allowed: {', '.join(FIELDS)})")
    out: dict[str, Any] = {}
    for name in FIELDS:
        value = policy.get(name)
        if value is None:
            continue
        label = f"{where}.{name}"
        if name == "temperature" and not (_number(value) and 0 <= value <= 100):
            raise PolicyError(label, "must be a number >= 0")
        if name == "top_p" and not (_number(value) and 0 < value <= 1):
            raise PolicyError(label, "must be a number in (0, 1]")
        if name == "top_k" and not (_integer(value) and (value == -1 or value >= 1)):
            raise PolicyError(label, "must be an integer >= 1 (or -1 for no limit)")
        if name == "max_tokens" and not (_integer(value) and value >= 1):
            raise PolicyError(label, "must be an integer >= 1")
        if name == "seed" and not _integer(value):
            raise PolicyError(label, "must be an integer")
        if name == "stop":
            stops = [value] if isinstance(value, str) else value
            if not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)):
                raise PolicyError(label, "must be a string or a list of non-empty strings")
            out[name] = stops
            continue
        out[name] = float(value) if name in ("temperature", "top_p") else value
    return out


def apply(params: dict[str, Any], policy: dict[str, Any]) -> dict[str, Any]:
    """The parameters to send upstream: the harness's `params` with the policy enforced."""
    if not policy:
        return dict(params)
    out = dict(params)
    if "max_tokens" in policy:
        out.pop("max_completion_tokens", None)
    for name, value in policy.items():
        if name == "max_tokens":
            asked = params.get("max_tokens", params.get("max_completion_tokens"))
            out["max_tokens"] = min(int(asked), value) if _integer(asked) and asked > 0 else value
        else:
            out[name] = list(value) if isinstance(value, list) else value
    return out


def summary(records: list[Any], policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """What sampled a trajectory: the task's policy and the distinct sampling parameters its calls
    were sent with (each with the number of calls)."""
    seen: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for rec in records:
        params = rec.get("params") if isinstance(rec, dict) else getattr(rec, "params", None)
        sent = {k: v for k, v in (params or {}).items() if k in FIELDS}
        key = repr(sorted(sent.items()))
        seen.setdefault(key, sent)
        counts[key] = counts.get(key, 0) + 1
    return {"policy": dict(policy or {}), "enforced": bool(policy),
            "params": [{"params": seen[k], "calls": counts[k]} for k in seen]}
