"""`AbortSignal`: how a caller stops a run, and how a running tool notices.

Python has no AbortController; this is the small part of one that a run needs.
It is thread-safe because sync tools run in worker threads and poll `aborted`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

__all__ = ["AbortSignal", "RunAborted"]


def void(_: object) -> None:
    """Drop a value (a callback must return None)."""


class RunAborted(Exception):
    """Raised inside the engine when the signal fires; never escapes `execute()`."""


class AbortSignal:
    """Fires once. `abort()` from any thread; `await wait()` or poll `aborted` in tools."""

    def __init__(self) -> None:
        # A flag under a lock, not a threading.Event (a Condition, a lock and a deque): a fleet worker holds a
        # signal for every step in flight, hundreds a process (issue #29).
        self._fired = False
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.reason: str | None = None

    @property
    def aborted(self) -> bool:
        return self._fired

    def abort(self, reason: str = "aborted") -> None:
        with self._lock:
            if self._fired:
                return
            self.reason = reason
            self._fired = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_abort(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` once when the signal fires (now, if it already has); returns an undo."""
        with self._lock:
            if not self._fired:
                self._callbacks.append(callback)
                return lambda: self._remove(callback)
        callback()
        return lambda: None

    def _remove(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    async def wait(self) -> None:
        """Return once the signal has fired."""
        loop = asyncio.get_running_loop()
        fired = asyncio.Event()
        undo = self.on_abort(lambda: void(loop.call_soon_threadsafe(fired.set)))
        try:
            await fired.wait()
        finally:
            undo()

    def raise_if_aborted(self) -> None:
        if self.aborted:
            raise RunAborted(self.reason)
