"""The session of the best match first: how a search over several sessions
weighs a candidate by the session it belongs to.

A question is about one piece of work, and one session holds it: the reloader
fix, the week a person talked about their new job. The session that holds the
best match is most likely that one, and a message of a session whose best match
is weak rarely answers, even when it shares some of the question's words (the
"all tests passed" of every other coding session, the small talk of another
day). So in scope ``project`` and ``all``, each of the ``SESSION_CANDIDATES``
best candidates keeps ``(its session's best score / the best score)`` of its
score: a session counts by its best message, as document ranking by passages
scores a document by its best passage (MaxP). Within the best session nothing
changes; within scope ``session`` nothing can.

Measured (docs/notes/2026-12-05-issue-33-ranking.md, "later still"): LoCoMo
(scope ``project``, a conversation's sessions) recall@10 0.7748 -> 0.7954, held
out 0.8143 -> 0.8453; ``lore bench coding``, natural questions over all sessions,
tuning part, hit@10 0.784 -> 0.818. A session's best of 3, a power of 0.5 or 2
and 50 or 200 candidates all gained on both (a plateau; 1, 1 and 100 are its
middle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lore_gateway.storage.base import Connection

# The best candidates whose session is read (as the question and short-turn rules
# read the best 100). Those below keep their order under every one of them.
SESSION_CANDIDATES = 100


def by_session(conn: Connection, scores: dict[int, float]) -> None:
    """Multiply each of the best candidates by its session's best score over the
    best score (in place); the candidates below them by one factor that keeps
    them below and in their order."""
    best = sorted(scores, key=lambda mid: (-scores[mid], -mid))[:SESSION_CANDIDATES]
    top = scores[best[0]] if best else 0.0
    if len(best) < 2 or top <= 0:
        return
    marks = ",".join("?" * len(best))
    session_of = {int(mid): str(session) for mid, session in conn.execute(
        f"SELECT id, session FROM messages WHERE id IN ({marks})", best)}
    strongest: dict[str, float] = {}
    for mid in best:  # best first: a session's first candidate is its best
        strongest.setdefault(session_of.get(mid, ""), scores[mid])
    floor = scores[best[-1]]
    for mid in best:
        scores[mid] *= strongest[session_of.get(mid, "")] / top
    if floor <= 0:
        return
    under = min(scores[mid] for mid in best) / floor
    chosen = set(best)
    for mid in scores:
        if mid not in chosen:
            scores[mid] *= under
