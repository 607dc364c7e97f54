"""`rubric` grader: a judge model scores the trajectory against the task's rubric, per criterion.

config: `rubric` (text, required), `judge_model` (default: the task's agent.model), `criteria`
(names, or {name, description?, weight?} objects, or {name: weight}; default one criterion
`overall`), `seed` (default 0), `max_tokens` (default 1024).

The judge is reached through the gateway, in a gateway session of its own (`<session>.judge`,
metadata `role: judge`; the gateway serves its records with `metadata.role = "judge"`), so its
calls are recorded and audited like any other but are never part of the session's trained
trajectory (postrun builds that from the session's own gateway session only). Sampling is
pinned by the session's policy: temperature 0 and the seed. The judge answers JSON
`{"scores": {criterion: 0..1}, "explanation": ...}`; the reward is the weighted mean. The grade
keeps every criterion's score, the judge's prompt and answer and its call ids. Any failure of
the judge (HTTP error, no answer, an answer that is not the asked JSON, a score missing or out
of range) is status error: the session ends ERROR and trainers mask it; never reward 0.
Guarded by tests/graders/test_graders_rubric.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import requests

from polar_mq.model import Trajectory
from polar_mq.store.retention import judge_session_id
from polar_mq.graders.base import Grade, GradeContext, Grader, InfraError

TRANSCRIPT_CHARS = 24_000  # the tail of the conversation the judge reads
SYSTEM = ("You are a strict, impartial grader. Score the agent's work against the rubric, each "
          "criterion between 0 and 1. Answer with one JSON object and nothing else.")


def normalise_criteria(criteria: Any) -> list[dict[str, Any]]:
    if criteria is None:
        return [{"name": "overall", "description": "how well the work meets the rubric", "weight": 1.0}]
    items: list[dict[str, Any]] = []
    if isinstance(criteria, dict):
        for name, value in criteria.items():
            items.append({"name": str(name), "description": "",
                          "weight": float(value) if isinstance(value, (int, float)) else 1.0}
                         if not isinstance(value, str) else {"name": str(name), "description": value, "weight": 1.0})
    elif isinstance(criteria, list):
        for c in criteria:
            if isinstance(c, str):
                items.append({"name": c, "description": "", "weight": 1.0})
            elif isinstance(c, dict) and isinstance(c.get("name"), str):
                items.append({"name": c["name"], "description": str(c.get("description") or ""),
                              "weight": float(c.get("weight", 1.0))})
            else:
                raise ValueError("grader 'rubric': each criterion is a name or {name, description?, weight?}")
    else:
        raise ValueError("grader 'rubric': criteria must be a list or an object")
    names = [c["name"] for c in items]
    if not items or len(set(names)) != len(names):
        raise ValueError("grader 'rubric': criteria must be non-empty with distinct names")
    if any(c["weight"] < 0 for c in items) or sum(c["weight"] for c in items) <= 0:
        raise ValueError("grader 'rubric': weights must be >= 0 with a positive sum")
    return items


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(p.get("text") if isinstance(p, dict) else p) for p in content)
    return "" if content is None else json.dumps(content)


def transcript(trajectory: Trajectory) -> str:
    """The conversation of the trajectory's last trace (its messages and tool calls), as text."""
    if not trajectory.traces:
        return "(the agent made no model calls)"
    lines = []
    for m in trajectory.traces[-1].messages:
        role = m.get("role", "?")
        body = _text(m.get("content"))
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            body += f"\n[tool call {fn.get('name')}: {fn.get('arguments')}]"
        lines.append(f"[{role}] {body}")
    text = "\n".join(lines)
    return text if len(text) <= TRANSCRIPT_CHARS else "…" + text[-TRANSCRIPT_CHARS:]


def judge_messages(rubric: str, criteria: list[dict[str, Any]], instruction: str, convo: str,
                   status: str) -> list[dict[str, str]]:
    listed = "\n".join(f"- {c['name']}" + (f": {c['description']}" if c["description"] else "") for c in criteria)
    example = json.dumps({"scores": {c["name"]: 0.0 for c in criteria}, "explanation": "..."})
    user = (f"Rubric:\n{rubric}\n\nCriteria:\n{listed}\n\nTask given to the agent:\n{instruction}\n\n"
            f"Session status: {status}\n\nThe agent's conversation:\n{convo}\n\n"
            f"Answer with JSON exactly like {example}, every criterion scored between 0 and 1.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def parse_answer(text: str, criteria: list[dict[str, Any]]) -> tuple[dict[str, float], str]:
    """(score per criterion, explanation) from the judge's answer; ValueError if it is not that."""
    fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.DOTALL)
    candidate = fenced.group(1) if fenced else text[text.find("{"): text.rfind("}") + 1]
    try:
        data = json.loads(candidate)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"the judge's answer is not JSON: {text[:200]!r}") from exc
    scores = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(scores, dict):
        raise ValueError(f"the judge's answer has no 'scores' object: {text[:200]!r}")
    out: dict[str, float] = {}
    for c in criteria:
        value = scores.get(c["name"])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"the judge gave criterion {c['name']!r} no score between 0 and 1 ({value!r})")
        out[c["name"]] = float(value)
    return out, str(data.get("explanation") or "")


