"""Scoring of ``lore bench coding``: what a top 10 gets right, and what noise it holds.

For each question and each top 10 (``Found`` rows, best first):

- **hit@k** (the main figure, hit@10): one of the first k lies within ±2 messages
  of *any* gold index of the question, in the question's session. A hit stands
  for the copies folded into it too (``Hit.folded``: the same text stored again,
  a re-run's output; the recall names each by its id), so a folded copy's index
  counts as the hit's: folding must not lose a position the copy held;
- **exact@10**: a gold index itself is in the top 10;
- **MRR**: 1 / rank of the first ±2 hit, over the top 10 (0 beyond it; the shared
  baseline scripts rank the whole list, so their MRR can be a little higher);
- **key facts**: the top 10's text joined (each hit with the message before it
  that it carries, ``Hit.previous``, which the recall shows under it), each key
  fact looked up verbatim:
  ``kf_all@10`` is the share of questions with every fact present, ``kf_frac@10``
  the share of all facts present. It needs the message that holds the fact, not
  a neighbour, and a fact shown by any session counts;
- **legacy**, the figures docs/search.md cites from before issue 33 (rule set
  only): the exact ``message_index`` and ±2 of it, hit@1/5/10 and MRR.

Noise in a top 10: a **duplicate** is a row whose text (whitespace aside) an
earlier row of the same top 10 already showed; a **side channel** is a row of a
side-channel call a result never shows (a title or classifier request,
``hits.hidden_side_channel``); **recall traffic** is the recall tool's own stored
call or a recall result (``render.is_recall_traffic``).

The naive baseline (``NaiveBaseline``) is the shared ``baseline_natural_fts5.py``
recipe, computed here over the bench's own stored messages: one SQLite FTS5
document per message (``porter unicode61``), the question's words lower-cased,
its fixed stopword list removed, each quoted and OR-ed, ranked by ``bm25()``.
The legacy figures keep the older ``baseline_fts5.py`` recipe (stopwords kept).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import apsw

from lore_gateway.bench.coding_data import Question, held_out
from lore_gateway.memory.search.hits import hidden_side_channel
from lore_gateway.memory.search.render import is_recall_traffic

KS = (1, 5, 10)
TOP = 10
# The lenient gold window: a gold message or any within ±2 of it.
TOLERANCE = 2
SUBSETS = ("all", "tuning", "held_out")

# baseline_natural_fts5.py's fixed English stopword list, verbatim.
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she
should so some such than that the their theirs them themselves then there these they this those
through to too under until up very was we were what when where which while who whom why will with
would you your yours yourself yourselves s t d ll m re ve didn doesn don isn wasn weren won wouldn
couldn shouldn aren hasn haven hadn also any anything something what's did does do done get got
""".split())
_WORD = re.compile(r"[^\W_]+")


