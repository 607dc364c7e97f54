"""The hand-written OpenAPI 3.1 document served at /openapi.json.

Tests: tests/api/test_fuzz_api.py (the spec validates and every route is fuzzed from it).
"""

from __future__ import annotations

from typing import Any

from polar_mq.model import TERMINAL_STATES, SessionState
from polar_mq.taskspec import BACKENDS, BUILDERS, HARNESSES, PRIORITY_LIMIT

SESSION_STATES = [state.value for state in SessionState]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {"schema": _ref("Problem")}}}


_PATH_TASK = {"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"}}
_ERRORS = {"400": _problem("invalid request (body, query parameter); `field` names it"),
           "401": _problem("missing, unknown, expired or revoked bearer token"),
           "403": _problem("outside the token's rights (roles: submit, train, read); `missing_right` names it"),
           "503": _problem("Redis unreachable"),
           "414": {"description": "request line too long (answered by the HTTP server, before the API)"},
           "431": {"description": "request headers too large (answered by the HTTP server)"}}

SCHEMAS: dict[str, Any] = {
    "Problem": {
        "type": "object", "description": "RFC 9457 problem details",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
            "detail": {"type": "string"},
            "field": {"type": "string", "description": "the invalid field, e.g. agent.harness"},
        },
    },
    "ScopedTokenInfo": {
        "type": "object", "required": ["name", "role", "created_at", "expires_at"],
        "properties": {"name": {"type": "string"}, "role": {"enum": ["submit", "train", "read"]},
                       "created_at": {"type": "number"}, "expires_at": {"type": ["number", "null"]}},
    },
    "ScopedToken": {
        "type": "object", "required": ["name", "role", "token", "expires_at"],
        "properties": {"name": {"type": "string"}, "role": {"enum": ["submit", "train", "read"]},
                       "token": {"type": "string"}, "expires_at": {"type": ["number", "null"]}},
    },
    "Strategy": {
        "oneOf": [
            {"type": "string"},
            {"type": "object", "required": ["strategy"], "additionalProperties": False,
             "properties": {"strategy": {"type": "string"}, "config": {"type": "object"}}},
        ],
    },
    "TaskRequest": {
        "type": "object", "required": ["instruction", "agent"], "additionalProperties": False,
        "properties": {
            "task_id": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,128}$",
                        "description": "generated when absent; resubmitting the same id and body is idempotent"},
            "instruction": {"type": "string", "minLength": 1},
            "num_samples": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1},
            "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "default": 600,
                                "description": "budget per session, starting when INIT starts"},
            "agent": {
                "type": "object", "required": ["harness"], "additionalProperties": False,
                "properties": {
                    "harness": {"enum": list(HARNESSES)},
                    "model": {"type": "string", "default": "policy"},
                    "options": {"type": "object", "description": "harness-specific; shell needs `command`"},
                    "sampling": {
                        "type": "object", "additionalProperties": False,
                        "description": "enforced by the gateway on every call (max_tokens caps)",
                        "properties": {
                            "temperature": {"type": "number", "minimum": 0},
                            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                            "top_k": {"type": "integer"}, "max_tokens": {"type": "integer", "minimum": 1},
                            "seed": {"type": "integer"},
                            "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
                        },
                    },
                },
            },
            "runtime": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "backend": {"enum": list(BACKENDS), "default": "auto",
                                "description": "auto: docker (with an image) → bwrap → local, the "
                                               "safest the worker has"},
                    "image": {"type": "string", "description": "required for docker and apptainer"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "workdir": {"type": "string"},
                    "prepare": {"type": "array", "items": {
                        "type": "object", "description": "one of exec, upload, write"}},
                    "cpus": {"type": "number"}, "memory_mb": {"type": "integer"},
                    "allow_internet": {"type": "boolean", "default": False}, "gpus": {"type": "integer"},
                    "keep_workdir": {"type": "boolean", "default": False,
                                     "description": "keep the work dir and HOME after postrun"},
                },
            },
            "builder": {"allOf": [_ref("Strategy")],
                        "description": f"one of {', '.join(BUILDERS)} or module:Class (default prefix_merging)"},
            "grader": {"allOf": [_ref("Strategy")], "description": "default completion; `evaluator` is an alias"},
            "callback_url": {"type": "string", "format": "uri"},
            "metadata": {"type": "object"},
            "early_stop_min_usable_sessions": {
                "type": "integer", "minimum": 1, "maximum": 10000,
                "description": "at most num_samples; once this many sessions are graded without ERROR "
                               "the task's other sessions are cancelled as DELETE cancels them (their "
                               "partial trajectories kept, metadata.early_stopped: true)"},
            "dispatch_priority": {
                "type": "integer", "default": 0, "minimum": -PRIORITY_LIMIT, "maximum": PRIORITY_LIMIT,
                "description": "higher first, across tasks, for init and READY"},
        },
    },
    "Submitted": {
        "type": "object", "required": ["task_id", "session_ids"],
        "properties": {"task_id": {"type": "string"}, "session_ids": {"type": "array", "items": {"type": "string"}}},
    },
    "SessionSummary": {
        "type": "object",
        "properties": {
            "session_id": {"type": "string"}, "index": {"type": "integer"}, "state": {"enum": SESSION_STATES},
            "attempt": {"type": "integer"}, "node": {"type": ["string", "null"]},
            "error": {"type": ["string", "null"]}, "reward": {"type": ["number", "null"]},
            "outcome": {"type": ["string", "null"]}, "exit_code": {"type": ["integer", "null"]},
            "created_at": {"type": "number"}, "updated_at": {"type": "number"},
            "deadline": {"type": ["number", "null"]},
            "timings": {"type": "object", "additionalProperties": {"type": "number"},
                        "description": "<state>_start / <state>_end unix times"},
            "durations": {"type": "object", "additionalProperties": {"type": "number"},
                          "description": "seconds per state"},
            "events": {"type": "array", "items": {"type": "object", "required": ["event", "at"]},
                       "description": "what happened besides state moves (present when any), e.g. "
                                      "{event: orphans_reaped, at, node, pgids, pids}"},
        },
    },
    "TaskStatus": {
        "type": "object",
        "properties": {
            "task_id": {"type": "string"}, "state": {"enum": ["pending", "running", "done"]},
            "cancelled": {"type": "boolean", "description": "by DELETE (not by early stop)"},
            "early_stopped": {"type": "integer", "description": "sessions cancelled by early stop"},
            "created_at": {"type": "number"},
            "num_samples": {"type": "integer"}, "harness": {"type": "string"},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "terminal": {"type": "integer"}, "mean_reward": {"type": ["number", "null"]},
            "sessions": {"type": "array", "items": _ref("SessionSummary")},
            "request": {"allOf": [_ref("TaskRequest")], "description": "the TaskRequest as stored (GET /v1/tasks/<id>)"},
            "callbacks": {"type": "array", "description": "callback deliveries (signed, X-Polar-Signature)",
                          "items": {"type": "object", "properties": {
                              "delivery_id": {"type": "string"}, "event": {"type": "string"},
                              "session_id": {"type": ["string", "null"]}, "url": {"type": "string"},
                              "state": {"enum": ["delivered", "retrying", "dead_letter"]},
                              "attempts": {"type": "integer"}, "last_error": {"type": ["string", "null"]},
                              "created_at": {"type": ["number", "null"]}, "updated_at": {"type": "number"}}}},
        },
    },
    "Trace": {
        "type": "object",
        "properties": {
            "prompt_ids": {"type": "array", "items": {"type": "integer"}},
            "response_ids": {"type": "array", "items": {"type": "integer"}},
            "loss_mask": {"type": "array", "items": {"type": "integer"}},
            "response_logprobs": {"type": ["array", "null"], "items": {"type": "number"}},
            "messages": {"type": "array", "items": {"type": "object"}},
            "tools": {"type": "array", "items": {"type": "object"}},
            "finish_reason": {"type": ["string", "null"]}, "reward": {"type": ["number", "null"]},
            "call_ids": {"type": "array", "items": {"type": "string"}}, "metadata": {"type": "object"},
        },
    },
    "Trajectory": {
        "type": "object",
        "properties": {
            "session_id": {"type": "string"}, "task_id": {"type": ["string", "null"]},
            "status": {"enum": [state.value for state in TERMINAL_STATES]}, "builder": {"type": "string"},
            "traces": {"type": "array", "items": _ref("Trace")}, "stats": {"type": "object"},
            "reward": {"type": ["number", "null"]}, "error": {"type": ["string", "null"]},
            "metadata": {"type": "object"},
        },
    },
    "Results": {
        "type": "object",
        "properties": {
            "task_id": {"type": "string"}, "state": {"enum": ["pending", "running", "done"]},
            "total_sessions": {"type": "integer"}, "offset": {"type": "integer"}, "count": {"type": "integer"},
            "trajectories": {"type": "array", "items": _ref("Trajectory")},
            "sessions_without_trajectory": {"type": "array", "items": {
                "type": "object", "properties": {"session_id": {"type": "string"}, "state": {"type": "string"},
                                                 "error": {"type": ["string", "null"]}}}},
        },
    },
    "Pause": {
        "type": "object",
        "properties": {
            "paused": {"type": "boolean"}, "in_flight": {"type": "integer"}, "drained": {"type": "boolean"},
            "in_flight_by_gateway": {"type": "object", "additionalProperties": {"type": "integer"}},
            "live_gateways": {"type": "array", "items": {"type": "string"}},
            "dead_gateways": {"type": "array", "items": {"type": "string"},
                              "description": "no heartbeat within the TTL: their calls do not block the drain"},
            "policy_version": {"type": ["integer", "null"]},
            "mode": {"enum": ["keep", "wait", "abort"]},
            "upstreams": {"type": "object", "description": "per upstream: rl_api, weight_version, is_paused, error"},
        },
    },
    "GroupSession": {
        "type": "object", "required": ["session_id", "state"],
        "properties": {"session_id": {"type": "string"}, "state": {"enum": SESSION_STATES},
                       "reward": {"type": ["number", "null"]}, "error": {"type": ["string", "null"]},
                       "early_stopped": {"type": "boolean",
                                         "description": "cancelled by the task's early stop"}},
    },
    "Group": {
        "type": "object", "required": ["task_id", "metadata", "policy_version", "delivery", "sessions", "trajectories"],
        "properties": {
            "task_id": {"type": "string"}, "metadata": {"type": "object"},
            "policy_version": {"type": ["integer", "null"], "description": "the task's metadata.policy_version"},
            "delivery": {"type": "integer", "minimum": 1, "description": "hand-outs so far (>1: redelivered)"},
            "sessions": {"type": "array", "items": _ref("GroupSession")},
            "trajectories": {"type": "array", "items": _ref("Trajectory")},
            "finished_at": {"type": ["number", "null"]}, "lease_expires_at": {"type": ["number", "null"]},
            "early_stopped": {"type": "integer", "minimum": 0,
                              "description": "sessions the task's early stop cancelled"},
        },
    },
    "GroupStats": {
        "type": "object",
        "properties": {k: {"type": "integer"} for k in ("pending", "leased", "finished", "delivered", "redelivered",
                                                           "lease_expired", "acked")}
        | {"acked_by_reason": {"type": "object", "additionalProperties": {"type": "integer"}},
           "oldest_pending_age_s": {"type": ["number", "null"]}},
    },
}


