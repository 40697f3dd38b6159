"""Supersession through a running gateway (issue 36, item 1 acceptance).

Three sessions of one project change two decisions: the datastore (Postgres →
SQLite → DuckDB) and the cache TTL (30 s → 300 s). The fake provider plays the
agent's model and the worker (distiller and curator). Afterwards recall for a
subject (``POST /lore/recall`` and the hidden recall tool's result) gives the
current value first and labels every older one superseded; the knowledge block
of the next session holds only the current values; and the question "what is
the cache TTL?" never shows the stale value without its label.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx

from lore_gateway.knowledge import history
from lore_gateway.knowledge import store as kstore
from lore_gateway.knowledge.block import BLOCK_HEADING
from lore_gateway.local_recall import LOCAL_RECALL_PATH, database_name
from lore_gateway.testing import ANTHROPIC_KEY, FakeUpstream, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kit import SYSTEM, TOOLS_ANTHROPIC, AnthropicSession, agent_requests, git_project, post, read

FAST = {"worker": True, "distill_segment_tokens": 1, "distill_idle_s": 3600,
        "worker_retry_base_s": 0.05}
SESSIONS = (
    ("one", ["Decision: the datastore is Postgres. It runs in production already.",
             "Decision: the cache TTL is 30 s. Short enough for the pricing page."]),
    ("two", ["Decision: switch the datastore from Postgres to SQLite. One file ships easily."]),
    ("three", ["Decision: use DuckDB for the datastore. Analytics queries dominate now.",
               "Decision: set the cache TTL to 300 s. The backend was thrashing."]),
)
# What each session's decisions leave in the knowledge entries.
CURRENT_AFTER = ({"Postgres", "30 s"}, {"SQLite", "30 s"}, {"DuckDB", "300 s"})
STALE_TTL = re.compile(r"cache TTL is 30 s")
STALE_STORE = re.compile(r"datastore is Postgres|from Postgres to SQLite")


def knowledge(gw: Any) -> list[kstore.Entry]:
    return list(read(gw, lambda c: kstore.entries(c, None, None)))


def holds(gw: Any, values: set[str]) -> bool:
    text = "\n".join(e.content for e in knowledge(gw))
    return len(knowledge(gw)) == 2 and all(v in text for v in values)


def recall_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("- (")]


def assert_current_first(lines: list[str], current: str, stale: re.Pattern[str]) -> None:
    assert lines and current in lines[0] and "(superseded by" not in lines[0], lines
    staled = [line for line in lines if stale.search(line)]
    assert staled, lines  # the old statements are found, and ...
    for line in staled:  # ... each says which message replaced it
        assert re.search(r"\(superseded by t:\d+\)$", line), line


def test_a_decision_changed_twice_is_recalled_current_first_and_the_block_holds_only_it(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**FAST)
    for (name, lines), current in zip(SESSIONS, CURRENT_AFTER, strict=True):
        session = AnthropicSession(gw, project, f"supersede-{name}")
        for line in lines:
            session.say(line)
        wait_until(lambda current=current: holds(gw, current),  # type: ignore[misc]
                   f"the curator's entries after session {name}")

    # Knowledge: one entry per subject, holding the newest value; the older ones
    # are versions of it, the change kind "superseded".
    entries = knowledge(gw)
    (datastore,) = [e for e in entries if "datastore" in e.content]
    assert "DuckDB" in datastore.content and "Postgres" not in datastore.content
    changes = [v.change for v in read(gw, lambda c: history.versions(c, None, datastore.id))]
    assert changes.count(history.SUPERSEDED) == 2, changes

    # The next session's block: only the current values.
    fake_upstream.reset()
    AnthropicSession(gw, project, "supersede-four").say("Where were we?")
    (opening,) = agent_requests(fake_upstream)
    block = str(opening.json["system"])
    assert BLOCK_HEADING in block and "DuckDB" in block and "300 s" in block
    assert not re.search(r"Postgres|SQLite|\b30 s\b", block), block

    # POST /lore/recall (what `lore recall` asks the gateway).
    def ask(query: str) -> dict[str, Any]:
        body = {"db": database_name(gw.settings), "query": query, "limit": 10,
                "scope": "all", "project": str(project)}
        answer: dict[str, Any] = httpx.post(gw.url + LOCAL_RECALL_PATH, json=body,
                                            timeout=120).json()
        return answer

    found = ask("which datastore")
    assert_current_first(recall_lines(found["rendered"]), "DuckDB", STALE_STORE)
    by_ref = {h["ref"]: h for h in found["hits"]}
    assert "DuckDB" in found["hits"][0]["content"]
    for h in found["hits"]:
        if STALE_STORE.search(h["content"]):
            assert "DuckDB" in by_ref[h["superseded_by"]]["content"], h
    ttl = ask("cache TTL")
    assert_current_first(recall_lines(ttl["rendered"]), "300 s", STALE_TTL)

    # The hidden recall tool, for the negative control question.
    fake_upstream.script(["recall:what is the cache TTL?", "text:It is 300 s."])
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is the cache TTL?"}]}]
    post(gw.url + "/v1/messages", {
        "model": "claude-fake", "max_tokens": 256, "stream": True,
        "system": SYSTEM + f"\nPrimary working directory: {project}",
        "tools": TOOLS_ANTHROPIC, "messages": messages},
        {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
         "x-lore-session-id": "supersede-five"})
    follow = fake_upstream.model_requests[-1].json["messages"][-1]["content"]
    (result,) = [b for b in follow if b.get("type") == "tool_result"]
    text = "".join(part["text"] for part in result["content"]) \
        if isinstance(result["content"], list) else str(result["content"])
    assert_current_first(recall_lines(text), "300 s", STALE_TTL)
