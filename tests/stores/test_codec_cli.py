"""`lousho` reads an encrypted store when the environment names its keys (LOUSHO_PAYLOAD_KEYS), and without
them says which key it needs, changing nothing (issue #17)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from lousho.messages import Message
from lousho.stores.sql import SqliteStore
from lousho.testing.store_contract.samples import sample_checkpoint
from tests.ops.conftest import LOUSHO, run_clean
from tests.stores.codecs import CODEC, KEY_1


def _env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOUSHO_") and k != "REDIS_URL"}
    return {**clean, "COLUMNS": "200", **extra}


@pytest.mark.slow  # 2-7 s: out of `scripts/check --fast` (issue #33)
def test_the_cli_reads_an_encrypted_store_with_the_keys_the_environment_names(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path, codec=CODEC)
    messages = [Message.user("what is the door code?"), Message.assistant("it is 7531-secret")]
    store.checkpoints.save("door", sample_checkpoint("door", status="finished", messages=messages))
    store.close()
    before = path.read_bytes()
    command = [LOUSHO, "--store-url", f"sqlite:///{path}", "show", "door"]

    keys = f"k1:{base64.b64encode(KEY_1).decode()}"
    shown = run_clean(command, env=_env(LOUSHO_PAYLOAD_KEYS=keys, LOUSHO_PAYLOAD_COMPRESS="1"))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "7531-secret" in shown.stdout

    refused = run_clean(command, env=_env())
    assert refused.returncode != 0
    assert "LOUSHO_PAYLOAD_KEY" in refused.stderr and "'k1'" in refused.stderr, refused.stderr[-3000:]
    assert "7531-secret" not in refused.stdout + refused.stderr
    assert path.read_bytes() == before
