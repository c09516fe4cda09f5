"""The error for an optional extra that is not installed (issue #19)."""

from __future__ import annotations

from lousho.errors import ConfigurationError

__all__ = ["MissingExtraError", "missing_extra"]


class MissingExtraError(ConfigurationError, ModuleNotFoundError):
    """A telemetry module needs a package of an optional extra: the message says which to install. A
    `ModuleNotFoundError` too (`name` is the missing module), so a caller that makes do without it (the
    dashboard without `/metrics`) catches it as it would the import's own error."""


def missing_extra(extra: str, what: str, exc: ImportError) -> MissingExtraError:
    error = MissingExtraError(f"lousho's {what} need the {extra} extra: pip install 'lousho[{extra}]' ({exc})")
    error.name = exc.name
    return error
