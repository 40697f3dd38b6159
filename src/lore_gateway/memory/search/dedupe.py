"""Copies among a search's hits: the best-ranked copy stays and names the others.

An agent runs the same command again and again (``git status``, the test suite),
so memory holds the same output many times over; in a recall result every copy
takes a place and says nothing the first did not. A hit is folded into a
better-ranked one when the two texts are the same once three things are set aside:

- **whitespace** (a history stored again, re-wrapped);
- **the tool call's id**: a tool result is stored as ``[tool:<call id>] <output>``
  and every run of a command gets a new id;
- **what a re-run changes by itself** (``VOLATILE``): dates, clock times,
  durations, memory addresses and long numbers (seeds, process ids, epoch
  times), and the ``=====`` padding whose width follows a summary line's length
  (``PADDING``).

The kept hit carries the folded hits' ids (``Hit.folded``, best first) and
whether all of them are identical to it (``Hit.folded_identical``), so the reader
knows how often it happened and can still fetch any copy.

Why this rule and not word-shingle overlap: on the coding-sessions set (3,482
real messages) whitespace alone folds 573 rows; setting aside the volatile parts
folds 8 more, every one a re-run differing in a duration (``1 passed in 0.01s``
/ ``0.00s``) or an address (``object at 0x709b…``). Masking every number would
fold 26 more, and those differ in what they say: ``235:def dmp_sqf_part`` and
``229:def dmp_sqf_part`` (the file changed), ``debug_poly_2.py`` and
``debug_poly_3.py``. Jaccard ≥ 0.9 over word 3-grams pairs 96 more messages of
one session, and besides 82 "found 2 actions" / "found 3 actions" reminders they
are an edit's before and after: ``_default_manager`` → ``_base_manager`` in a
file view (0.92), a method that gained ``@staticmethod`` (0.96), ``term-mysql``
→ ``term-MySQL`` in built HTML (0.99). The code an agent just changed is what a
question about it needs, so near is not the same here (docs/search.md, "Copies
folded").

Pure: no I/O. The key costs a few passes over each text (about 60 ms per MB of
candidates here, against 14 for the whitespace key alone; a search reads
``hit_load.MAX_READ`` candidates at most), and folding is a dictionary lookup
per hit, never a comparison of every pair.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from lore_gateway.memory.search.hits import Hit, text_key

__all__ = ["Folder", "copy_key", "fold", "same_key"]

# What changes between two runs of the same command by itself. Every form starts
# at a digit that no letter, digit or dot precedes (so ``test_123456`` and
# ``v3.4.0`` are left alone, and the regex engine skips to digits fast):
# ISO dates and times (2026-12-05, 2026-12-05T10:31:02.5Z), clock times (9:41,
# 23:45:07.123, as ``ls -l`` prints them), memory addresses (0x7f3a9b2c10),
# numbers of six digits or more (random seeds, process ids, epoch times) and
# durations (0.12s, 8 ms, 3.01 seconds). Small counts and line numbers stay:
# ``2 failed`` and ``line 486`` say what happened.
VOLATILE = re.compile(r"""\d(?<![\w.]\d)(?:
    \d{3}-\d\d-\d\d(?:[T\x20]\d\d:\d\d(?::\d\d)?(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)?
  | \d?:\d\d(?::\d\d)?(?:[.,]\d+)?
  | (?<=0)x[0-9a-fA-F]{4,}
  | \d{5,}
  | \d*(?:\.\d+)?\x20?(?:ns|µs|us|ms|s|sec|secs|seconds?|min|mins|minutes?|h)\b
)""", re.X)
VOLATILE_MARK = "#"
# A run of one of these characters is padding (pytest centres its summary between
# ``=`` signs, so a longer duration means fewer of them); any run counts as three.
PADDING = re.compile(r"([=\-_*~#])\1\1+")
# ``[tool:<call id>] `` at the start of a stored tool result (the protocols'
# ``Message("tool", f"[tool:{call_id}] {text}")``).
_CALL_ID = re.compile(r"\[tool:[^\]\n]*\] ")


def _without_call_id(content: str) -> str:
    match = _CALL_ID.match(content)
    return "[tool] " + content[match.end():] if match else content


def same_key(content: str) -> str:
    """The text as a reader compares it: whitespace and the tool call's id aside."""
    return text_key(_without_call_id(content))


def copy_key(content: str) -> str:
    """``same_key`` with the volatile parts masked: equal for two runs of one command."""
    masked = VOLATILE.sub(VOLATILE_MARK, _without_call_id(content))
    return " ".join(PADDING.sub(r"\1\1\1", masked).split())


class Folder:
    """Hits in rank order in; the first of each copy key kept, the rest folded into it."""

    def __init__(self) -> None:
        self._kept: list[Hit] = []
        self._slot: dict[str, int] = {}
        self._folded: dict[int, list[str]] = {}
        self._identical: dict[int, bool] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def add(self, hit: Hit, *, keep: bool = True) -> bool:
        """Fold ``hit`` into the kept copy of it, else keep it when ``keep``.
        Whether it was kept."""
        key = copy_key(hit.content)
        at = self._slot.get(key)
        if at is None:
            if keep:
                self._slot[key] = len(self._kept)
                self._kept.append(hit)
            return keep
        first = self._kept[at]
        self._folded.setdefault(at, []).extend((hit.ref, *hit.folded))
        self._identical[at] = (self._identical.get(at, first.folded_identical)
                               and hit.folded_identical
                               and same_key(hit.content) == same_key(first.content))
        return False

    def hits(self) -> list[Hit]:
        """The kept hits, best first, each naming the hits folded into it."""
        return [replace(hit, folded=(*hit.folded, *self._folded[i]),
                        folded_identical=self._identical[i]) if i in self._folded else hit
                for i, hit in enumerate(self._kept)]


def fold(hits: Iterable[Hit]) -> list[Hit]:
    """``hits`` (best first) with every copy folded into the best-ranked one; hits
    folded already (one tenant's result) stay folded, their ids carried over."""
    folder = Folder()
    for hit in hits:
        folder.add(hit)
    return folder.hits()
