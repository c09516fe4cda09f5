"""The private redis-server helper: it starts, restarts on the same socket, and ends every process it started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lousho.testing.redis_server import RedisServer, private_redis, redis_url


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_start_restart_stop() -> None:
    server = RedisServer()
    url = server.start()
    pid, folder = server.pid, server.data_dir
    assert pid is not None and url == f"unix://{folder}/redis.sock"
    client = server.client()
    assert client.ping() and client.config_get("save") == {"save": ""}
    client.set("k", "v")
    assert server.restart() == url and server.pid != pid and not _alive(pid)
    assert client.get("k") is None, "without appendonly a restart starts empty"
    client.close()
    last = server.pid
    server.stop()
    assert server.pid is None and last is not None and not _alive(last) and not Path(folder).exists()


def test_appendonly_keeps_data_across_a_sigkill_restart() -> None:
    with RedisServer(appendonly=True, appendfsync="always") as server:
        client = server.client()
        client.set("k", "kept")
        server.restart(kill=True)
        assert client.get("k") == b"kept"
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.close()


def test_private_redis_and_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    with private_redis() as url:
        socket_path = url.removeprefix("unix://")
        assert Path(socket_path).exists()
    assert not Path(socket_path).parent.exists()
    monkeypatch.setenv("REDIS_URL", "redis://example.invalid:6379/0")
    with redis_url() as url:
        assert url == "redis://example.invalid:6379/0"
