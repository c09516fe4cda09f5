"""What the OpenAI and Anthropic providers share: importing an SDK lazily, decoding tool-call
arguments, and turning an SDK's errors into `ProviderError`s that say whether a retry may help."""

from __future__ import annotations

import email.utils
import importlib
import json
import math
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Self

from lousho.errors import ConfigurationError, ProviderError
from lousho.messages import INVALID_JSON_KEY

__all__ = [
    "OwnedClient",
    "INVALID_JSON_KEY",
    "NO_KEY",
    "decode_arguments",
    "encode_arguments",
    "import_sdk",
    "is_error_result",
    "provider_error",
    "retry_after_seconds",
    "transport_errors",
]

NO_KEY = "lousho-no-api-key"
"""The API key sent to a local server (`base_url=`) when none is configured: such servers ignore it."""

RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""Besides 5xx: request timeout, conflict (a lock on the server's side) and rate limit."""

RETRYABLE_ERROR_TYPES = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "timeout_error", "server_error", "internal_error"}
)
"""Error types a server may send inside a stream (HTTP 200) for a failure a retry may fix."""


def import_sdk(module: str, extra: str, provider: str) -> ModuleType:
    """Import an optional SDK, or say exactly what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(
            f"{provider} needs the {module!r} package, which is not installed: pip install 'lousho[{extra}]'"
        ) from exc


def decode_arguments(raw: str | None) -> dict[str, Any]:
    """A tool call's JSON arguments as a dict; anything else is kept under `INVALID_JSON_KEY`."""
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {INVALID_JSON_KEY: raw}
    return value if isinstance(value, dict) else {INVALID_JSON_KEY: raw}


def encode_arguments(arguments: Mapping[str, Any]) -> str:
    """The JSON text of a call's arguments, as the model sent it (its raw text when it was not valid JSON)."""
    raw = arguments.get(INVALID_JSON_KEY)
    if isinstance(raw, str) and len(arguments) == 1:
        return raw
    return json.dumps(dict(arguments), ensure_ascii=False)


def is_error_result(content: str | None) -> bool:
    """A tool message whose JSON is lousho's error shape (`{"error": ..., "note": ...}`)."""
    if not content:
        return False
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """The wait a server asked for: `retry-after-ms`, or `Retry-After` in seconds or as an HTTP date. None when it
    asked for none that can be kept: no header, or one that is 0, negative, a date past, or not a finite number
    (the retry then waits the exponential backoff, `lousho.backoff`)."""
    if not headers:
        return None
    millis = _positive(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if not value:
        return None
    seconds = _positive(value)
    if seconds is not None or _is_number(value):
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return _positive(str(when.timestamp() - time.time()))


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _positive(value: str | None) -> float | None:
    """`value` as a finite number of more than 0, else None."""
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP libraries' own network errors (raised, unwrapped, while a stream is read)."""
    found: list[type[BaseException]] = []
    for name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        error = getattr(module, "TransportError", None)
        if isinstance(error, type) and issubclass(error, BaseException):
            found.append(error)
    return tuple(found)


def _server_message(body: Any, fallback: str) -> str:
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        return str(error["message"])
    return fallback


def _error_type(body: Any) -> str | None:
    error = body.get("error", body) if isinstance(body, Mapping) else None
    kind = error.get("type") if isinstance(error, Mapping) else None
    return kind if isinstance(kind, str) else None


def _hint(status: int | None, api_key_env: str) -> str:
    if status == 401:
        return f"; check the API key (api_key= or {api_key_env})"
    if status == 403:
        return "; the API key may not have access to this model"
    if status == 404:
        return "; check the model id and base_url"
    if status == 429:
        return "; rate limited"
    if status in (400, 422):
        return "; the request was refused as it is, retrying will not help"
    return ""


def provider_error(
    exc: BaseException, *, sdk: ModuleType, provider: str, model: str, api_key_env: str
) -> ProviderError:
    """Translate an SDK (or HTTP library) error: rate limits, timeouts, lost connections and 5xx are
    retryable (the engine retries them, bounded, with backoff); other 4xx are not."""
    where = f"{provider} (model {model!r})"
    status_error = getattr(sdk, "APIStatusError", None)
    timeout_error = getattr(sdk, "APITimeoutError", None)
    connection_error = getattr(sdk, "APIConnectionError", None)
    api_error = getattr(sdk, "APIError", None)
    if isinstance(status_error, type) and isinstance(exc, status_error):
        status: int = getattr(exc, "status_code", 0)
        body = getattr(exc, "body", None)
        message = _server_message(body, str(exc))
        if status < 400:  # an error event inside a stream that had started fine
            retryable = _error_type(body) in RETRYABLE_ERROR_TYPES
            return ProviderError(f"{where} failed mid-stream: {message}", retryable=retryable)
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        retry_after = retry_after_seconds(headers) if headers is not None else None
        retryable = status in RETRYABLE_STATUSES or status >= 500
        return ProviderError(
            f"{where} answered HTTP {status}: {message}{_hint(status, api_key_env)}",
            retryable=retryable,
            status=status,
            retry_after_s=retry_after,
        )
    if isinstance(timeout_error, type) and isinstance(exc, timeout_error):
        return ProviderError(f"{where} timed out", retryable=True)
    if isinstance(connection_error, type) and isinstance(exc, connection_error):
        cause = exc.__cause__ or exc.__context__
        detail = f": {cause}" if cause is not None else ""
        return ProviderError(f"{where}: the connection failed{detail}", retryable=True)
    if isinstance(exc, transport_errors()):
        return ProviderError(f"{where}: the connection failed ({type(exc).__name__}: {exc})", retryable=True)
    if isinstance(api_error, type) and isinstance(exc, api_error):
        body = getattr(exc, "body", None)
        retryable = _error_type(body) in RETRYABLE_ERROR_TYPES
        return ProviderError(f"{where} failed: {_server_message(body, str(exc))}", retryable=retryable)
    return ProviderError(f"{where} failed: {type(exc).__name__}: {exc}", retryable=False)


class OwnedClient:
    """Closing an SDK client the provider made itself (a client passed in is the caller's to close)."""

    client: Any
    _owns_client: bool

    async def aclose(self) -> None:
        """Close the HTTP connections of a client this provider created (a passed client is left open)."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