class RubricGrader(Grader):
    name = "rubric"

    def __init__(self, rubric: str, judge_model: str | None = None, criteria: Any = None, seed: int = 0,
                 max_tokens: int = 1024, **unknown: Any):
        if unknown:
            raise ValueError(f"grader 'rubric' got unknown config {sorted(unknown)} "
                             "(allowed: rubric, judge_model, criteria, seed, max_tokens)")
        if not isinstance(rubric, str) or not rubric.strip():
            raise ValueError("grader 'rubric' needs config.rubric (text)")
        super().__init__(rubric=rubric, judge_model=judge_model, criteria=criteria, seed=seed)
        self.rubric = rubric
        self.judge_model = judge_model
        self.criteria = normalise_criteria(criteria)
        self.seed = int(seed)
        self.max_tokens = int(max_tokens)

    def evaluate(self, trajectory: Trajectory, context: GradeContext) -> Grade:
        audit: dict[str, Any] = {}
        try:
            return self._judge(trajectory, context, audit)
        except InfraError as exc:  # the judge failed: masked (status error), its prompt kept
            grade = Grade.error(str(exc), judge=audit)
            grade.metadata["grader"] = self.name
            return grade

    def _judge(self, trajectory: Trajectory, context: GradeContext, audit: dict[str, Any]) -> Grade:
        gateway = context.gateway
        if gateway is None:
            raise InfraError("no gateway to reach a judge through (the pipeline grades with one)")
        task = context.task
        model = self.judge_model or (task.agent.model if task is not None else "policy")
        judge_sid = judge_session_id(context.session_id)  # the task's retention covers it (store/retention.py)
        messages = judge_messages(self.rubric, self.criteria, task.instruction if task is not None else "",
                                  transcript(trajectory), trajectory.status)
        sampling = {"temperature": 0.0, "seed": self.seed}
        audit.update({"session_id": judge_sid, "model": model, "prompt": messages, "answer": None,
                      "sampling": sampling})
        try:
            session = gateway.create_session(judge_sid, context.task_id or "",
                                             {"role": "judge", "judged_session_id": context.session_id},
                                             sampling)
            resp = requests.post(f"{session['base_urls']['openai']}/chat/completions", timeout=context.remaining(),
                                 headers={"Authorization": f"Bearer {session['key']}"},
                                 json={"model": model, "messages": messages, "temperature": 0.0,
                                       "seed": self.seed, "max_tokens": self.max_tokens})
        except (requests.RequestException, ValueError) as exc:
            raise InfraError(f"the judge could not be reached through the gateway: {exc}") from exc
        try:  # the judge's records as the gateway serves them (each with metadata.role "judge")
            got = gateway.http.get(f"{gateway.url}/sessions/{judge_sid}/calls", timeout=30).json()["calls"]
            audit["records"] = [{k: c.get(k) for k in ("call_id", "metadata", "params", "status", "model_served")}
                                for c in got]
        except Exception:  # noqa: BLE001 - the audit trail is best effort, the answer is not
            audit["records"] = []
        if resp.status_code != 200:
            raise InfraError(f"the judge failed: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            answer = _text(resp.json()["choices"][0]["message"].get("content"))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise InfraError(f"the judge's reply has no answer: {resp.text[:300]}") from exc
        audit["answer"] = answer
        try:
            scores, explanation = parse_answer(answer, self.criteria)
        except ValueError as exc:
            raise InfraError(str(exc)) from exc
        total = sum(c["weight"] for c in self.criteria)
        reward = sum(scores[c["name"]] * c["weight"] for c in self.criteria) / total
        return Grade(reward, {"criteria": scores, "weights": {c["name"]: c["weight"] for c in self.criteria},
                              "explanation": explanation, "judge": audit}, passed=reward >= 1.0)
