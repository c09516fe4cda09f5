"""A store with a payload key across the 0.1.0 -> 0.2.0 upgrade (issues #31, #35; docs/upgrading.md, "A store with
a payload codec"): codec format 2 binds each value to its place, so the two releases cannot read each other's
values. 0.1.0 refuses format 2 as newer; this code with keys refuses what 0.1.0 encrypted unless it runs with
`read_unsealed`, and `lousho reseal` makes those values readable without it. Why a keyed fleet is not rolled
worker by worker, and why there is no rollback once this code has written."""

from __future__ import annotations

import base64
import subprocess
import textwrap
from pathlib import Path

import pytest
import redis

from lousho.checkpoint import Checkpoint
from lousho.errors import UnsealedValueError
from lousho.operations import Target, reseal_sessions
from lousho.stores.codec import PayloadCodec
from lousho.stores.redis import RedisStore
from tests.release.previous_release import Release, shared_release
from tests.stores.codecs import KEY_1

pytestmark = pytest.mark.slow  # builds and installs the previous release's wheel

SECRET = "card 4242-4242"

OLD_SIDE = textwrap.dedent(
    """
    import base64, sys
    from lousho.checkpoint import Checkpoint
    from lousho.messages import Message
    from lousho.stores.codec import PayloadCodec
    from lousho.stores.redis import RedisStore

    url, prefix, key, action = sys.argv[1:5]
    store = RedisStore(url, prefix=prefix, codec=PayloadCodec(keys={"k1": base64.b64decode(key)}))
    if action == "write":
        first = Checkpoint(session_id="s1", version=1, messages=[Message.user("card 4242-4242")])
        store.checkpoints.save("s1", first)
        second = first.model_copy(update={"version": 2, "messages": [*first.messages, Message.assistant("paid")]})
        store.checkpoints.save("s1", second)
    else:
        try:
            print(store.checkpoints.load("s1").version)
        except Exception as exc:
            print(type(exc).__name__, exc)
            sys.exit(3)
    """
)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Release:
    release = shared_release(tmp_path_factory)  # with its `encryption` extra, as a user with keys installs it
    return release


def old_side(release: Release, redis_url: str, prefix: str, action: str) -> subprocess.CompletedProcess[str]:
    key = base64.b64encode(KEY_1).decode()
    return subprocess.run(
        [release.python, "-I", "-c", OLD_SIDE, redis_url, prefix, key, action],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_keyed_store_needs_a_reseal_after_0_1_0_and_0_1_0_cannot_read_what_0_2_writes(
    previous: Release, redis_url: str, redis_prefix: str, redis_client: redis.Redis
) -> None:
    written = old_side(previous, redis_url, redis_prefix, "write")
    assert written.returncode == 0, written.stderr[-2000:]

    strict = RedisStore(redis_client, prefix=redis_prefix, codec=PayloadCodec(keys={"k1": KEY_1}))
    with pytest.raises(UnsealedValueError, match=r"lousho 0\.1"):
        strict.checkpoints.load("s1")  # 0.1.0's values do not name their place: refused with keys

    migrating = RedisStore(
        redis_client, prefix=redis_prefix, codec=PayloadCodec(keys={"k1": KEY_1}, read_unsealed=True)
    )
    loaded = migrating.checkpoints.load("s1")
    assert loaded is not None and loaded.messages[0].content == SECRET
    reseal_sessions(Target(migrating), ["s1"])

    strict = RedisStore(redis_client, prefix=redis_prefix, codec=PayloadCodec(keys={"k1": KEY_1}))
    latest = strict.checkpoints.load("s1")
    assert latest == loaded  # re-sealed: read without the migration setting
    strict.checkpoints.save("s1", Checkpoint.model_validate({**latest.model_dump(), "version": 3}))
    assert strict.checkpoints.load("s1") is not None

    # No rollback: 0.1.0 refuses every value this code encoded, as written by a newer lousho.
    refused = old_side(previous, redis_url, redis_prefix, "read")
    assert refused.returncode == 3, refused.stdout + refused.stderr[-2000:]
    assert "PayloadDecodeError" in refused.stdout and "codec format 2" in refused.stdout


def test_the_upgrade_doc_states_the_codec_format_change_and_its_order() -> None:
    """docs/upgrading.md and CHANGELOG.md say what the test above shows (issue #35: stored-format changes per
    release), and that the rolling-upgrade test covers no keyed store."""
    root = Path(__file__).resolve().parents[2]
    upgrading = (root / "docs" / "upgrading.md").read_text()
    section = upgrading.split("## A store with a payload codec", 1)[1].split("\n## ", 1)[0]
    for said in ("codec format 2", "LOUSHO_PAYLOAD_READ_UNSEALED=1", "lousho reseal --all", "Rolling back to 0.1.0"):
        assert said in section, said
    assert "runs on a store without a codec only" in section
    unreleased = (root / "CHANGELOG.md").read_text().split("## Unreleased", 1)[1].split("\n## ", 1)[0]
    for said in ("codec format 2", "read_unsealed", "lousho reseal --all", "max_payload_bytes", "metrics_public"):
        assert said in unreleased, said
