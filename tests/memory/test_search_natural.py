"""Questions asked the way people ask (issue 33): the rules that ranking adds for
them, each on a store built for it.

- a question whose words the store barely holds leans on meaning (the lexical
  share), and one whose words are all found is ranked as before;
- a short turn that runs a command is an action, not small talk;
- in scope ``all``, the asking session's nearest messages and its word matches
  are candidates even when a hundred messages elsewhere are nearer and four
  hundred match the words better, and its best word matches lift their
  neighbours as within the session;
- over several sessions, a message of a session whose best match is weak gives
  way to the best session's.

Vectors come from ``_AxisEmbedder`` (each text's cosine to the query is set
here), so which message is how similar is exact.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.embed.vectors import embed_and_store
from lore_gateway.memory.search import searcher as search
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message, Role
from lore_gateway.storage import db

TENANT, PROJECT = "tenant-a", "proj-x"


class _AxisEmbedder:
    """Stands in for MiniLM: a text's cosine to every query is ``cosines[text]``."""

    model_name = "test-axis"
    dim = 384

    def __init__(self, cosines: dict[str, float]) -> None:
        self._cosines = cosines

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in zip(out, texts, strict=True):
            cosine = self._cosines.get(text, 1.0)  # a text not listed is a query
            row[0], row[1] = cosine, math.sqrt(max(0.0, 1.0 - cosine * cosine))
        return out


def _turn(session: str, *pairs: tuple[Role, str]) -> TurnRecord:
    return TurnRecord(identity=Identity(TENANT, PROJECT, session), protocol="responses",
                      model="m", messages=tuple(Message(r, t) for r, t in pairs),
                      created_at=1.7e9)


def _searcher(tmp_path: Path, cosines: dict[str, float],
              *turns: TurnRecord) -> search.Searcher:
    settings = Settings(data_dir=tmp_path, embeddings=False)
    memory = Memory.open(settings, embedder=None)
    try:
        for turn in turns:
            assert memory.submit_turn(turn)
        memory.flush(10)
    finally:
        memory.close()
    embedder = _AxisEmbedder(cosines)
    conn = db.connect(settings.database)
    try:
        ids = [int(r[0]) for r in conn.execute("SELECT id FROM messages")]
        embed_and_store(conn, embedder, ids)  # type: ignore[arg-type]
    finally:
        conn.close()
    return search.Searcher(db.conn_factory(settings.database), embedder)  # type: ignore[arg-type]


def _contents(searcher: search.Searcher, query: str, *, scope: str = "project",
              session: str = "", limit: int = 3) -> list[str]:
    return [h.content for h in searcher.search(query, tenant=TENANT, project=PROJECT,
                                               session=session, scope=scope,
                                               limit=limit).hits]


FILLERS = [f"filler note number {i:03d}" for i in range(20)]


@pytest.mark.usefixtures("database_url")
def test_a_question_in_other_words_leans_on_meaning(tmp_path: Path) -> None:
    """The decoy holds one of the question's words and nothing else of it; the
    answer holds none, but means the same. Counted at full weight, the word made
    the decoy first (2.0 of BM25 against 0.85 of vector); it finds a third of the
    question, so it counts a third."""
    decoy = "a little note about the weather"
    answer = "IndexError: list index out of range (I forgot to feed the file to stdin)"
    cosines = {decoy: 0.1, answer: 0.7, **{t: 0.05 for t in FILLERS}}
    searcher = _searcher(tmp_path, cosines, _turn("s1", ("tool", decoy), ("tool", answer)),
                         *(_turn("s2", ("tool", t)) for t in FILLERS))
    assert _contents(searcher, "why did the little patcher explode")[0] == answer


