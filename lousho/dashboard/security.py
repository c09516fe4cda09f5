"""The dashboard's guards: read-only mode, cross-site requests refused, signed tokens, and the headers every
answer carries (issues #19, #31).

Cross-site: a double-submit token signed with the dashboard's secret. A GET sets a token in a cookie
(SameSite=Strict, HttpOnly) and every form carries it in a hidden field; a POST is refused with 403 unless its
field equals its cookie and the token bears the secret's signature (issue #31: a cookie someone else planted
for the host, of any length, is not enough) and is at most `CSRF_MAX_AGE_S` old. A browser also says where a
request comes from: a POST marked `Sec-Fetch-Site: cross-site`, or whose `Origin` is not this host, is refused
before the token is read.

What a POST did is told on the page it redirects to by a flash message in a cookie signed with the same secret,
read once; never by the URL (a link could otherwise make the page say anything, issue #31).

The secret: `secret=` of `create_dashboard`/`dashboard_router`, else `LOUSHO_DASHBOARD_SECRET`, else a random one
per process (enough for one process; give every process of a dashboard the same one).
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from itsdangerous import BadSignature, URLSafeTimedSerializer

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "CSRF_MAX_AGE_S",
    "FLASH_COOKIE",
    "SECRET_ENV",
    "SECURITY_HEADERS",
    "DashboardSecret",
    "GuardedRoute",
    "check_post",
    "csrf_token",
    "flash",
    "remember_token",
    "take_flash",
]

CSRF_COOKIE = "lousho_csrf"
CSRF_FIELD = "csrf_token"
CSRF_MAX_AGE_S = 12 * 3600
"""A form older than this is refused (reload the page for a new token)."""
FLASH_COOKIE = "lousho_flash"
FLASH_MAX_AGE_S = 120
SECRET_ENV = "LOUSHO_DASHBOARD_SECRET"

SECURITY_HEADERS = {
    # Only the dashboard's own files: no inline script or style, no other origin, no framing (issue #31).
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class DashboardSecret:
    """The secret the dashboard signs its CSRF tokens and flash messages with."""

    def __init__(self, secret: str | bytes | None = None) -> None:
        key = secret or os.environ.get(SECRET_ENV) or secrets.token_urlsafe(32)
        self.csrf = URLSafeTimedSerializer(key, salt="lousho-dashboard-csrf")
        self.flash = URLSafeTimedSerializer(key, salt="lousho-dashboard-flash")

    def attach(self, request: Request) -> None:
        """A router's dependency: the requests of its routes know the secret."""
        request.state.lousho_secret = self


def _secret(request: Request) -> DashboardSecret:
    found = getattr(request.state, "lousho_secret", None)
    if not isinstance(found, DashboardSecret):
        raise RuntimeError("a dashboard route without DashboardSecret.attach among its router's dependencies")
    return found


def _signed(serializer: URLSafeTimedSerializer, value: str | None, max_age_s: int) -> Any:
    """What `value` signed, or None when it is missing, forged or older than `max_age_s`."""
    if not value:
        return None
    try:
        return serializer.loads(value, max_age=max_age_s)
    except BadSignature:  # SignatureExpired is one too
        return None


def _cookie_path(request: Request) -> str:
    return request.scope.get("root_path") or "/"


def csrf_token(request: Request) -> str:
    """This browser's token: the cookie's while its signature holds, or a new one (set by `remember_token`)."""
    token = request.cookies.get(CSRF_COOKIE)
    if token and _signed(_secret(request).csrf, token, CSRF_MAX_AGE_S) is not None:
        return token
    new: str | None = getattr(request.state, "new_csrf_token", None)
    if new is None:
        new = str(_secret(request).csrf.dumps(secrets.token_urlsafe(16)))
        request.state.new_csrf_token = new
    return new


def remember_token(request: Request, response: Response) -> None:
    """Set the cookie when this request made a new token; drop the flash message the page showed."""
    token = getattr(request.state, "new_csrf_token", None)
    if token:
        response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path=_cookie_path(request))
    if getattr(request.state, "flash_taken", False):
        response.delete_cookie(FLASH_COOKIE, path=_cookie_path(request))


async def check_post(request: Request, *, read_only: bool) -> None:
    """Refuse a POST in read-only mode, from another site, or without the matching signed token (403)."""
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
    if _signed(_secret(request).csrf, sent, CSRF_MAX_AGE_S) is None:
        raise HTTPException(403, "the form's token is not this dashboard's, or too old: reload the page and try again")


def flash(request: Request, response: Response, text: str) -> Response:
    """Tell `text` on the next page this browser shows (a signed cookie, read once)."""
    signed = str(_secret(request).flash.dumps(text))
    response.set_cookie(
        FLASH_COOKIE, signed, max_age=FLASH_MAX_AGE_S, httponly=True, samesite="lax", path=_cookie_path(request)
    )
    return response


def take_flash(request: Request) -> str | None:
    """The flash message this browser carries, if the dashboard signed it (`remember_token` drops the cookie)."""
    carried = request.cookies.get(FLASH_COOKIE)
    if carried is None:
        return None
    request.state.flash_taken = True
    text = _signed(_secret(request).flash, carried, FLASH_MAX_AGE_S)
    return text if isinstance(text, str) else None


class GuardedRoute(APIRoute):
    """A dashboard route whose every answer, a refusal included, carries `SECURITY_HEADERS`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                response = await handler(request)
            except HTTPException as exc:
                exc.headers = {**SECURITY_HEADERS, **(exc.headers or {})}
                raise
            response.headers.update(SECURITY_HEADERS)
            return response

        return guarded
