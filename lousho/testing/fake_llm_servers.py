"""A local HTTP server that speaks the OpenAI and Anthropic wire formats, for tests and demos.

`FakeLLMServer` answers `POST /v1/chat/completions` (OpenAI) and `POST /v1/messages`
(Anthropic), with or without `stream: true` (server-sent events), from a script of canned
turns, one per request, in order. It records every request body, so a test can check what
a provider sent and prove a model turn was (or was not) asked again. It runs on 127.0.0.1
with a free port, in a thread, and needs no API key::

    from lousho.testing.fake_llm_servers import FakeLLMServer, call, reply

    with FakeLLMServer([reply(tool_calls=[call("call_1", "weather", {"city": "Lisbon"})]),
                        reply("Sunny in Lisbon.")]) as server:
        provider = OpenAIProvider("gpt-4o-mini", base_url=server.openai_base_url)
        # or AnthropicProvider("claude-sonnet-4-5", base_url=server.anthropic_base_url)
        ...
        server.requests[0].body["tools"]

Script entries besides `reply()`: `rate_limited(retry_after=1)` (HTTP 429 with Retry-After),
`failure(400, "...")` (an error status), `cut_stream("text", after=2)` (a stream that sends
`after` text deltas, then drops the connection, as a crashing server or a network cut would).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

__all__ = [
    "FakeLLMServer",
    "RecordedRequest",
    "ScriptedCall",
    "Turn",
    "call",
    "cut_stream",
    "failure",
    "rate_limited",
    "reply",
]

Api = Literal["openai", "anthropic"]
PATHS: dict[str, Api] = {"/v1/chat/completions": "openai", "/chat/completions": "openai", "/v1/messages": "anthropic"}


@dataclass(frozen=True)
class ScriptedCall:
    """A tool call in a scripted turn; `arguments` as a string is sent as-is (it may be invalid JSON)."""

    id: str
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)

    @property
    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class Turn:
    """One scripted answer. Build it with `reply`, `rate_limited`, `failure` or `cut_stream`."""

    text: str | None = None
    tool_calls: tuple[ScriptedCall, ...] = ()
    input_tokens: int = 12
    output_tokens: int = 7
    status: int = 200
    error: str | None = None
    retry_after: str | None = None
    error_headers: tuple[tuple[str, str], ...] = ()
    """More headers of an error answer (`retry-after-ms`, say)."""
    cut_after: int | None = None
    """Stream only `cut_after` text deltas, then drop the connection (a plain request gets no answer)."""
    chunk_delay_s: float = 0.0
    """A pause before each streamed event, so a consumer can stop in the middle."""
    delay_s: float = 0.0
    """A pause before the answer starts (to make a client time out)."""


def call(id: str, name: str, arguments: dict[str, Any] | str | None = None) -> ScriptedCall:
    """A tool call `(id, name, arguments)`; a string is sent as the raw arguments text."""
    return ScriptedCall(id=id, name=name, arguments={} if arguments is None else arguments)


def reply(
    text: str | None = None,
    *,
    tool_calls: Iterable[ScriptedCall] = (),
    usage: tuple[int, int] = (12, 7),
    chunk_delay_s: float = 0.0,
    delay_s: float = 0.0,
) -> Turn:
    """A model turn: text, tool calls, or both; `usage` is `(input_tokens, output_tokens)`.
    `chunk_delay_s` paces a stream's events; `delay_s` waits before answering at all."""
    return Turn(
        text=text,
        tool_calls=tuple(tool_calls),
        input_tokens=usage[0],
        output_tokens=usage[1],
        chunk_delay_s=chunk_delay_s,
        delay_s=delay_s,
    )


def rate_limited(
    retry_after: float | str | None = 1,
    message: str = "Rate limit reached, try again later",
    *,
    headers: Mapping[str, str] | None = None,
) -> Turn:
    """HTTP 429 with a `Retry-After` header (seconds; None: no such header) and any other `headers`."""
    extra = tuple((headers or {}).items())
    return Turn(
        status=429, error=message, retry_after=None if retry_after is None else str(retry_after), error_headers=extra
    )


