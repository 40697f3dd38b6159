"""Nothing a client sends stops storage for anyone (issue 10, point 1).

The campaign's poison request: an Anthropic request whose ``metadata.user_id``
holds ``{"session_id":"\\ud800"}`` killed the writer thread, and every later
turn of every user was dropped while ``/health`` said ok.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import anthropic
import orjson
import pytest

from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.store.sanitize import storable
from lore_gateway.protocols.common import Message
from lore_gateway.testing import ANTHROPIC_KEY, FakeUpstream

POISON_USER_ID = '{"session_id":"\\ud800", "device_id":"x\\u0000y"}'


def wait_stored(gw: Any, session: str, turns: int = 1) -> None:
    deadline = time.monotonic() + 20
    while gw.memory.count_turns(None, session=session) < turns:
        assert time.monotonic() < deadline, f"turn of {session!r} never stored"
        gw.memory.flush(timeout=10)
        time.sleep(0.01)


def health(gw: Any) -> dict[str, Any]:
    with urllib.request.urlopen(gw.url + "/health", timeout=5) as response:
        body: dict[str, Any] = orjson.loads(response.read())
        return body


def test_a_poison_request_is_stored_and_later_turns_are_found_by_recall(
    make_gateway: Any, fake_upstream: FakeUpstream,
) -> None:
    gw = make_gateway()
    client = anthropic.Anthropic(base_url=gw.url, api_key=ANTHROPIC_KEY, max_retries=0)
    poisoned = client.messages.create(
        model="claude-x", max_tokens=50, metadata={"user_id": POISON_USER_ID},
        messages=[{"role": "user", "content": "a poisoned request with a NUL \x00 in it"}],
    )
    assert poisoned.content
    gw.memory.flush(timeout=10)
    # A tool offered makes it the agent's own turn: a one-shot request without tools
    # is a side channel (knowledge/sidechannel.py), and search never returns those.
    client.messages.create(
        model="claude-x", max_tokens=50,
        extra_headers={"x-lore-session-id": "after-poison"},
        messages=[{"role": "user", "content": "the zanzibar deployment key rotates weekly"}],
        tools=[{"name": "read_file", "description": "Read a file.",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
    )
    wait_stored(gw, "after-poison")
    tenant = gw.memory.sessions(None)[0].tenant
    found = gw.memory.search_sync("zanzibar deployment", scope="all",
                                  identity=Identity(tenant, "unknown", "after-poison"))
    assert any("zanzibar" in hit.content for hit in found.hits)
    # The poisoned turn itself is stored too, under a storable session id.
    sessions = {s.session for s in gw.memory.sessions(None)}
    assert "\ufffd" in "".join(sessions)
    assert health(gw)["status"] == "ok"


def test_a_turn_that_cannot_be_written_is_skipped_and_the_writer_goes_on(
    make_gateway: Any,
) -> None:
    gw = make_gateway()
    ident = Identity("t", "p", "bad-turn")
    # A message whose text is not a str fails inside write_turn (not apsw.Error).
    bad = TurnRecord(identity=ident, protocol="chat", model=None, created_at=time.time(),
                     messages=(Message(role="user", text=12345),))  # type: ignore[arg-type]
    good = TurnRecord(identity=Identity("t", "p", "good-turn"), protocol="chat", model=None,
                      created_at=time.time(), messages=(Message(role="user", text="fine"),))
    assert gw.memory.submit_turn(bad)
    assert gw.memory.submit_turn(good)
    gw.memory.flush(timeout=10)
    assert gw.memory.count_turns(None, session="good-turn") == 1
    assert gw.memory.count_turns(None, session="bad-turn") == 0
    assert health(gw)["status"] == "ok"


def test_a_failing_writer_is_restarted_and_stores_later_turns(
    make_gateway: Any,
) -> None:
    # The writer thread's supervisor: it writes the turns with LORE_STORE_PROCESS
    # off, the jobs always, and the turns inside the storage process.
    gw = make_gateway(store_process=False)
    writer = gw.memory._writer
    boom = RuntimeError("disk on fire")
    # A failure outside any one turn (here: the batch writer itself) reaches the
    # supervisor loop, which reports it and reconnects.
    original = writer._write_batch

    def failing_once(conn: Any, batch: list[object]) -> None:
        writer._write_batch = original
        writer._done(len(batch))
        raise boom

    writer._write_batch = failing_once
    lost = TurnRecord(identity=Identity("t", "p", "lost"), protocol="chat", model=None,
                      created_at=time.time(), messages=(Message(role="user", text="x"),))
    assert gw.memory.submit_turn(lost)
    deadline = time.monotonic() + 10
    while writer.restarts == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "disk on fire" in (writer.last_error or "")
    later = TurnRecord(identity=Identity("t", "p", "later"), protocol="chat", model=None,
                       created_at=time.time(), messages=(Message(role="user", text="y"),))
    assert gw.memory.submit_turn(later)
    wait_stored(gw, "later")
    assert health(gw)["status"] == "ok"


def test_a_dead_storage_process_is_replaced_and_stores_later_turns(
    make_gateway: Any,
) -> None:
    gw = make_gateway()
    store = gw.memory._turn_store
    assert store is not None, "the gateway writes turns in its storage process"
    first = TurnRecord(identity=Identity("t", "p", "before"), protocol="chat", model=None,
                       created_at=time.time(), messages=(Message(role="user", text="x"),))
    assert gw.memory.submit_turn(first)
    wait_stored(gw, "before")
    dead = store._process
    dead.kill()
    dead.join(10)
    deadline = time.monotonic() + 20
    while store.restarts == 0 or not store.alive:
        assert time.monotonic() < deadline, "the storage process was not replaced"
        time.sleep(0.01)
    later = TurnRecord(identity=Identity("t", "p", "later"), protocol="chat", model=None,
                       created_at=time.time(), messages=(Message(role="user", text="y"),))
    assert gw.memory.submit_turn(later)
    wait_stored(gw, "later")
    assert gw.memory.count_turns(None, session="before") == 1
    assert health(gw)["status"] == "ok"


@pytest.mark.parametrize("text,expected", [
    ("plain", "plain"),
    ("caf\u00e9", "caf\u00e9"),
    ("lone \ud800 high", "lone \ufffd high"),
    ("nul\x00byte", "nul\ufffdbyte"),
    ("\U0001f4da ok", "\U0001f4da ok"),
])
def test_storable_replaces_only_lone_surrogates_and_nul(text: str, expected: str) -> None:
    assert storable(text) == expected
    storable(text).encode("utf-8")


def test_health_reports_degraded_memory_with_the_reason(make_gateway: Any) -> None:
    gw = make_gateway()
    gw.memory._writer.degraded = "memory writer cannot open the database: test"
    try:
        body = health(gw)
    finally:
        gw.memory._writer.degraded = None
    assert body["status"] == "degraded"
    assert body["memory"] == "degraded"
    assert "cannot open the database" in body["reason"]


def test_the_data_dir_is_created_owner_only(tmp_path: Any) -> None:
    from lore_gateway.obs.logging import configure_logging, log_file_path

    data = tmp_path / "fresh" / "lore"
    configure_logging("warning", "text", log_file_path(data))
    try:
        assert data.stat().st_mode & 0o777 == 0o700
        assert (data / "logs").stat().st_mode & 0o777 == 0o700
    finally:
        configure_logging("warning", "text", None)
