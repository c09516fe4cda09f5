"""The Redis Cluster and Sentinel harnesses (`lousho.testing.redis_cluster`, `lousho.testing.sentinel`) survive a
server that exits at once, as one whose port was taken between the probe and its bind by a server a test beside it
started (tests run four files at a time; a CI run met it)."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import redis

from lousho.testing.redis_cluster import RedisClusterNodes
from lousho.testing.sentinel import SentinelGroup
from tests.topologies.cluster_fleet import require_cluster_binaries


def test_a_node_whose_port_was_taken_starts_again_on_another_port() -> None:
    require_cluster_binaries()
    nodes = RedisClusterNodes(nodes=1)
    folder = nodes._dir = Path(tempfile.mkdtemp(prefix="lousho-harness-"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        try:
            nodes._start_node(port)  # it cannot bind: the port is taken

            answered = nodes._up(port)

            assert answered != port
            with redis.Redis(port=answered, socket_timeout=5) as client:
                assert client.ping()
        finally:
            nodes.stop()
    assert not folder.exists(), "the harness removes its nodes' folders"


def test_a_sentinel_groups_server_that_exits_at_once_starts_again_on_another_port() -> None:
    require_cluster_binaries()
    group = SentinelGroup(replicas=0, sentinels=0)
    folder = group._dir = Path(tempfile.mkdtemp(prefix="lousho-harness-"))
    tried: list[int] = []

    def start(port: int) -> None:
        tried.append(port)
        if len(tried) == 1:  # a server that cannot start, as one whose port another took
            group._spawn(port, [group.binary, "--port", str(port), "--no-such-directive", "yes"])
        else:
            group._start_data(port, None)

    try:
        port = group._started(start)

        assert tried == [tried[0], port] and port != tried[0]
        with redis.Redis(port=port, socket_timeout=5) as client:
            assert client.ping()
    finally:
        group.stop()
    assert not folder.exists(), "the harness removes its servers' folders"
