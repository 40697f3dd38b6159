"""``lore bench coding``: retrieval quality on real coding-agent sessions.

Both question sets of ``shared/data/coding-sessions`` (``coding_data``: the 173
rule-made questions of ``coding_eval.json`` and the 120 natural ones of
``natural_questions.json``) over its 30 mini-swe-agent sessions. Every session is
stored through the proxy's write path (``Memory.submit_turn``), one turn per
message, in one of five projects, with noise beside it (recall traffic, title
calls; see ``coding_data``). Every question is then asked three ways through
``Memory.search_sync(limit=10)``:

- ``session``: scope ``session``, the question's session (the figures cited
  before issue 33 were asked this way, through scope ``project`` with one project
  a session: the same rows);
- ``all``: scope ``all`` from no project: every session competes equally;
- ``multi_project``: scope ``all`` from the question's project (issue 33: figures
  within 0.02 of ``session`` once search favours the asking project).

The naive baseline (``coding_score.NaiveIndex``) ranks the same stored messages
in the same run, per session and over all sessions; it has no notion of a
project, so ``multi_project`` compares with its ``all``. Scores, noise and the
legacy figures are defined in ``coding_score``; the held-out part (8 sessions,
fixed before any tuning) in ``coding_data``.

``store``: a directory to keep the ingested memory in. Storing and embedding the
sessions is most of a run (649 s on this 2-core machine beside other work); a
later run with the same directory and data asks its questions at once, so a
ranking change is measured in a minute or two. A change to what is stored or indexed needs
a fresh directory (or ``NOISE_VERSION`` bumped).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lore_gateway.bench.coding_data import (
    DEFAULT_DATA,
    NATURAL_FILE,
    RULE,
    SETS,
    TENANT,
    CodingSets,
    Question,
    held_out,
    identity,
    load,
    turn_records,
)
from lore_gateway.bench.coding_score import (
    Found,
    NaiveIndex,
    Noise,
    Tally,
    difference,
    figures,
    legacy_terms,
    natural_terms,
    outcome,
    subsets,
)
from lore_gateway.bench.ingest import Progress, find_data, ingest
from lore_gateway.config import Settings
from lore_gateway.memory.store.records import Identity
from lore_gateway.storage.base import Connection

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

__all__ = ["MODES", "CodingReport", "held_out", "mark_value", "resolve_data_path", "run",
           "store_dir", "write_mark"]

LORE, NAIVE, LEGACY = "lore", "naive", "legacy"
MODES = ("session", "all", "multi_project")
# The scope each mode asks in, and whether it asks from the question's project.
_ASKED = {"session": ("session", True), "all": ("all", False),
          "multi_project": ("all", True)}
LIMIT = 10
# kv key marking a directory's store as this bench's, and what it was built from.
STORE_MARK = "bench-coding-store"


@dataclass(slots=True)
class CodingReport:
    # (set, mode, system) → subset → outcomes
    tallies: dict[tuple[str, str, str], dict[str, Tally]] = field(default_factory=dict)
    # (system, mode) → noise over every top 10 of both sets
    noise: dict[tuple[str, str], Noise] = field(default_factory=dict)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    messages: int = 0
    stored_rows: int = 0
    ingest_s: float = 0.0
    store_reused: bool = False
    noise_rows: bool = True  # the noise rows were stored (``--no-noise``: not)
    embeddings: bool = False
    rerank: bool = False
    projects: dict[str, list[str]] = field(default_factory=dict)

    def add(self, system: str, mode: str, q: Question, found: list[Found]) -> None:
        result = outcome(q, found)
        per = self.tallies.setdefault((q.set, mode, system), {})
        for key in subsets(q):
            per.setdefault(key, Tally()).outcomes.append(result)
        if system != LEGACY:
            self.noise.setdefault((system, mode), Noise()).add(found)

    def as_dict(self) -> dict[str, Any]:
        sets: dict[str, Any] = {}
        for name in SETS:
            if not any(key[0] == name for key in self.tallies):
                continue
            per_mode: dict[str, Any] = {}
            for mode in MODES:
                ours = figures(self.tallies.get((name, mode, LORE), {}))
                theirs = figures(self.tallies.get(
                    (name, "all" if mode == "multi_project" else mode, NAIVE), {}))
                per_mode[mode] = {LORE: ours, NAIVE: theirs, "diff": difference(ours, theirs)}
            sets[name] = per_mode
        out: dict[str, Any] = {
            "sets": sets,
            "noise": {system: {mode: n.as_dict() for (s, mode), n in sorted(self.noise.items())
                               if s == system} for system in (LORE, NAIVE)},
            # The figures cited before issue 33: rule set, scope session, message_index.
            "lore": _legacy(self.tallies.get((RULE, "session", LORE), {})),
            "baseline": _legacy(self.tallies.get((RULE, "session", LEGACY), {})),
            "median_query_ms": _median(self.latencies_ms.get("session", [])),
            "median_query_ms_by_mode": {mode: _median(v)
                                        for mode, v in sorted(self.latencies_ms.items())},
            "messages": self.messages,
            "stored_rows": self.stored_rows,
            "ingest_s": round(self.ingest_s, 2),
            "store_reused": self.store_reused,
            "noise_rows": self.noise_rows,
            "embeddings": self.embeddings,
            "rerank": self.rerank,
            "projects": self.projects,
            "held_out_sessions": sorted({s for ss in self.projects.values() for s in ss
                                         if held_out(s)}),
        }
        return out


def _legacy(tallies: dict[str, Tally]) -> dict[str, Any]:
    for key in ("all", "tuning", "held_out"):
        tallies.setdefault(key, Tally())
    return {key: t.legacy() for key, t in sorted(tallies.items())
            if not key.startswith("position:")}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def resolve_data_path(path: Path | None) -> Path:
    return find_data(path, DEFAULT_DATA, "coding set")


def run(data: Path | None = None, *, natural: Path | None = None, embeddings: bool = True,
        rerank: bool = False, store: Path | None = None, noise: bool = True,
        progress: Progress | None = None) -> CodingReport:
    """Store the sessions (or reuse ``store``), ask every question in every mode with
    both systems, score. ``natural`` defaults to the file beside ``data``; ``noise``
    False stores the sessions without the noise rows (``coding_data``)."""
    from lore_gateway.memory.service import Memory

    path = resolve_data_path(data)
    sets = load(path, natural if natural is not None else path.parent / NATURAL_FILE)
    report = CodingReport(embeddings=embeddings, rerank=rerank, noise_rows=noise)
    for sid, project in sorted(sets.projects.items()):
        report.projects.setdefault(project, []).append(sid)
    report.messages = sum(len(s.messages) for s in sets.sessions)
    mark = mark_value(sets, embeddings, noise)
    with store_dir(store, mark) as (directory, fresh):
        settings = Settings(data_dir=directory, embeddings=embeddings, rerank=rerank)
        # A reused store is embedded already: no embedding process to start.
        memory = Memory.open(settings, embedder="auto" if embeddings else None,
                             embed_backlog=fresh)
        try:
            report.embeddings = memory.embeddings
            if fresh:
                records = list(turn_records(sets, noise))
                report.ingest_s = ingest(memory, settings, iter(records), len(records),
                                         progress)
                memory.write_job(lambda conn: write_mark(conn, mark))
            report.store_reused = not fresh
            stored = memory.read(_stored_rows)
            report.stored_rows = len(stored)
            _ask_naive(report, sets, stored)
            _ask_lore(report, sets, memory, memory.read(_positions), progress)
        finally:
            memory.close()
    return report


def _ask_naive(report: CodingReport, sets: CodingSets,
               stored: list[tuple[str, Found]]) -> None:
    """The naive baseline over the conversations' stored messages (not the noise
    rows, which the shared scripts do not have), per session and over all."""
    conversation = [(session, f) for session, f in stored if f.index is not None]
    by_session: dict[str, list[Found]] = {}
    for session, f in conversation:
        by_session.setdefault(session, []).append(f)
    every = NaiveIndex(f for _, f in conversation)
    try:
        for sid, rows in by_session.items():
            index = NaiveIndex(rows)
            try:
                for q in (q for q in sets.questions if q.session_id == sid):
                    report.add(NAIVE, "session", q, index.rank(natural_terms(q.question)))
                    if q.set == RULE:
                        report.add(LEGACY, "session", q, index.rank(legacy_terms(q.question)))
            finally:
                index.close()
        for q in sets.questions:
            report.add(NAIVE, "all", q, every.rank(natural_terms(q.question)))
    finally:
        every.close()


def _ask_lore(report: CodingReport, sets: CodingSets, memory: Memory,
              positions: dict[str, tuple[str, int]], progress: Progress | None) -> None:
    asked, total = 0, len(sets.questions) * len(MODES)
    for mode in MODES:
        scope, from_project = _ASKED[mode]
        for q in sets.questions:
            ident = identity(sets, q.session_id) if from_project else Identity(TENANT, "", "")
            t0 = time.perf_counter()
            result = memory.search_sync(q.question, identity=ident, scope=scope, limit=LIMIT)
            report.latencies_ms.setdefault(mode, []).append((time.perf_counter() - t0) * 1000)
            report.add(LORE, mode, q, [
                Found.of(h.session, h.content, h.meta,
                         h.previous.content if h.previous is not None else "",
                         _copies(h.session, h.folded, positions))
                for h in result.hits])
            asked += 1
            if progress is not None:
                progress("questions", asked, total)


def _positions(conn: Connection) -> dict[str, tuple[str, int]]:
    """Each stored message's reference (``t:<id>``) to its session and index."""
    import orjson

    found: dict[str, tuple[str, int]] = {}
    for mid, session, meta in conn.execute(
            "SELECT id, session, meta FROM messages WHERE tenant = ?", (TENANT,)):
        index = orjson.loads(meta).get("index") if meta else None
        if isinstance(index, int):
            found[f"t:{int(mid)}"] = (str(session), index)
    return found


