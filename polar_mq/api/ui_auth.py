"""Signing a browser in to the trajectory viewer (`/ui/`) with the API's own token.

`/ui/?token=T` (or a request with `Authorization: Bearer T`) sets a cookie and the browser is in;
the token leaves the address bar at once (a redirect). The cookie holds an HMAC of the token,
not the token, so it dies when the token changes. It is HttpOnly, SameSite=Strict, scoped to
`/ui`, and it only opens GET/HEAD under `/ui/`: the viewer is read-only, so a cross-site request
could never change anything with it; everything else still needs the bearer header.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

from flask import Response, g, redirect, request

from .problems import Problem

PREFIX = "/ui"
COOKIE = "polar_mq_ui"
COOKIE_MAX_AGE = 7 * 24 * 3600
READ_METHODS = frozenset({"GET", "HEAD"})


def cookie_value(token: str) -> str:
    return hmac.new(token.encode(), b"polar_mq trajectory viewer v1", hashlib.sha256).hexdigest()


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _bearer() -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def sign_in_page(message: str) -> Response:
    from .ui import static_text

    html = static_text("signin.html").replace("{{message}}", message)
    return Response(html, status=401, mimetype="text/html")


def authorise(expected: str | None) -> Response | None:
    """The before-request check for `/ui` paths: None lets the request through; a response ends it
    (a redirect that sets the cookie, a sign-in page, or a 401 problem for the JSON endpoints)."""
    if not expected or request.path.startswith(f"{PREFIX}/static/"):
        return None  # the page shell's script and styles are no secret (the sign-in page needs them)
    offered = request.args.get("token")
    if offered is not None:
        if not _same(offered, expected):
            return sign_in_page("That token is not valid.")
        rest = {k: v for k, v in request.args.items() if k != "token"}
        resp = redirect(request.path + (f"?{urlencode(rest)}" if rest else ""), code=303)
        set_cookie(resp, expected)
        return resp
    bearer = _bearer()
    if bearer is not None:
        if not _same(bearer, expected):
            raise Problem(401, "invalid bearer token", kind="unauthorized",
                          headers={"WWW-Authenticate": 'Bearer realm="polar-mq", error="invalid_token"'})
        g.ui_sign_in = expected  # the after-request hook sets the cookie for the next page
        return None
    cookie = request.cookies.get(COOKIE)
    if cookie and request.method in READ_METHODS and _same(cookie, cookie_value(expected)):
        return None
    if request.path.startswith(f"{PREFIX}/api/"):
        raise Problem(401, "sign in: open /ui/?token=<token> or send Authorization: Bearer <token>",
                      kind="unauthorized", headers={"WWW-Authenticate": 'Bearer realm="polar-mq"'})
    return sign_in_page("Sign in with the rollout API token.")


def set_cookie(resp: Response, token: str) -> None:
    resp.set_cookie(COOKIE, cookie_value(token), max_age=COOKIE_MAX_AGE, path=PREFIX, httponly=True,
                    samesite="Strict", secure=request.is_secure)


def after_request(resp: Response) -> Response:
    token = g.pop("ui_sign_in", None)
    if token:
        set_cookie(resp, token)
    return resp
