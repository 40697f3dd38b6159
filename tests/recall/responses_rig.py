"""Helpers for the Responses recall tests that go through the real gateway.

A fact is stored by an ordinary turn first; then the fake model (scenario
``recall:<query>``) calls recall, and the gateway must answer from memory.
"""

from __future__ import annotations

import json
import time
from typing import Any

import openai

from lore_gateway.sse import SSEDecoder

KEY = "sk-recall-acceptance-0123456789"
TOOLS = [
    {
        "type": "function",
        "name": "exec",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]
FACT = "The staging database password rotation happens every Tuesday at 04:00 UTC."


def client(gw: Any, session: str, *, path: str = "/v1", scenario: str | None = None,
           key: str = KEY) -> openai.OpenAI:
    headers = {"x-lore-session-id": session, "x-lore-project": "/work/acceptance"}
    if scenario is not None:
        headers["x-fake-scenario"] = scenario
    return openai.OpenAI(base_url=gw.url + path, api_key=key, max_retries=0,
                         default_headers=headers)


def wait_stored(gw: Any, session: str, turns: int = 1) -> None:
    """Wait until ``session`` has ``turns`` stored turns (storage runs after delivery)."""
    deadline = time.monotonic() + 10
    while gw.memory.count_turns(None, session=session) < turns and time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        time.sleep(0.01)
    gw.memory.flush(timeout=10)
    assert gw.memory.count_turns(None, session=session) >= turns, "the turn was never stored"


def seed_fact(gw: Any, session: str, fact: str = FACT, *, path: str = "/v1") -> None:
    """One ordinary turn that states ``fact``, stored before the test goes on."""
    client(gw, session, path=path).responses.create(
        model="gpt-fake", input=f"{fact} Remember it.", tools=TOOLS  # type: ignore[arg-type]
    )
    wait_stored(gw, session)


def sse_events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    decoder = SSEDecoder()
    frames = decoder.feed(data) + decoder.close()
    return [(e.name, json.loads(e.data)) for e in frames if e.has_data and e.data != "[DONE]"]


def private_coverage_marks(gw: Any) -> list[bytes]:
    """What the executor's private coverage is made of for anything stored: the
    revision fingerprint of every stored message (``executor._revision``). None of
    it may ever reach a client."""
    import hashlib

    from lore_gateway.storage import db

    conn = db.connect(gw.memory.settings.database, readonly=True)
    try:
        contents = [str(row[0]) for row in conn.execute("SELECT content FROM messages")]
    finally:
        conn.close()
    return [hashlib.sha256(c.encode()).hexdigest()[:16].encode() for c in contents]
