"""Dates in a recall query: which stored messages were written at the time it names.

People ask memory about a time ("what did Gina find for her store on 1 February,
2023?", "which tests failed on 2024-03-05?", "what did we change yesterday?").
The words of a date rarely occur in the message that answers it, but the time the
message was stored does: every message keeps ``created_at``. :func:`find_dates`
turns the dates a query names into :class:`DateCue` s (pure text → values, no
clock but the ``now`` it is given), and the date words are taken out of the text
search (``"2023"`` or ``"1"`` as BM25 terms match unrelated numbers). Search then
lifts the candidates written at such a time; it never filters, so a date that
matches nothing stored changes nothing.

Recognised: ISO dates (``2023-05-03``), ``3 May 2023`` / ``May 3, 2023`` (also
without the year), ``May 2023``, ``in May``, ``in 2023``, ``today``,
``yesterday``, ``N days/weeks ago``, ``last week``; ``the week before <date>``
(or ``N days/weeks before``) widens the cue backwards, since what happened before
a date is often told on it and sometimes stored before it. Dates are read as UTC
calendar days; a day cue also covers the day before and after it, which absorbs
the difference to the writer's time zone and "late that night".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

DAY_S = 86_400.0
# A day cue covers this many days on either side (time zones, "that evening").
DAY_SLACK = 1
# "the week before X" without a number of weeks.
DEFAULT_BEFORE_DAYS = 7
# Characters before a date searched for "the week before" (bounded work on a long query).
BEFORE_LOOKBACK = 40
# Most cues one query may name ("between August 11 and August 15" names two).
MAX_CUES = 4

_MONTHS = {name: i + 1 for i, name in enumerate(
    "january february march april may june july august september october november"
    " december".split())}
_MONTHS.update({name[:3]: num for name, num in list(_MONTHS.items())})
_MONTHS["sept"] = 9
_MONTH = r"(?P<{}>january|february|march|april|may|june|july|august|september|october" \
         r"|november|december|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?"
_DAY = r"(?P<{}>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<{}>(?:19|20)\d\d)"
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
                 "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
_COUNT = r"(?P<count>\d{1,3}|a|an|one|two|three|four|five|six|seven|eight|nine|ten)"

_ABSOLUTE = re.compile("|".join((
    r"\b(?P<iso_y>(?:19|20)\d\d)-(?P<iso_m>[01]\d)-(?P<iso_d>[0-3]\d)\b",
    r"\b(?<![\d:.])" + _DAY.format("dmy_d") + r"\s+(?:of\s+)?" + _MONTH.format("dmy_m")
    + r"(?:,?\s+" + _YEAR.format("dmy_y") + r")?\b",
    r"\b" + _MONTH.format("mdy_m") + r"\s+" + _DAY.format("mdy_d")
    + r"(?:,?\s+" + _YEAR.format("mdy_y") + r")?\b(?!:)",
    r"\b" + _MONTH.format("my_m") + r",?\s+" + _YEAR.format("my_y") + r"\b",
    # A bare month or year only after a preposition: "may" is also a verb, and a
    # four-digit number alone is as often a port or a count as a year.
    r"\b(?:in|during|since|of|early|late|mid)\s+" + _MONTH.format("m_m") + r"(?!\w)",
    r"\b(?:in|during|since)\s+" + _YEAR.format("y_y") + r"\b",
)), re.IGNORECASE)
_RELATIVE = re.compile(
    r"\b(?:(?P<today>today|this morning|tonight)|(?P<yesterday>yesterday)"
    r"|(?P<last_week>last week)|" + _COUNT + r"\s+(?P<unit>days?|weeks?)\s+ago)\b",
    re.IGNORECASE)
# "the week before", "two weeks before", "3 days before" right in front of a date.
_BEFORE = re.compile(r"(?:(?:the|a)\s+)?(?:(?P<count>\d{1,3}|two|three|four|five|six|seven"
                     r"|eight|nine|ten)\s+)?(?P<unit>days?|weeks?|weekend)\s+before\s+$",
                     re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class DateCue:
    """A span of calendar time a query names.

    ``start``/``end`` are UTC seconds (``end`` exclusive) when the year is known;
    a date without a year (``in May``, ``May 3``) matches that month (and day) of
    any year, which ``month``/``day`` hold with ``start == end == 0``.
    """

    start: float = 0.0
    end: float = 0.0
    month: int = 0
    day: int = 0

    def covers(self, ts: float) -> bool:
        """Whether a message stored at ``ts`` (unix seconds) was written in this span."""
        if self.end > self.start:
            return self.start <= ts < self.end
        when = datetime.fromtimestamp(ts, UTC).date()
        if not self.day:
            return when.month == self.month
        for shift in range(-DAY_SLACK, DAY_SLACK + 1):
            near = when + timedelta(days=shift)
            if near.month == self.month and near.day == self.day:
                return True
        return False


@dataclass(frozen=True, slots=True)
class DateQuery:
    """The query's date cues, and its text with the date words taken out."""

    cues: tuple[DateCue, ...]
    text: str


