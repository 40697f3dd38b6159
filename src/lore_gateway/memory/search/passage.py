"""Which part of a long message a recall result shows: whole lines around the match.

A result line has room for a part of a long tool output, and the part that
answers is where the query's words are: a traceback in the middle of a test run,
the summary line at its end, a function in a file view. A window of characters
around those words cuts the first and last of its lines in half (the frame's
file name, the exception's message), so the window is chosen by lines instead:

1. the **core**: the run of lines, from one line holding a query word to
   another, that fits the room and holds the most distinct query words (then
   the most such lines, then the shortest);
2. grown **line by line**, one before and one after in turn, first to the blank
   lines around it (its paragraph, a block of output), then beyond, while each
   whole line fits;
3. followed by the message's **last lines** (``END_SHARE`` of the room, at most
   ``END_CHARS``): an output's outcome is at its end (the test run's "1 failed,
   13 passed", "Ran 87 tests"), and a match elsewhere in it rarely reaches it.
   On ``lore bench coding``'s natural questions (tuning part) the key facts a
   rendered recall missed were most often such summary lines; shown, they raise
   the questions whose every key fact the rendered recall holds, on both sets
   and in every scope (docs/notes/2026-12-05-issue-33-ranking.md).

The lines are joined with single spaces (a result is one line of the recall
text) and "…" marks text left out before or after. A line longer than the whole
room (minified JSON, one long paragraph) is the one case cut inside a line: the
window of it holding the most query words, cut at spaces. Without the query's
words in a long message, its first lines are shown.

Pure, and linear in the message's length.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter

__all__ = ["ELLIPSIS", "passage"]

ELLIPSIS = "…"
# A query word's first occurrences place the passage; more of them cost time on a
# huge output and do not move it (the same bound the character window had).
OCCURRENCES = 20
# An in-line cut moves back to a space when one is this close: a word is whole
# unless it is longer than this.
WORD_SLACK = 40
# The last lines of a cut message are always shown, in at most this share of its
# room and this many characters: a command's outcome ends its output (a test
# run's summary line, a traceback's exception, mini-swe-agent's return code).
# Two or three lines of a test run's summary; the rest goes to the match.
END_SHARE = 0.2
END_CHARS = 240


def passage(content: str, terms: list[str], cap: int) -> str:
    """``content`` with its whitespace collapsed, or, when that is longer than
    ``cap`` characters, whole lines around the query's ``terms`` (lower-case)
    and its last lines, "…" marking what is left out; at most ``cap``
    characters either way."""
    lines = [" ".join(line.split()) for line in content.splitlines()]
    whole = " ".join(line for line in lines if line)
    if len(whole) <= cap:
        return whole
    found = _found(content.lower(), terms)
    # The last lines are always shown: a command's outcome ends its output.
    end = _end(lines, min(END_SHARE * cap, END_CHARS))
    tail = " ".join(line for line in lines[end:] if line)
    body = lines[:end]
    found = {i: words for i, words in found.items() if i < end}
    room = cap - 2 * len(ELLIPSIS) - (len(tail) + 1 if tail else 0)
    core = _core(body, found, room)
    if core is None:
        shown = _inline(body, found, room)
    else:
        lo, hi = _grow(body, *core, room)
        shown = (ELLIPSIS if any(body[:lo]) else "") \
            + " ".join(line for line in body[lo:hi + 1] if line) \
            + (ELLIPSIS if any(body[hi + 1:]) else "")
    return f"{shown} {tail}" if tail else shown


def _end(lines: list[str], room: float) -> int:
    """Where the last lines that fit ``room`` start (len(lines): none fits)."""
    used, at = 0, len(lines)
    while at > 0 and used + _cost(lines[at - 1]) <= room:
        at -= 1
        used += _cost(lines[at])
    return at if any(lines[at:]) and at > 0 else len(lines)


def _found(lowered: str, terms: list[str]) -> dict[int, set[str]]:
    """The query words each line holds (line index → words), from each word's
    first OCCURRENCES in the text."""
    starts = [0]
    for line in lowered.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    found: dict[int, set[str]] = {}
    for term in terms:
        at, seen = 0, 0
        while seen < OCCURRENCES and (at := lowered.find(term, at)) >= 0:
            found.setdefault(bisect_right(starts, at) - 1, set()).add(term)
            at += len(term)
            seen += 1
    return found


def _core(lines: list[str], found: dict[int, set[str]],
          room: int) -> tuple[int, int] | None:
    """(first, last) line of the best run between matched lines that fits ``room``;
    the first line when nothing matched; None when the best line is too long."""
    if not found:
        return (0, 0) if len(lines[0]) <= room else None
    matched = sorted(found)
    # Length of lines[0:i] joined, blank lines adding nothing (prefix sums).
    size = [0]
    for line in lines:
        size.append(size[-1] + (len(line) + 1 if line else 0))

    def width(a: int, b: int) -> int:
        return size[b + 1] - size[a] - 1

    best: tuple[tuple[int, int, int], tuple[int, int]] | None = None
    words: Counter[str] = Counter()
    left = 0
    for right, last in enumerate(matched):
        words.update(found[last])
        while left < right and width(matched[left], last) > room:
            words.subtract(found[matched[left]])
            left += 1
        if width(matched[left], last) > room:
            continue
        score = (sum(1 for n in words.values() if n > 0), right - left + 1,
                 -width(matched[left], last))
        if best is None or score > best[0]:
            best = (score, (matched[left], last))
    longest = max(matched, key=lambda i: (len(found[i]), -i))
    if best is None or (len(found[longest]) > best[0][0] and len(lines[longest]) > room):
        return None
    return best[1]


def _grow(lines: list[str], lo: int, hi: int, room: int) -> tuple[int, int]:
    """``lines[lo:hi + 1]`` widened a line at a time, before and after in turn, to
    its paragraph first and then beyond, while the whole lines fit ``room``."""
    used = len(" ".join(line for line in lines[lo:hi + 1] if line))
    para_lo, para_hi = lo, hi
    while para_lo > 0 and lines[para_lo - 1]:
        para_lo -= 1
    while para_hi < len(lines) - 1 and lines[para_hi + 1]:
        para_hi += 1
    for first, last in ((para_lo, para_hi), (0, len(lines) - 1)):
        up = down = True
        while up or down:
            if up:
                up = lo > first and used + _cost(lines[lo - 1]) <= room
                if up:
                    lo -= 1
                    used += _cost(lines[lo])
            if down:
                down = hi < last and used + _cost(lines[hi + 1]) <= room
                if down:
                    hi += 1
                    used += _cost(lines[hi])
    return lo, hi


def _cost(line: str) -> int:
    return len(line) + 1 if line else 0


def _inline(lines: list[str], found: dict[int, set[str]], room: int) -> str:
    """The window of the matched line holding the most query words (the first line
    when none matched) that fits ``room``, cut at spaces."""
    at = max(found, key=lambda i: (len(found[i]), -i)) if found else 0
    line = lines[at]
    lowered = line.lower()
    starts = sorted((pos, term) for term in found.get(at, ())
                    for pos in _positions(lowered, term))

    def words_in(lo: int) -> int:
        return len({t for pos, t in starts if lo <= pos and pos + len(t) <= lo + room})

    lo = 0
    best = words_in(0)
    for pos, _ in starts:
        start = max(0, min(pos - room // 4, len(line) - room))
        if (n := words_in(start)) > best:
            best, lo = n, start
    hi = lo + room
    if lo > 0 and (space := line.find(" ", lo, lo + WORD_SLACK)) >= 0:
        lo = space + 1
    if hi < len(line) and (space := line.rfind(" ", hi - WORD_SLACK, hi + 1)) > lo:
        hi = space
    before = ELLIPSIS if lo > 0 or any(lines[:at]) else ""
    after = ELLIPSIS if hi < len(line) or any(lines[at + 1:]) else ""
    return before + line[lo:hi].strip() + after


def _positions(lowered: str, term: str) -> list[int]:
    out: list[int] = []
    at = 0
    while len(out) < OCCURRENCES and (at := lowered.find(term, at)) >= 0:
        out.append(at)
        at += len(term)
    return out