@dataclass(frozen=True, slots=True)
class Found:
    """One row of a top 10: where it is, and what it is."""

    session: str
    index: int | None  # the message's index in its session; None for a noise row
    content: str
    side_channel: bool = False
    recall: bool = False
    previous: str = ""  # the message before it that the hit carries (``Hit.previous``)
    copies: tuple[int, ...] = ()  # indexes of the copies folded into it, in its session

    @classmethod
    def of(cls, session: str, content: str, meta: dict[str, Any] | None,
           previous: str = "", copies: tuple[int, ...] = ()) -> Found:
        meta = meta or {}
        index = meta.get("index")
        return cls(session, int(index) if isinstance(index, int) else None, content,
                   side_channel=hidden_side_channel(meta),
                   recall=meta.get("noise") == "recall" or is_recall_traffic(content),
                   previous=previous, copies=copies)

    def indexes(self) -> tuple[int, ...]:
        """The positions this row stands for in its session: its own, then its copies'."""
        return self.copies if self.index is None else (self.index, *self.copies)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one top 10 did on one question."""

    tol: int | None  # rank of the first row within ±2 of any gold index
    exact: int | None  # rank of the first gold row
    facts_found: int
    facts: int
    legacy_exact: int | None  # rank of message_index itself
    legacy_tol: int | None  # rank of the first row within ±2 of message_index


def _text_key(content: str) -> str:
    return " ".join(content.split())


def outcome(q: Question, found: Sequence[Found]) -> Outcome:
    top = list(found[:TOP])

    def first(ok: Any) -> int | None:
        return next((rank for rank, f in enumerate(top, 1)
                     if f.session == q.session_id and any(ok(i) for i in f.indexes())),
                    None)

    text = "\n".join(f"{f.previous}\n{f.content}" for f in top)
    return Outcome(
        tol=first(lambda i: any(abs(i - g) <= TOLERANCE for g in q.golds)),
        exact=first(lambda i: i in q.golds),
        facts_found=sum(1 for fact in q.facts if fact in text), facts=len(q.facts),
        legacy_exact=first(lambda i: i == q.gold),
        legacy_tol=first(lambda i: abs(i - q.gold) <= TOLERANCE))


@dataclass(slots=True)
class Noise:
    """Noise rows over every top 10 of one arm (system × scope)."""

    tops: int = 0
    duplicates: int = 0
    side_channels: int = 0
    recall_traffic: int = 0
    noisy_tops: int = 0  # top 10s holding at least one noise row

    def add(self, found: Sequence[Found]) -> None:
        seen: set[str] = set()
        before = self.duplicates + self.side_channels + self.recall_traffic
        for f in found[:TOP]:
            key = _text_key(f.content)
            self.duplicates += key in seen
            seen.add(key)
            self.side_channels += f.side_channel
            self.recall_traffic += f.recall
        self.tops += 1
        self.noisy_tops += self.duplicates + self.side_channels + self.recall_traffic > before

    def as_dict(self) -> dict[str, int]:
        return {"top10s": self.tops, "duplicates": self.duplicates,
                "side_channels": self.side_channels, "recall_traffic": self.recall_traffic,
                "top10s_with_noise": self.noisy_tops}


@dataclass(slots=True)
class Tally:
    """Outcomes of one subset of questions."""

    outcomes: list[Outcome] = field(default_factory=list)

    def figures(self) -> dict[str, float | int]:
        rows = self.outcomes
        n = max(len(rows), 1)
        out: dict[str, float | int] = {"n": len(rows)}
        for k in KS:
            out[f"hit@{k}"] = _share(sum(1 for r in rows if r.tol and r.tol <= k), n)
        out["exact@10"] = _share(sum(1 for r in rows if r.exact), n)
        out["mrr"] = _share(sum(1.0 / r.tol for r in rows if r.tol), n)
        out["kf_all@10"] = _share(sum(1 for r in rows if r.facts_found == r.facts), n)
        out["kf_frac@10"] = _share(sum(r.facts_found for r in rows),
                                   max(sum(r.facts for r in rows), 1))
        return out

    def legacy(self) -> dict[str, dict[str, float | int]]:
        """``{"exact": ..., "tol2": ...}`` on ``message_index``, as before issue 33."""
        n = max(len(self.outcomes), 1)
        out = {}
        for name, ranks in (("exact", [r.legacy_exact for r in self.outcomes]),
                            ("tol2", [r.legacy_tol for r in self.outcomes])):
            figures: dict[str, float | int] = {
                f"hit@{k}": _share(sum(1 for r in ranks if r and r <= k), n) for k in KS}
            figures["mrr"] = _share(sum(1.0 / r for r in ranks if r), n)
            figures["n"] = len(ranks)
            out[name] = figures
        return out


def _share(count: float, n: int) -> float:
    return round(count / n, 4)


def subsets(q: Question) -> tuple[str, ...]:
    """The subsets a question counts in: all, its part, its kind, its position."""
    keys = ["all", "held_out" if held_out(q.session_id) else "tuning", f"kind:{q.kind}"]
    if q.position:
        keys.append(f"position:{q.position}")
    return tuple(keys)


def figures(tallies: dict[str, Tally]) -> dict[str, dict[str, float | int]]:
    """Every subset's figures; the three parts present even when empty."""
    for key in SUBSETS:
        tallies.setdefault(key, Tally())
    return {key: tallies[key].figures() for key in sorted(tallies)}


def difference(ours: dict[str, dict[str, float | int]],
               theirs: dict[str, dict[str, float | int]]) -> dict[str, dict[str, float]]:
    """``ours - theirs`` for every subset and figure both have (n left out)."""
    return {key: {name: round(float(value) - float(theirs[key][name]), 4)
                  for name, value in figs.items() if name != "n" and name in theirs[key]}
            for key, figs in ours.items() if key in theirs}


# --- the naive baseline --------------------------------------------------------------


def natural_terms(question: str) -> list[str]:
    """baseline_natural_fts5.py: lower-cased words, stopwords out, duplicates out."""
    return list(dict.fromkeys(t for t in _WORD.findall(question.lower()) if t not in STOPWORDS))


def legacy_terms(question: str) -> list[str]:
    """baseline_fts5.py (the figures cited before issue 33): every word kept."""
    return list(dict.fromkeys(_WORD.findall(question.lower())))


class NaiveIndex:
    """One FTS5 document per message of one corpus (a session, or every session):
    BM25's statistics are the corpus's own, as in the shared scripts."""

    def __init__(self, rows: Iterable[Found]) -> None:
        self._found: list[Found] = []
        self._conn = apsw.Connection(":memory:")
        self._conn.execute("CREATE VIRTUAL TABLE m USING fts5(content,"
                           " tokenize='porter unicode61')")
        with self._conn:
            for found in rows:  # rowid = position in ``self._found``
                self._conn.execute("INSERT INTO m(rowid, content) VALUES (?, ?)",
                                   (len(self._found), found.content))
                self._found.append(found)

    def rank(self, terms: list[str]) -> list[Found]:
        """The best ``TOP`` messages for ``terms``, each quoted, OR-ed."""
        if not terms:
            return []
        expr = " OR ".join(f'"{t}"' for t in terms)
        return [self._found[int(r[0])] for r in self._conn.execute(
            f"SELECT rowid FROM m WHERE m MATCH ? ORDER BY bm25(m) LIMIT {TOP}", (expr,))]

    def close(self) -> None:
        self._conn.close()
