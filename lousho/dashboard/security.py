"""The dashboard's guards on POST: read-only mode, and cross-site requests refused (issue #19).

Cross-site: a double-submit token. A GET sets a random token in a cookie (SameSite=Strict, HttpOnly) and
every form carries it in a hidden field; a POST whose field does not match its cookie is refused with 403.
A browser also says where a request comes from: a POST marked `Sec-Fetch-Site: cross-site`, or whose
`Origin` is not this host, is refused before the token is read. A site on another origin can neither read
the cookie nor make the browser send it (SameSite), so it cannot forge the field.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, Response

__all__ = ["CSRF_COOKIE", "CSRF_FIELD", "check_post", "csrf_token"]

CSRF_COOKIE = "lousho_csrf"
CSRF_FIELD = "csrf_token"


def csrf_token(request: Request) -> str:
    """This browser's token: the cookie's, or a new one (set on the response by `remember_token`)."""
    token = request.cookies.get(CSRF_COOKIE)
    if token and len(token) >= 32:
        return token
    new: str | None = getattr(request.state, "new_csrf_token", None)
    if new is None:
        new = secrets.token_urlsafe(32)
        request.state.new_csrf_token = new
    return new


def remember_token(request: Request, response: Response) -> None:
    """Set the cookie when this request made a new token."""
    token = getattr(request.state, "new_csrf_token", None)
    if token:
        path = request.scope.get("root_path") or "/"
        response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path=path)


async def check_post(request: Request, *, read_only: bool) -> None:
    """Refuse a POST in read-only mode, from another site, or without the matching token (403)."""
    if read_only:
        raise HTTPException(403, "this dashboard is read-only: nothing can be changed from it")
    if request.headers.get("sec-fetch-site") == "cross-site":
        raise HTTPException(403, "a request from another site is refused (Sec-Fetch-Site: cross-site)")
    origin = request.headers.get("origin")
    # Behind a proxy the public host may come as X-Forwarded-Host; a cross-site form cannot set either header.
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")} - {None}
    if origin and origin != "null" and urlsplit(origin).netloc not in hosts:
        raise HTTPException(403, f"a request from another origin ({origin}) is refused")
    form = await request.form()
    sent, kept = form.get(CSRF_FIELD), request.cookies.get(CSRF_COOKIE)
    if not isinstance(sent, str) or not kept or not hmac.compare_digest(sent, kept):
        raise HTTPException(403, "the form's token does not match this browser's: reload the page and try again")
