"""Search in the coding domain and honest scores, on the real store.

Identifiers match as phrases, an edit question finds the message that made the
edit, a tool output is found through the command that produced it, scores say
how well the query matched (a nonsense query finds nothing), and the recall
tool's own traffic never comes back as a hit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.search.query import identifiers, intent_phrases, parse_query
from lore_gateway.memory.search.render import NO_RESULTS, is_recall_traffic, render
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.store.turn_rows import write_turn
from lore_gateway.protocols.common import Message, Role
from lore_gateway.storage import db, schema

ME = Identity("tenant-a", "proj-x", "s1")
NONSENSE = "zzqx quasar xylophone marmalade"


def _turn(*pairs: tuple[Role, str], ident: Identity = ME, at: float = 1.7e9) -> TurnRecord:
    return TurnRecord(identity=ident, protocol="responses", model="m",
                      messages=tuple(Message(r, t) for r, t in pairs), created_at=at)


def _store(memory: Memory, *turns: TurnRecord) -> None:
    for t in turns:
        assert memory.submit_turn(t)
    memory.flush(10)


def _contents(memory: Memory, query: str, limit: int = 10) -> list[str]:
    return [h.content for h in memory.search_sync(query, identity=ME, scope="project",
                                                  limit=limit).hits]


def test_identifiers_are_one_term_each_and_their_words_stay_terms() -> None:
    assert identifiers("is `get_child_arguments` in django/utils/autoreload.py:213 or "
                       "os.path.join?") == ["get_child_arguments",
                                            "django/utils/autoreload.py:213", "os.path.join"]
    assert parse_query("where is restart_with_reloader defined").terms == (
        "restart_with_reloader", "restart", "reloader", "defined")
    assert identifiers("plain words only, no names.") == []
    assert intent_phrases("Which file did the agent edit?")
    assert intent_phrases("Which test failed?") == ()


def test_an_exact_identifier_outranks_its_words_scattered(memory: Memory) -> None:
    _store(memory,
           _turn(("tool", "restart the worker; with luck the reloader picks it up")),
           _turn(("tool", "restart with the reloader disabled")),
           _turn(("tool", "django/utils/autoreload.py:251:def restart_with_reloader():")))
    assert _contents(memory, "Where is `restart_with_reloader` defined?")[0].startswith(
        "django/utils/autoreload.py:251")


def test_an_edit_question_finds_the_message_that_wrote_the_file(memory: Memory) -> None:
    _store(memory,
           _turn(("assistant", "Let me look at parse_header in http/util.py first:\n"
                               "```bash\nsed -n '40,80p' http/util.py\n```"),
                 ("tool", "def parse_header(line):\n    return line.split(';')")),
           _turn(("assistant", "Now the fix.\n```bash\nsed -i 's/split/partition/' "
                               "http/util.py\n```"),
                 ("tool", "<returncode>0</returncode>")),
           _turn(("assistant", "parse_header still splits on every semicolon; "
                               "parse_header needs a look.")))
    top = _contents(memory, "Which file did the agent edit to change `parse_header`?", 3)
    assert any("sed -i" in c for c in top)


def test_a_tool_output_is_found_through_the_command_that_produced_it(memory: Memory) -> None:
    """Schema v5: the context of an output is the head and tail of its call."""
    thought = "THOUGHT: " + "I will reason about the failing behaviour at length. " * 60
    _store(memory,
           _turn(("assistant", thought + "\n```bash\npython check_matrix.py\n```"),
                 ("tool", "Traceback (most recent call last):\nAttributeError: no is_Poly")),
           _turn(("assistant", thought + "\n```bash\nls -la\n```"),
                 ("tool", "Traceback: an unrelated listing error")))
    hits = _contents(memory, "What exception was raised when the agent ran check_matrix.py?")
    outputs = [c for c in hits if c.startswith("Traceback")]
    assert outputs[0].endswith("no is_Poly")


def test_a_long_answer_outranks_a_short_turn_that_only_echoes_the_question(
        memory: Memory) -> None:
    """Small talk repeating the query's words ranks high on BM25 (little text around
    them) but answers nothing; the paragraph that answers is found first."""
    answer = ("Melanie: We finally went camping with the kids two weekends ago, up by "
              "the lake. We hiked every morning, roasted marshmallows, and the little "
              "one caught her first fish. It was great to unplug and spend real time "
              "together as a family, away from screens and the usual rush of school "
              "and work. We are already planning the next trip for the summer.")
    _store(memory,
           _turn(("user", "Caroline: Aww Melanie, what a lovely family!")),
           _turn(("assistant", answer)),
           _turn(("user", "Caroline: I spent the weekend at the library.")))
    assert _contents(memory, "What activities has Melanie done with her family?")[0] == answer


def test_a_short_turn_naming_the_queried_command_keeps_its_place(memory: Memory) -> None:
    """The short-turn rule spares a turn holding an identifier the query names: the
    agent's one-line command is what the question points at."""
    command = "```bash\npython3 verify_bar.py\n```"
    _store(memory,
           _turn(("assistant", command)),
           _turn(("assistant", "THOUGHT: " + "The bar check is verified below; "
                               "verify the output of the earlier run carefully. " * 8)))
    assert _contents(memory, "What happened when the agent ran `python3 verify_bar.py`?",
                     1) == [command]