@pytest.mark.usefixtures("database_url")
def test_a_question_whose_words_are_all_found_ranks_them_first(tmp_path: Path) -> None:
    """The same store asked in the transcript's own words: the message holding
    them all comes first, however near another message's meaning is."""
    found = "the little patcher would explode on stdin"
    near = "IndexError: list index out of range"
    cosines = {found: 0.3, near: 0.9, **{t: 0.05 for t in FILLERS}}
    searcher = _searcher(tmp_path, cosines, _turn("s1", ("tool", found), ("tool", near)),
                         *(_turn("s2", ("tool", t)) for t in FILLERS))
    assert _contents(searcher, "little patcher explode")[0] == found


@pytest.mark.usefixtures("database_url")
def test_a_short_turn_that_runs_a_command_is_no_small_talk(tmp_path: Path) -> None:
    """A short turn echoing the question keeps a share of its score (small talk
    rarely answers), but an agent's one-line command is the action asked about;
    the same words without a command still give way to the paragraph."""
    command = "THOUGHT: Run the slow tests.\n\n```bash\npytest -m slow\n```"
    chatter = "Run the slow tests? Sure, why not, later."
    paragraph = ("THOUGHT: " + "The suite has fast and slow parts; the slow tests need the "
                 "database fixture and a warm cache before they run, so I will prepare "
                 "both first and then look at the flaky network checks. " * 3)
    cosines = {command: 0.2, chatter: 0.2, paragraph: 0.2}
    for first in (command, chatter):
        searcher = _searcher(tmp_path / str(len(first)), cosines,
                             _turn("s1", ("assistant", first)),
                             _turn("s1", ("assistant", paragraph)))
        found = _contents(searcher, "when did I run the slow tests")
        assert found[0] == (command if first == command else paragraph), found


@pytest.mark.usefixtures("database_url")
def test_the_asking_sessions_nearest_messages_are_candidates_in_scope_all(
        tmp_path: Path) -> None:
    """A hundred and twenty messages of other sessions are nearer the question
    than the asking session's answer, and no message shares a word with it: the
    hundred nearest overall hold nothing of the asking session, yet its nearest
    message is found."""
    answer, other = "the proxy strips the credentials", "an unrelated line"
    elsewhere = [f"another session's line {i:03d}" for i in range(120)]
    cosines = {answer: 0.3, other: 0.1,
               **{t: 0.9 - 0.004 * i for i, t in enumerate(elsewhere)}}
    searcher = _searcher(tmp_path, cosines, _turn("asking", ("tool", answer), ("tool", other)),
                         *(_turn(f"s{i % 6}", ("tool", t)) for i, t in enumerate(elsewhere)))
    query = "what happens to the user and password"
    assert answer in _contents(searcher, query, scope="all", session="asking", limit=10)
    assert answer not in _contents(searcher, query, scope="all", session="s1", limit=10)


@pytest.mark.usefixtures("database_url")
def test_a_hit_carries_the_message_before_it(tmp_path: Path) -> None:
    """The output is found by the question's words; the command that produced it
    (the message before it, which the context index ranked with it) rides along
    when the result does not show it as a hit of its own, and never when it is
    recall traffic."""
    command = "THOUGHT: Run the reproduction.\n\n```bash\npython3 repro.py\n```"
    output = "[tool:c1] ZeroDivisionError: division by zero"
    recall = '[tool_call:recall] {"query": "zero"}'
    later = "[tool:c2] ZeroDivisionError: division by zero in the second run"
    cosines = {command: 0.1, output: 0.2, recall: 0.1, later: 0.2}
    searcher = _searcher(tmp_path, cosines,
                         _turn("s1", ("assistant", command), ("tool", output),
                               ("assistant", recall), ("tool", later)))
    alone = searcher.search("ZeroDivisionError division by zero", tenant=TENANT,
                            project=PROJECT, session="", scope="project", limit=1).hits
    assert [h.content for h in alone] == [output]
    assert alone[0].previous is not None and alone[0].previous.content == command
    assert alone[0].previous.role == "assistant"
    both = searcher.search("ZeroDivisionError division by zero", tenant=TENANT,
                           project=PROJECT, session="", scope="project", limit=3).hits
    assert [h.content for h in both] == [output, later, command]
    # The command is a hit of its own, so the output carries nothing; the later
    # output's previous message is a recall call, which no result shows.
    assert [h.previous for h in both] == [None, None, None]


