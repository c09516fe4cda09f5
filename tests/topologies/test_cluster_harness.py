"""The Redis Cluster harness (`lousho.testing.redis_cluster`) survives a port taken between its probe and the node's
bind, as when tests four at a time start servers (a CI run met it)."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import redis

from lousho.testing.redis_cluster import RedisClusterNodes
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
