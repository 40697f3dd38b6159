"""The pure rules of "not kept": the request header and private spans (privacy.py)."""

from __future__ import annotations

import orjson
import pytest

from lore_gateway.privacy import no_store_requested, redact_private, redact_turn
from lore_gateway.protocols.common import Message


@pytest.mark.parametrize(("value", "no_store"), [
    ("1", True), ("true", True), ("YES", True), (" on ", True), ("please", True), ("", True),
    ("0", False), ("false", False), ("No", False), ("off", False)])
def test_the_header_means_no_store_unless_it_says_store(value: str, no_store: bool) -> None:
    assert no_store_requested({"x-lore-no-store": value}) is no_store
    assert no_store_requested({"x-lore-session-id": "s"}) is False


def test_a_private_span_and_its_tags_become_one_placeholder() -> None:
    text, found = redact_private("deploy with <private>key 8842</private> then <PRIVATE>"
                                 "pin\n77</Private> ok")
    assert text == "deploy with [private] then [private] ok"
    assert found == ["key 8842", "pin\n77"]
    # An unclosed tag keeps the rest of the message private (the user meant it).
    assert redact_private("a <private>rest of it")[0] == "a [private]"
    assert redact_private("no tags here") == ("no tags here", [])


def test_a_turn_is_redacted_in_user_messages_and_wherever_it_repeats_the_text() -> None:
    secret = 'tok "π-42" zz'
    turn = (Message("user", f"use <private>{secret}</private> for the call"),
            Message("assistant", f"Calling with {secret}."),
            Message("assistant", "[tool_call:exec] " + orjson.dumps({"cmd": f"run {secret}"})
                    .decode()),
            Message("tool", "[tool:exec] printed <private>a literal tag</private>"),
            Message("assistant", "ok"))
    out = redact_turn(turn)
    assert out[0].text == "use [private] for the call"
    assert out[1].text == "Calling with [private]."
    assert secret not in out[2].text and "[private]" in out[2].text
    assert out[3] is turn[3]  # a tool's output is content: its tags are not read
    assert out[4] is turn[4]
    # Nothing to hide: the very same messages come back.
    plain = (Message("user", "hello"), Message("assistant", "no <private> here"))
    assert redact_turn(plain) == plain and redact_turn(plain)[1] is plain[1]


def test_a_short_private_text_is_not_searched_for_elsewhere() -> None:
    out = redact_turn((Message("user", "answer <private>no</private>"),
                       Message("assistant", "no problem")))
    assert out[0].text == "answer [private]" and out[1].text == "no problem"


def test_amnesia_rows_cover_everything_a_tenant_or_one_session() -> None:
    from lore_gateway.memory.data.amnesia import Amnesia, covering

    everything = Amnesia("all", None, None, 1.0, "cli")
    team = Amnesia("tenant", "alice", None, 2.0, "ui")
    one = Amnesia("session", "bob", "s:1", 3.0, "cli")
    assert covering([everything], "anyone", "any") is everything
    assert covering([team, one], "alice", "x") is team
    assert covering([team, one], "bob", "s:1") is one
    assert covering([team, one], "bob", "s:2") is None
    assert covering([team, one], "carol", "s:1") is None
    # Keys keep a session id's characters apart from the tenant's.
    assert one.key != Amnesia("session", "bob:s", "1", 3.0, "cli").key