def test_a_nonsense_query_finds_nothing_and_says_so(memory: Memory) -> None:
    _store(memory, _turn(("user", "the websocket reconnect test flakes"),
                         ("assistant", "Raised the backoff to 2 s in client/ws.py")))
    result = memory.search_sync(NONSENSE, identity=ME)
    assert result.hits == [] and result.total == 0
    assert render(result) == NO_RESULTS


def test_scores_say_how_much_of_the_query_matched(memory: Memory) -> None:
    _store(memory, _turn(("user", "the websocket reconnect test flakes on slow networks")),
           _turn(("user", "unrelated: the CI cache key")))
    full = memory.search_sync("websocket reconnect flakes", identity=ME).hits[0].score
    half = memory.search_sync("websocket reconnect quasar xylophone", identity=ME).hits[0].score
    assert full == 1.0
    assert 0.15 < half < 0.75


def test_recall_calls_and_results_are_never_hits(memory: Memory) -> None:
    _store(memory,
           _turn(("user", "how do we rotate the deploy key?"),
                 ("assistant", '[tool_call:recall] {"query": "deploy key rotation"}'),
                 ("tool", "[tool:call_1] ## Recall Results\nFound 1 results, deploy key "
                          "rotation is weekly (t:1)"),
                 ("tool", "[tool:call_2] No results found for this query."),
                 ("assistant", "The deploy key rotates weekly.")))
    hits = _contents(memory, "deploy key rotation")
    assert hits and not any(is_recall_traffic(c) for c in hits)
    assert "The deploy key rotates weekly." in hits
    assert is_recall_traffic('[tool_call:recall] {"query": "x"}')
    assert not is_recall_traffic("[tool:call_9] ## Results of my own script")


@pytest.mark.sqlite_only  # upgrades an older SQLite file
def test_a_version_4_store_migrates_to_the_v7_search_index(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, embeddings=False)
    conn = db.connect(settings.database)
    conn.execute("CREATE TABLE schema_version(version INTEGER NOT NULL)")
    for migration in schema.MIGRATIONS[:4]:
        conn.execute(migration.sql)
        conn.execute("INSERT INTO schema_version VALUES (?)", (migration.version,))
    long_call = "x" * 3_000 + " run pytest -k flaky_widget"
    with conn:
        write_turn(conn, _turn(("assistant", '[tool_call:recall] {"query": "flaky widget"}'),
                               ("assistant", long_call),
                               ("tool", "FAILED tests/test_widget.py::test_spin")), 1 << 20)
    recall_call, call, output = (int(r[0]) for r in conn.execute(
        "SELECT id FROM messages ORDER BY id"))

    def matching(table: str, query: str) -> set[int]:
        return {int(r[0]) for r in conn.execute(
            f"SELECT rowid FROM {table} WHERE {table} MATCH ?", (query,))}

    # v4: the context is the head of the previous message; recall calls are indexed.
    assert matching("context_fts", '"flaky widget"') == {recall_call, call}
    assert matching("messages_fts", "query") == {recall_call}
    assert schema.migrate(conn) == schema.MIGRATIONS[-1].version
    # v7: the output is indexed with the tail of its call; the recall call not at all.
    assert matching("context_fts", '"flaky widget"') == {call, output}
    assert matching("messages_fts", "query") == set()
    # The new triggers index rows written after the migration the same way.
    with conn:
        write_turn(conn, _turn(("tool", "[tool:call_7] ## Recall Results\nFound 3 results"),
                               ("user", "what next")), 1 << 20)
    assert matching("messages_fts", "found") == set()
    assert matching("messages_fts", "next") != set()
    conn.close()


def test_recall_traffic_gets_no_vector(tmp_path: Path) -> None:
    from lore_gateway.memory.embed.embedder import load_embedder
    from lore_gateway.memory.embed.vectors import embed_and_store

    embedder = load_embedder()
    if embedder is None:
        pytest.skip("embedding model not installed")
    conn = db.connect(tmp_path / "lore.db")
    schema.migrate(conn)
    with conn:
        write_turn(conn, _turn(("assistant", '[tool_call:recall] {"query": "deploy key"}'),
                               ("assistant", "The deploy key rotates weekly.")), 1 << 20)
    ids = [int(r[0]) for r in conn.execute("SELECT id FROM messages ORDER BY id")]
    assert embed_and_store(conn, embedder, ids) == 1
    assert [int(r[0]) for r in conn.execute("SELECT message_id FROM embeddings")] == ids[1:]
    conn.close()