def _copies(session: str, folded: tuple[str, ...],
            positions: dict[str, tuple[str, int]]) -> tuple[int, ...]:
    """The indexes, in ``session``, of the copies a hit folded (``Hit.folded``)."""
    return tuple(at[1] for ref in folded
                 if (at := positions.get(ref)) is not None and at[0] == session)


def _stored_rows(conn: Connection) -> list[tuple[str, Found]]:
    import orjson

    return [(str(session), Found.of(str(session), str(content),
                                    orjson.loads(meta) if meta else None))
            for session, content, meta in conn.execute(
                "SELECT session, content, meta FROM messages WHERE tenant = ? ORDER BY id",
                (TENANT,))]


def mark_value(sets: CodingSets, embeddings: bool, noise: bool) -> str:
    return (f"{sets.fingerprint}:{'hybrid' if embeddings else 'bm25'}"
            f"{'' if noise else ':no-noise'}")


def write_mark(conn: Connection, value: str) -> None:
    with conn:
        conn.execute("DELETE FROM kv WHERE key = ?", (STORE_MARK,))
        conn.execute("INSERT INTO kv(key, value) VALUES (?, ?)", (STORE_MARK, value))


def _read_mark(database: Path) -> str | None:
    """The store mark of an existing ``lore.db``, or None (none, or not a lore store)."""
    import apsw

    conn = apsw.Connection(str(database), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = conn.execute("SELECT value FROM kv WHERE key = ?", (STORE_MARK,)).fetchone()
    except apsw.SQLError:
        row = None
    finally:
        conn.close()
    return str(row[0]) if row else None


@contextmanager
def store_dir(store: Path | None, mark: str) -> Iterator[tuple[Path, bool]]:
    """(directory, whether it must be filled): a throw-away directory, or ``store``,
    reused when its mark matches and rebuilt when it is an outdated bench store."""
    if store is None:
        with tempfile.TemporaryDirectory(prefix="lore-coding-") as tmp:
            yield Path(tmp), True
        return
    store.mkdir(parents=True, exist_ok=True)
    database = store / "lore.db"
    if database.exists():
        found = _read_mark(database)
        if found is None:
            raise ValueError(f"{store} holds a lore.db that is not a `lore bench coding` "
                             "store; give an empty or new directory")
        if found == mark:
            yield store, False
            return
        for stale in store.glob("lore.db*"):
            stale.unlink()
    yield store, True