@pytest.mark.usefixtures("database_url")
def test_the_session_of_the_best_match_goes_first(tmp_path: Path) -> None:
    """No word of the question is stored, so the vectors decide: the stray
    message of another session is nearer the question than the best session's
    second message, yet its session's best match is weak, so it keeps that share
    of its score (0.59 of 0.59 against 0.53) and gives way."""
    best = "get_child_arguments built: python3 -m pkg.sub"
    second = "sys.argv held pkg/sub/module.py"
    stray = "an unrelated note from elsewhere"
    cosines = {best: 0.9, second: 0.5, stray: 0.55, **{t: 0.05 for t in FILLERS}}
    searcher = _searcher(tmp_path, cosines, _turn("s1", ("tool", best), ("tool", second)),
                         _turn("s2", ("tool", stray)),
                         *(_turn("s3", ("tool", t)) for t in FILLERS))
    assert _contents(searcher, "which restart command did it make") == [best, second, stray]


@pytest.mark.usefixtures("database_url")
def test_the_asking_sessions_word_matches_are_candidates_in_scope_all(
        tmp_path: Path) -> None:
    """Four hundred and ten messages of other sessions match the question's words
    better than the asking session's answer, so the best 400 word matches overall
    hold nothing of the asking session; its answer is still scored by its words as
    within its session (and is the nearest message besides), so it comes first.
    Counted only by its vector it stays below every message of the others."""
    answer = ("the nightly job rotated the cache key, and the old entries were "
              "dropped at midnight along with the session tokens of every worker")
    elsewhere = [f"cache key rotated for worker {chr(97 + i // 26)}{chr(97 + i % 26)}"
                 for i in range(410)]
    cosines = {answer: 0.3, **dict.fromkeys(elsewhere, 0.2)}
    searcher = _searcher(tmp_path, cosines,
                         *(_turn(f"s{i}", ("tool", t)) for i, t in enumerate(elsewhere)),
                         _turn("asking", ("tool", answer)))
    query = "when was the cache key rotated"
    assert _contents(searcher, query, scope="all", session="asking", limit=10)[0] == answer
    assert answer not in _contents(searcher, query, scope="all", session="s1", limit=10)


@pytest.mark.usefixtures("database_url")
def test_the_asking_sessions_word_matches_lift_their_neighbours_in_scope_all(
        tmp_path: Path) -> None:
    """The command holds the question's words, its output none: the output is
    lifted by the command beside it (and found by the context index). Sixty
    messages of other sessions match the words better, so the 40 best matches
    overall, whose neighbours are lifted, hold nothing of the asking session;
    its own best matches lift theirs too, so its messages score as they do
    within the session (without: the output 0.385 against 0.535)."""
    command = ("THOUGHT: I will look for when the cache key was rotated.\n\n```bash\n"
               "grep -n rotated /var/log/nightly.log\n```")
    output = "[tool:c1] 412: nightly job finished at 03:00, all entries swapped"
    elsewhere = [f"cache key rotated for worker {chr(97 + i // 26)}{chr(97 + i % 26)}"
                 for i in range(60)]
    cosines = dict.fromkeys([command, output, *elsewhere], 0.2)
    searcher = _searcher(tmp_path, cosines,
                         *(_turn(f"s{i}", ("tool", t)) for i, t in enumerate(elsewhere)),
                         _turn("asking", ("assistant", command), ("tool", output)))

    def mine(scope: str) -> list[tuple[str, float]]:
        return [(h.content, h.score) for h in searcher.search(
            "when was the cache key rotated", tenant=TENANT, project=PROJECT,
            session="asking", scope=scope, limit=100).hits if h.session == "asking"]

    assert [c for c, _ in mine("session")] == [command, output]
    assert mine("all") == mine("session")
