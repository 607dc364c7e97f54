"""Signing a browser in to the trajectory viewer (`/ui/`) with the API's own token.

`/ui/?token=T` (or a request with `Authorization: Bearer T`) sets a cookie and the browser is in
(T: the admin token or a scoped token with the `read` right, roles.py);
the token leaves the address bar at once (a redirect). The cookie holds an HMAC of the token,
not the token, so it dies when the token changes. It is HttpOnly, SameSite=Strict, scoped to
`/ui`, and it only opens GET/HEAD under `/ui/`: the viewer is read-only, so a cross-site request
could never change anything with it; everything else still needs the bearer header.

Tests: tests/api/test_ui.py.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

from flask import Response, g, redirect, request

from polar_mq.api.roles import TokenStore, digest, rule
from polar_mq.api.problems import Problem
from polar_mq.api.ui.pages import static_text

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
    html = static_text("signin.html").replace("{{message}}", message)
    return Response(html, status=401, mimetype="text/html")


def _viewer(token: str, expected: str, scoped: TokenStore | None) -> tuple[bool, str | None]:
    """(known, cookie): whether `token` may open the viewer and the cookie value that keeps it in.
    The admin token, or a scoped token whose role has the `read` right (roles.rule)."""
    if _same(token, expected):
        return True, cookie_value(expected)
    who = scoped.lookup(token) if scoped is not None else None
    if who is None:
        return False, None
    if who.role not in rule("GET", PREFIX + "/").roles:
        raise Problem(403, f"token {who.name!r} (role {who.role}) lacks the right 'read' needed for the viewer",
                      kind="forbidden", missing_right="read")
    return True, scoped_cookie(who.name, digest(token))


def scoped_cookie(name: str, token_digest: str) -> str:
    """A scoped token's cookie: its name and an HMAC keyed by the token's hash (dies with the token)."""
    return f"s.{name}." + hmac.new(token_digest.encode(), b"polar_mq trajectory viewer v1", hashlib.sha256).hexdigest()


def _cookie_ok(cookie: str, expected: str, scoped: TokenStore | None) -> bool:
    if _same(cookie, cookie_value(expected)):
        return True
    if scoped is None or not cookie.startswith("s."):
        return False
    name = cookie[2:].rpartition(".")[0]
    live = scoped.live_digest(name)
    return live is not None and _same(cookie, scoped_cookie(name, live))


def authorise(expected: str | None, scoped: TokenStore | None = None) -> Response | None:
    """The before-request check for `/ui` paths: None lets the request through; a response ends it
    (a redirect that sets the cookie, a sign-in page, or a 401 problem for the JSON endpoints)."""
    if not expected or request.path.startswith(f"{PREFIX}/static/"):
        return None  # the page shell's script and styles are no secret (the sign-in page needs them)
    offered = request.args.get("token")
    if offered is not None:
        known, cookie = _viewer(offered, expected, scoped)
        if not known or cookie is None:
            return sign_in_page("That token is not valid.")
        rest = {k: v for k, v in request.args.items() if k != "token"}
        resp = redirect(request.path + (f"?{urlencode(rest)}" if rest else ""), code=303)
        set_cookie(resp, cookie)
        return resp
    bearer = _bearer()
    if bearer is not None:
        known, cookie = _viewer(bearer, expected, scoped)
        if not known:
            raise Problem(401, "invalid bearer token", kind="unauthorized",
                          headers={"WWW-Authenticate": 'Bearer realm="polar-mq", error="invalid_token"'})
        g.ui_sign_in = cookie  # the after-request hook sets the cookie for the next page
        return None
    cookie = request.cookies.get(COOKIE)
    if cookie and request.method in READ_METHODS and _cookie_ok(cookie, expected, scoped):
        return None
    if request.path.startswith(f"{PREFIX}/api/"):
        raise Problem(401, "sign in: open /ui/?token=<token> or send Authorization: Bearer <token>",
                      kind="unauthorized", headers={"WWW-Authenticate": 'Bearer realm="polar-mq"'})
    return sign_in_page("Sign in with the rollout API token.")


def set_cookie(resp: Response, value: str) -> None:
    resp.set_cookie(COOKIE, value, max_age=COOKIE_MAX_AGE, path=PREFIX, httponly=True,
                    samesite="Strict", secure=request.is_secure)


def after_request(resp: Response) -> Response:
    cookie = g.pop("ui_sign_in", None)
    if cookie:
        set_cookie(resp, cookie)
    return resp
