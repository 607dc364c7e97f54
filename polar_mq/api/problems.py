"""RFC 9457 problem details: every error the API answers is `application/problem+json`.

`Problem` is raised anywhere in a request; the app's error handlers turn it (and any werkzeug
HTTPException, Redis outage or unexpected exception) into a JSON body with `type`, `title`,
`status`, `detail` and, for validation errors, `field`. Never an HTML error page.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Response

PROBLEM_BASE = "urn:polar-mq:problem:"
CONTENT_TYPE = "application/problem+json"

_TITLES = {
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large", 415: "Unsupported Media Type",
    422: "Unprocessable Content", 500: "Internal Server Error", 503: "Service Unavailable",
}


class Problem(Exception):
    """An error answered as problem details. `extra` members are added to the body."""

    def __init__(self, status: int, detail: str, *, kind: str | None = None, title: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.kind = kind or _slug(_TITLES.get(status, "error"))
        self.title = title or _TITLES.get(status, "Error")
        self.headers = headers or {}
        self.extra = extra

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": PROBLEM_BASE + self.kind, "title": self.title,
                                "status": self.status, "detail": self.detail}
        body.update({k: v for k, v in self.extra.items() if v is not None})
        return body

    def response(self) -> Response:
        resp = Response(json.dumps(self.to_dict()), status=self.status, mimetype=CONTENT_TYPE)
        for k, v in self.headers.items():
            resp.headers[k] = v
        return resp


def _slug(text: str) -> str:
    return "-".join(text.lower().split())


def validation(field: str, message: str) -> Problem:
    return Problem(400, f"{field}: {message}", kind="validation-error", title="Invalid TaskRequest",
                   field=field)


def not_found(what: str, ident: str) -> Problem:
    return Problem(404, f"{what} {ident!r} not found", kind="not-found")


def unavailable(detail: str) -> Problem:
    return Problem(503, detail, kind="redis-unavailable", title="Service Unavailable",
                   headers={"Retry-After": "5"})