def _null_allowed(schema: dict[str, Any]) -> None:
    """The parser treats an explicit null like an absent optional field; say so in the document
    (fuzzers check that every request the document rejects is rejected by the API too)."""
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        if prop.get("type") == "object" and "properties" in prop:
            _null_allowed(prop)
        if name in required:
            continue
        if isinstance(prop.get("type"), str):
            prop["type"] = [prop["type"], "null"]
        elif "enum" in prop:
            prop["enum"] = [*prop["enum"], None]
        elif "allOf" in prop or "oneOf" in prop:
            key = "allOf" if "allOf" in prop else "oneOf"
            prop["anyOf"] = [{key: prop.pop(key)}, {"type": "null"}]


_null_allowed(SCHEMAS["TaskRequest"])
_null_allowed(SCHEMAS["Strategy"]["oneOf"][1])


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "polar_mq rollout API", "version": "1",
                 "description": "Submit rollout tasks, follow their sessions, fetch trajectories."},
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "the admin token (POLAR_API_TOKEN, else $POLAR_HOME/token) "
                                                          "or a scoped token (polar-mq token create)"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/tasks": {
                "post": {
                    "summary": "Submit a TaskRequest (JSON, or YAML with content-type application/yaml)",
                    "requestBody": {"required": True, "content": {
                        "application/json": {"schema": _ref("TaskRequest")},
                        "application/yaml": {"schema": _ref("TaskRequest")}}},
                    "responses": {
                        "202": _json(_ref("Submitted"), "created; one init message per session enqueued"),
                        "200": _json(_ref("Submitted"), "identical resubmit: the existing sessions"),
                        "400": _problem("invalid TaskRequest; `field` names the field"),
                        "409": _problem("task_id exists with a different body"), **_ERRORS},
                },
                "get": {
                    "summary": "Recent tasks (newest first)",
                    "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer", "default": 50,
                                                                                "minimum": 0, "maximum": 1000}}],
                    "responses": {"200": _json({"type": "object", "properties": {"tasks": {
                        "type": "array", "items": _ref("TaskStatus")}}}, "task summaries"), **_ERRORS},
                },
            },
            "/v1/tasks/{task_id}": {
                "parameters": [_PATH_TASK],
                "get": {"summary": "Task status with per-session states",
                        "responses": {"200": _json(_ref("TaskStatus"), "status"),
                                      "404": _problem("unknown task"), **_ERRORS}},
                "delete": {"summary": "Cancel: registered sessions end in ERROR, running ones are stopped",
                           "responses": {"202": _json({"type": "object"}, "cancellation accepted"),
                                         "404": _problem("unknown task"), **_ERRORS}},
            },
            "/v1/tasks/{task_id}/results": {
                "parameters": [_PATH_TASK],
                "get": {
                    "summary": "Trajectories of the task's finished sessions",
                    "parameters": [
                        {"name": "status", "in": "query", "schema": {"type": "string"},
                         "description": "comma-separated COMPLETED,ERROR,TIMEOUT"},
                        {"name": "min_reward", "in": "query", "schema": {"type": "number"}},
                        {"name": "offset", "in": "query", "schema": {"type": "integer", "default": 0}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                    ],
                    "responses": {"200": _json(_ref("Results"), "trajectories"),
                                  "404": _problem("unknown task"), **_ERRORS},
                },
            },
            "/v1/sessions/{session_id}": {
                "parameters": [{"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "get": {"summary": "One session record",
                        "responses": {"200": _json({"type": "object"}, "the SessionRecord"),
                                      "404": _problem("unknown session"), **_ERRORS}},
            },
            "/v1/admin/pause": {
                "post": {
                    "summary": "Pause the gateway and wait for in-flight generations",
                    "parameters": [{"name": "wait", "in": "query", "schema": {"type": "number"},
                                    "description": "seconds to wait (default settings.pause_wait)"}],
                    "responses": {"200": _json(_ref("Pause"), "paused"), **_ERRORS},
                },
                "get": {"summary": "Whether the gateway is paused",
                        "responses": {"200": _json(_ref("Pause"), "pause state"), **_ERRORS}},
            },
            "/v1/admin/resume": {
                "post": {"summary": "Resume generation; every call admitted from now on carries policy_version",
                         "requestBody": {"required": False, "content": {"application/json": {"schema": {
                             "type": "object", "properties": {"policy_version": {"type": "integer"}}}}}},
                         "responses": {"200": _json(_ref("Pause"), "resumed"),
                                       "400": _problem("policy_version is not an integer"), **_ERRORS}},
            },
            "/v1/admin/status": {
                "get": {"summary": "Paused or not, in flight per live gateway, policy_version, upstream weights",
                        "responses": {"200": _json(_ref("Pause"), "status"), **_ERRORS}},
            },
            "/v1/groups/next": {
                "get": {
                    "summary": "Lease finished groups, oldest finished first",
                    "parameters": [
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "default": 1, "minimum": 1}},
                        {"name": "wait", "in": "query", "schema": {"type": "number", "default": 0, "maximum": 300},
                         "description": "seconds to wait for a group to finish (or a lease to run out)"},
                        {"name": "lease", "in": "query", "schema": {"type": "number", "default": 300},
                         "description": "seconds before an un-acked group is handed out again"},
                    ],
                    "responses": {"200": {"description": "groups (JSON; Accept: application/msgpack gets the same "
                                                         "object as msgpack)",
                                          "content": {"application/json": {"schema": {
                                              "type": "object", "properties": {"groups": {
                                                  "type": "array", "items": _ref("Group")}}}},
                                                      "application/msgpack": {}}},
                                  "400": _problem("bad limit / wait / lease"), **_ERRORS},
                },
            },
            "/v1/groups/{task_id}/ack": {
                "parameters": [_PATH_TASK],
                "post": {"summary": "Consume a group for good (also after its lease ran out)",
                         "requestBody": {"required": False, "content": {"application/json": {"schema": {
                             "type": "object", "properties": {"reason": {
                                 "enum": ["trained", "stale", "unusable", "skipped"]}}}}}},
                         "responses": {"200": _json({"type": "object"}, "acked"),
                                       "404": _problem("unknown task"), "409": _problem("task not finished"),
                                       **_ERRORS}},
            },
            "/v1/groups/stats": {
                "get": {"summary": "Queue counts", "responses": {"200": _json(_ref("GroupStats"), "counts"), **_ERRORS}},
            },
            "/v1/groups/{task_id}": {
                "parameters": [_PATH_TASK],
                "get": {"summary": "Where one group is: unfinished, pending, leased, acked",
                        "responses": {"200": _json({"type": "object"}, "group state"),
                                      "404": _problem("unknown task"), **_ERRORS}},
            },
            "/v1/admin/tokens": {
                "post": {"summary": "Make a scoped token (admin token only); the token is answered once",
                         "requestBody": {"required": True, "content": {"application/json": {"schema": {
                             "type": "object", "required": ["role"], "properties": {
                                 "role": {"enum": ["submit", "train", "read"]},
                                 "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"},
                                 "ttl_seconds": {"type": "number", "exclusiveMinimum": 0}}}}}},
                         "responses": {"201": _json(_ref("ScopedToken"), "the new token (shown only now)"),
                                       "409": _problem("a token with that name exists"), **_ERRORS}},
                "get": {"summary": "Scoped tokens: names, roles, expiry (never the tokens)",
                        "responses": {"200": _json({"type": "object", "properties": {"tokens": {
                            "type": "array", "items": _ref("ScopedTokenInfo")}}}, "tokens"), **_ERRORS}},
            },
            "/v1/admin/tokens/{name}": {
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                "delete": {"summary": "Revoke a scoped token (effective on the next request)",
                           "responses": {"200": _json({"type": "object"}, "revoked"),
                                         "404": _problem("no token with that name"), **_ERRORS}},
            },
            "/health": {
                "get": {"summary": "Redis reachability and queue lengths (no token needed)", "security": [],
                        "responses": {"200": _json({"type": "object"}, "healthy"),
                                      "503": _problem("Redis unreachable")}},
            },
            "/metrics": {
                "get": {"summary": "Prometheus metrics",
                        "responses": {"200": {"description": "text exposition format",
                                              "content": {"text/plain": {"schema": {"type": "string"}}}},
                                      **_ERRORS}},
            },
            "/openapi.json": {
                "get": {"summary": "This document (no token needed)", "security": [],
                        "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")}},
            },
        },
    }
