"""A TCP proxy in front of Redis that can make every open connection silently dead.

`cut()` is what a failover behind a virtual IP, a NAT or firewall that forgets its flows, or a host
that vanishes does to a client: the connections stay open on the client's side, nothing it sends
arrives, no reply, no FIN, no RST. New connections go through. A client that waits on a dead
connection without a timeout waits forever: that is how Celery workers "stop consuming" after Redis
goes away (celery #9054 and its kin); a restart on the same host closes sockets and is the easy case.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Link:
    client: socket.socket
    upstream: socket.socket
    dead: bool = False


@dataclass
class Blackhole:
    target: tuple[str, int]
    port: int = 0
    links: list[_Link] = field(default_factory=list)
    _server: socket.socket | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> int:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(128)
        server.settimeout(0.2)
        self._server, self.port = server, server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="blackhole").start()
        return self.port

    def cut(self) -> int:
        """Every connection open now goes silent for good. Returns how many."""
        with self._lock:
            live = [link for link in self.links if not link.dead]
            for link in live:
                link.dead = True
        return len(live)

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
        with self._lock:
            for link in self.links:
                for sock in (link.client, link.upstream):
                    with contextlib.suppress(OSError):
                        sock.close()

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            link = _Link(client, upstream)
            with self._lock:
                self.links.append(link)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(link, src, dst), daemon=True).start()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data = src.recv(65536)
            except OSError:
                break
            if not data:
                break
            if link.dead:
                continue  # swallowed: the peer never hears of it, and nobody closes anything
            try:
                dst.sendall(data)
            except OSError:
                break
        if not link.dead:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