def failure(status: int = 400, message: str = "Invalid request") -> Turn:
    """An error status (400, 401, 404, 500, ...) with the API's error body."""
    return Turn(status=status, error=message)


def cut_stream(text: str = "This answer is cut", *, after: int = 2, chunk_delay_s: float = 0.0) -> Turn:
    """A streamed answer whose connection drops after `after` text deltas."""
    return Turn(text=text, cut_after=after, chunk_delay_s=chunk_delay_s)


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received."""

    api: Api | None
    path: str
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body.get("messages", [])
        return messages


def _pieces(text: str) -> list[str]:
    """Text split as a model streams it: a word (with its trailing space) per delta."""
    return re.findall(r"\S+\s*|\s+", text) or [text]


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


class _Stop(Exception):
    """The scripted cut: drop the connection."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read the request log instead
        pass

    def do_POST(self) -> None:
        try:
            self._answer()
        except (_Stop, OSError):
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def _answer(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"__raw__": raw.decode("utf-8", "replace")}
        api = PATHS.get(path)
        owner = self.server.owner
        request = RecordedRequest(
            api=api, path=path, body=body, headers={k.lower(): v for k, v in self.headers.items()}
        )
        owner._record(request)  # noqa: SLF001 -- the handler is this module's own
        if api is None:
            self._json(404, {"error": {"message": f"unknown path {path}", "type": "not_found_error"}})
            return
        turn = owner._next_turn(request)  # noqa: SLF001 -- the handler is this module's own
        if turn is None:
            self._error(api, 400, f"the fake server's script has no answer for request {len(owner.requests)}")
            return
        if turn.status != 200:
            headers = dict(turn.error_headers) | (
                {"retry-after": turn.retry_after} if turn.retry_after is not None else {}
            )
            self._error(api, turn.status, turn.error or "error", headers)
            return
        if turn.delay_s:
            time.sleep(turn.delay_s)
        model = str(body.get("model", "fake-model"))
        if not body.get("stream"):
            if turn.cut_after is not None:
                raise _Stop
            self._json(200, _openai_completion(turn, model) if api == "openai" else _anthropic_message(turn, model))
            return
        self._stream(api, turn, model, bool((body.get("stream_options") or {}).get("include_usage")))

    def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, api: Api, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}  # fmt: skip
        kind = kinds.get(status, "api_error" if status >= 500 else "invalid_request_error")
        if api == "openai":
            payload: dict[str, Any] = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        else:
            payload = {"type": "error", "error": {"type": kind, "message": message}}
        self._json(status, payload, headers)

    def _stream(self, api: Api, turn: Turn, model: str, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        events = _openai_events(turn, model, include_usage) if api == "openai" else _anthropic_events(turn, model)
        deltas = 0
        for event, is_delta in events:
            if turn.cut_after is not None and is_delta:
                if deltas >= turn.cut_after:
                    raise _Stop
                deltas += 1
            if turn.chunk_delay_s:
                time.sleep(turn.chunk_delay_s)
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        if turn.cut_after is not None:
            raise _Stop
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def _openai_completion(turn: Turn, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
            for c in turn.tool_calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if turn.tool_calls else "stop"}],
        "usage": {
            "prompt_tokens": turn.input_tokens,
            "completion_tokens": turn.output_tokens,
            "total_tokens": turn.input_tokens + turn.output_tokens,
        },
    }


