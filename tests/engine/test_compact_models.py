"""What a worker holds for each step in flight (issue #29): checkpoints and model requests share their class's set of
fields (`lousho.compact`), and sessions of one agent share its system message."""

from __future__ import annotations

import copy
import pickle

import pytest

from lousho.checkpoint import Checkpoint
from lousho.inputs import start_session
from lousho.messages import Message
from lousho.providers.base import ModelRequest


def test_checkpoints_share_one_set_of_fields_and_dump_as_before() -> None:
    loaded = Checkpoint.model_validate_json(Checkpoint(session_id="s1").model_dump_json())
    made = Checkpoint(session_id="s2", messages=[Message.user("hi")])
    copied = made.model_copy(update={"version": 3})

    assert loaded.model_fields_set is made.model_fields_set is copied.model_fields_set
    assert loaded.model_fields_set == set(Checkpoint.model_fields)
    assert copied.version == 3 and made.version == 0
    assert made.model_dump(exclude_unset=True).keys() == made.model_dump().keys()
    assert pickle.loads(pickle.dumps(made)) == made and copy.deepcopy(made) == made


def test_a_model_request_shares_its_set_of_fields_too() -> None:
    one = ModelRequest(model="m", messages=[Message.user("a")])
    other = ModelRequest(model="m", messages=[Message.user("b")], session_id="s", step=2)
    assert one.model_fields_set is other.model_fields_set


def test_a_copy_that_names_no_field_of_the_model_is_refused() -> None:
    made = Checkpoint(session_id="s1")
    with pytest.raises(TypeError, match="no such fields"):
        made.model_copy(update={"verison": 3})


@pytest.mark.parametrize("change", ["discard", "clear", "subtract", "add_unknown"])
def test_the_shared_set_of_fields_does_not_change(change: str) -> None:
    fields = Checkpoint(session_id="s1").model_fields_set
    before = set(fields)
    with pytest.raises(TypeError):
        if change == "discard":
            fields.discard("version")
        elif change == "clear":
            fields.clear()
        elif change == "subtract":
            fields -= {"version"}
        else:
            fields.add("verison")
    assert Checkpoint(session_id="s2").model_fields_set == before


def test_sessions_that_start_with_the_same_instructions_share_their_system_message() -> None:
    one = start_session("s1", "You wait.", [Message.user("a")], None)
    other = start_session("s2", "You wait.", [Message.user("b")], None)
    assert one.messages[0] is other.messages[0]
    assert one.messages[0] == Message.system("You wait.")