def find_dates(text: str, now: float) -> DateQuery:
    """The dates ``text`` names (relative ones against ``now``, unix seconds)."""
    cues: list[DateCue] = []
    spans: list[tuple[int, int]] = []
    for match in _ABSOLUTE.finditer(text):
        if len(cues) >= MAX_CUES:  # pasted text, not a question about a time
            break
        cue = _absolute(match)
        if cue is None:
            continue
        start = match.start()
        lead = max(0, start - BEFORE_LOOKBACK)
        before = _BEFORE.search(text[lead:start])
        if before is not None and cue.end > cue.start:
            cue = _widen(cue, before)
            start = lead + before.start()
        cues.append(cue)
        spans.append((start, match.end()))
    today = datetime.fromtimestamp(now, UTC).date()
    for match in _RELATIVE.finditer(text):
        if len(cues) >= MAX_CUES:
            break
        cues.append(_relative(match, today))
        spans.append(match.span())
    if not cues:
        return DateQuery((), text)
    rest, last = [], 0
    for start, end in sorted(spans):
        if start >= last:
            rest.append(text[last:start])
            last = end
    rest.append(text[last:])
    return DateQuery(tuple(cues), " ".join(rest))


def _days(first: date, count: int) -> DateCue:
    start = datetime(first.year, first.month, first.day, tzinfo=UTC).timestamp()
    return DateCue(start=start, end=start + count * DAY_S)


def _day(year: int, month: int, day: int) -> DateCue | None:
    try:
        first = date(year, month, day) - timedelta(days=DAY_SLACK)
    except ValueError:  # "31 February"
        return None
    return _days(first, 1 + 2 * DAY_SLACK)


def _absolute(match: re.Match[str]) -> DateCue | None:
    g = match.groupdict()
    if g["iso_y"]:
        return _day(int(g["iso_y"]), int(g["iso_m"]), int(g["iso_d"]))
    for prefix in ("dmy", "mdy"):
        if g[f"{prefix}_m"]:
            month, day = _MONTHS[g[f"{prefix}_m"].lower()], int(g[f"{prefix}_d"])
            if not 1 <= day <= 31:
                return None
            if g[f"{prefix}_y"]:
                return _day(int(g[f"{prefix}_y"]), month, day)
            return DateCue(month=month, day=day)
    if g["my_m"]:
        month, year = _MONTHS[g["my_m"].lower()], int(g["my_y"])
        first = date(year, month, 1)
        following = date(year + month // 12, month % 12 + 1, 1)
        return _days(first, (following - first).days)
    if g["m_m"]:
        return DateCue(month=_MONTHS[g["m_m"].lower()])
    year = int(g["y_y"])
    return _days(date(year, 1, 1), (date(year + 1, 1, 1) - date(year, 1, 1)).days)


def _widen(cue: DateCue, before: re.Match[str]) -> DateCue:
    unit = before.group("unit").lower()
    count = before.group("count")
    n = 1 if count is None else int(count) if count.isdigit() else _NUMBER_WORDS[count.lower()]
    days = n * (1 if unit.startswith("day") else DEFAULT_BEFORE_DAYS)
    return DateCue(start=cue.start - days * DAY_S, end=cue.end)


def _relative(match: re.Match[str], today: date) -> DateCue:
    if match.group("today"):
        return _days(today, 1)
    if match.group("yesterday"):
        return _days(today - timedelta(days=1), 1)
    if match.group("last_week"):
        return _days(today - timedelta(days=14), 14)
    count = match.group("count").lower()
    n = int(count) if count.isdigit() else _NUMBER_WORDS[count]
    days = n * (1 if match.group("unit").lower().startswith("day") else 7)
    # "three weeks ago" is rarely exact: a span around it, a fifth of the distance wide.
    slack = max(1, days // 5)
    return _days(today - timedelta(days=days + slack), 1 + 2 * slack)
