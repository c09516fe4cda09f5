"""Passwords out of everything lousho shows: URLs in errors, logs and reprs (issue #21).

`redact_url` is the one way to show a URL that may carry a password; `redact_secrets` takes a
URL's password out of a driver's message that may repeat it. Neither parser lousho already
depends on does the whole job, so this is done here once: kombu's `maybe_sanitize_url` drops the
query string (where the database number lives) and raises on a bad port; SQLAlchemy's
`make_url(...).render_as_string(hide_password=True)` leaves `?password=` in plain text and splits
`user:p@ss@host` at the first `@` (redis-py and urllib split at the last one, so the rest of that
password would show as the host); both give up on text that is not a URL at all.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["MASK", "redact_secrets", "redact_url", "url_password", "url_secrets"]

MASK = "***"

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_SECRET_PARAMETER = re.compile(r"(?i)([?&;][^=&;#]*(?:pass|pwd|secret|token)[^=&;#]*=)([^&;#]*)")
_PIECE_SEPARATORS = re.compile(r"[/?#@:]")
_SHORTEST_PIECE = 4
"""Pieces of a password shorter than this are not searched for in messages: replacing every `a`
of a message would garble it, and so short a piece tells nothing about the password."""


def _split_user_info(url: str) -> tuple[str, str | None, str | None, str]:
    """(before the user, user, password, from the `@` on), or (url, None, None, "") without user info.

    The user info ends at the LAST `@`, as redis-py and urllib read it (an unescaped `@` in a
    password is common); `scheme:///path` has no user info (sqlite, file, unix paths may hold `@`)."""
    scheme = _SCHEME.match(url)
    head = scheme.group(0) if scheme else ""
    rest = url[len(head) :]
    if "@" not in rest or (scheme is not None and rest.startswith("/")):
        return url, None, None, ""
    user_info, _, after = rest.rpartition("@")
    user, colon, password = user_info.partition(":")
    return head, user, password if colon else None, "@" + after


def redact_url(url: str) -> str:
    """`url` with its password shown as `***`: in the user info (`redis://:***@host:6379/0`) and in
    password-like query parameters (`unix:///run/redis.sock?db=0&password=***`).

    The scheme, user, host, port, path and database stay, so a reader can tell which URL it is.
    Text that is not a URL is masked the same way (what follows the first `:` of the part before
    the last `@`): a mistyped URL still never shows its password."""
    head, user, password, after = _split_user_info(url)
    if user is not None:
        url = head + user + ("" if password is None else ":" + _masked(password)) + after
    return _SECRET_PARAMETER.sub(lambda found: found.group(1) + _masked(found.group(2)), url)


def _masked(secret: str) -> str:
    """`***` for a secret, nothing for an empty one (`redis://:@host` has no password to hide)."""
    return MASK if secret else ""


def url_password(url: str) -> str | None:
    """The password of `url`'s user info as written (up to its last `@`), percent-decoded; None without one.

    A driver that reads another (urllib ends the user info at the first `/ ? #`, SQLAlchemy at the
    first `@`) would put the rest of it into the host or the socket path, which messages show: a
    store refuses such a URL instead (issue #21)."""
    _, _, password, _ = _split_user_info(url)
    return unquote(password) if password else None


def url_secrets(url: str) -> list[str]:
    """What of `url` must never be shown: its password and password-like query values, as written
    and percent-decoded, and each long enough piece of them between `/ ? # @ :` (a driver that
    misreads such a URL quotes a piece of the password as a host or a port)."""
    _, _, password, _ = _split_user_info(url)
    values = [password or "", *(found.group(2) for found in _SECRET_PARAMETER.finditer(url))]
    secrets: set[str] = set()
    for value in filter(None, values):
        for form in (value, unquote(value)):
            secrets.add(form)
            secrets.update(piece for piece in _PIECE_SEPARATORS.split(form) if len(piece) >= _SHORTEST_PIECE)
    return sorted(secrets, key=len, reverse=True)


def redact_secrets(text: str, *secrets: str | None) -> str:
    """`text` with every occurrence of each secret replaced by `***` (longest first, so a secret
    that holds another is masked whole)."""
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