def _openai_events(turn: Turn, model: str, include_usage: bool) -> Iterator[tuple[str, bool]]:
    """(SSE text, is a text delta) for one streamed chat completion."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        payload = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [choice]}  # fmt: skip
        return _sse(payload)

    yield chunk({"role": "assistant", "content": ""}), False
    for piece in _pieces(turn.text or "") if turn.text else []:
        yield chunk({"content": piece}), True
    for index, c in enumerate(turn.tool_calls):
        start = {"index": index, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
        yield chunk({"tool_calls": [start]}), False
        for part in _halves(c.arguments_json):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}), False
    yield chunk({}, "tool_calls" if turn.tool_calls else "stop"), False
    if include_usage:
        usage = {"prompt_tokens": turn.input_tokens, "completion_tokens": turn.output_tokens,
                 "total_tokens": turn.input_tokens + turn.output_tokens}  # fmt: skip
        payload = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [], "usage": usage}  # fmt: skip
        yield _sse(payload), False
    yield _sse("[DONE]"), False


def _anthropic_content(turn: Turn) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
    for c in turn.tool_calls:
        try:
            arguments = json.loads(c.arguments_json)
        except ValueError:
            arguments = {}
        content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": arguments})
    return content


def _anthropic_message(turn: Turn, model: str) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _anthropic_content(turn),
        "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": turn.input_tokens, "output_tokens": turn.output_tokens},
    }


def _anthropic_events(turn: Turn, model: str) -> Iterator[tuple[str, bool]]:
    """(SSE text, is a text delta) for one streamed message."""
    start = {**_anthropic_message(turn, model), "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": turn.input_tokens, "output_tokens": 1}
    yield _sse({"type": "message_start", "message": start}, "message_start"), False
    yield _sse({"type": "ping"}, "ping"), False
    index = 0
    if turn.text:
        block = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
        yield _sse(block, "content_block_start"), False
        for piece in _pieces(turn.text):
            delta = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}
            yield _sse(delta, "content_block_delta"), True
        yield _sse({"type": "content_block_stop", "index": index}, "content_block_stop"), False
        index += 1
    for c in turn.tool_calls:
        use = {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}
        yield _sse({"type": "content_block_start", "index": index, "content_block": use}, "content_block_start"), False
        for part in _halves(c.arguments_json):
            delta = {"type": "content_block_delta", "index": index,
                     "delta": {"type": "input_json_delta", "partial_json": part}}  # fmt: skip
            yield _sse(delta, "content_block_delta"), False
        yield _sse({"type": "content_block_stop", "index": index}, "content_block_stop"), False
        index += 1
    stop = "tool_use" if turn.tool_calls else "end_turn"
    delta_event = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                   "usage": {"output_tokens": turn.output_tokens}}  # fmt: skip
    yield _sse(delta_event, "message_delta"), False
    yield _sse({"type": "message_stop"}, "message_stop"), False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FakeLLMServer


class FakeLLMServer:
    """A real HTTP server on 127.0.0.1 (a free port) answering from `script`, one turn per request.

    Use it as a context manager (or `start()`/`stop()`). `requests` is every request received,
    in order; `add()` appends turns to the script while it runs.
    """

    def __init__(
        self,
        script: Iterable[Turn | str] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        respond: Callable[[RecordedRequest], Turn | str] | None = None,
    ) -> None:
        """`respond`, when given, answers each request instead of the script, from the request itself: many
        sessions asking at once, in any order (issue #29)."""
        self._script: list[Turn] = [reply(t) if isinstance(t, str) else t for t in script]
        self._respond = respond
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._answered = 0
        self._host, self._port = host, port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> FakeLLMServer:
        if self._server is None:
            server = _Server((self._host, self._port), _Handler)
            server.owner = self
            self._server = server
            self._thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-llm-server", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = None
            self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- addresses --------------------------------------------------------------

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`."""
        if self._server is None:
            raise RuntimeError("the fake server is not running: use it as a context manager or call start()")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        """The `base_url` for `OpenAIProvider` / `openai.AsyncOpenAI` (ends in `/v1`)."""
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """The `base_url` for `AnthropicProvider` / `anthropic.AsyncAnthropic`."""
        return self.url

    # -- the script and the log -------------------------------------------------

    def add(self, *turns: Turn | str) -> None:
        """Append turns to the script."""
        with self._lock:
            self._script.extend(reply(t) if isinstance(t, str) else t for t in turns)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, in order (also ones answered with an error or cut)."""
        with self._lock:
            return list(self._requests)

    @property
    def remaining(self) -> int:
        """Scripted turns not handed out yet."""
        with self._lock:
            return len(self._script) - self._answered

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _next_turn(self, request: RecordedRequest) -> Turn | None:
        if self._respond is not None:
            answer = self._respond(request)
            return reply(answer) if isinstance(answer, str) else answer
        with self._lock:
            if self._answered >= len(self._script):
                return None
            turn = self._script[self._answered]
            self._answered += 1
            return turn
