"""Supersession: a newer statement of a different value for the same subject.

A decision changes (the datastore, Postgres → SQLite; a cache TTL, 30 s → 300 s)
and memory still holds the old statement, which matches a question about the
subject as well as the new one does. A reader must see the current value first
and know the old one is stale, so the old one is kept (it is history, and the
words around it may still matter) but labelled and ranked below its successor.

A **statement** is one clause that gives a value for a subject, in one of these
shapes (first match wins, per clause; a clause ends at a line break, ``;`` or a
sentence's period):

- ``switch(ed)/change(d)/move(d)/migrate(d) X from A to B`` → (X, B);
- ``set X to V`` → (X, V);
- ``use V for X`` / ``use V as X`` → (X, V);
- ``X is/are/is now/will be/should be/stays V`` → (X, V);
- ``X = V``, ``X: V``, ``X → V`` (``->``, ``=>``) → (X, V), on a line of its own
  (opening a longer line, ``Name:`` is a speaker or a label); a value that is
  itself ``A → B`` counts as B.

The **subject** is the key words before the verb, lower-cased, without filler
(articles, "we decided that", a leading ``Decision:`` label); it must hold 1 to
``MAX_SUBJECT_WORDS`` of them, or the clause is prose, not a setting. The
**value** is the rest up to a reason (``because``, ``since``, a comma), compared
with case and spaces aside (``30 s`` = ``30s``), at most ``MAX_VALUE_WORDS`` words.

Among the hits of one search (``supersede``), the newest user or assistant
message (or distilled log) of a project stating a subject holds its current value
there; an older one stating another value for it is labelled ``superseded_by``
that message. When the question names that subject (every key word of it), the
stale hit is also moved down to just below its successor (newest first), so the
current value comes first and nothing else moves; otherwise it keeps its place
and only the label warns. Restating the same value supersedes nothing. Pulling
the successor up instead moved more of the coding bench's rankings than it
fixed. Moving every labelled hit, and reading a transcript's ``Name:`` as a
subject, cost LoCoMo's categories 1-4 a third of their MRR (0.611 → 0.434):
every short line of a speaker "changed" the speaker's value, and a question
naming the speaker lost its evidence down the list.

Limits, on purpose (it is a rule, not a model):
- only the hits of one search are compared: an old statement whose successor the
  search did not return stays unlabelled;
- subjects match on their words, so "the cache TTL" and "TTL of the cache" are
  different subjects, and two unrelated things with the same name are one;
- a message is superseded as a whole, though only one of its statements changed;
- a question ("what is the cache TTL?"), a long clause, code and a message
  stating more than ``MAX_STATEMENTS`` subjects (a listing) state nothing, so a
  decision stated inside a long paragraph or a config dump is not seen;
- tool output (a file holding ``ttl = 30``) states what a file said, not a
  decision, and is never compared.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from lore_gateway.memory.search.hits import Hit

__all__ = ["Statement", "changed_subject", "statements", "supersede"]

# A subject of more key words than this is the start of a sentence, not the name
# of a setting or a decision ("the cache TTL", "the CI python version").
MAX_SUBJECT_WORDS = 4
# A value longer than this is an explanation; a setting, a version, a path or a
# choice fits in a few words.
MAX_VALUE_WORDS = 4
# A clause of more words than this is prose that happens to hold "is" or ":";
# a decision or a setting is said in one short clause.
MAX_CLAUSE_WORDS = 14
# Roles whose words state decisions: the conversation and its distilled logs
# (``observations``: a session's decisions, one bullet each, which a search finds
# as readily as the turn itself). Tool output quotes files and commands.
STATING_ROLES = frozenset({"user", "assistant", "observations"})
# A message stating more subjects than this is a listing (a file, a log, a
# plan, a config dump), not a decision: it states nothing. On the coding-sessions
# set (2,182 user and assistant messages) the loose rule found statements in 82%
# of the messages and reordered the top 10 of most questions (MRR 0.763 → 0.685);
# these bounds keep it to the few short statements a person makes.
MAX_STATEMENTS = 3

# A subject given more values than this among one search's hits is a label, not a
# setting: a transcript's speaker ("Caroline: ..."), "Result: ...". A decision
# changes a few times; LoCoMo's speakers "changed" on every short line.
MAX_VALUES = 3

_FILLER = frozenset(
    "a an the our your my its this that these those we i you they it now then so ok okay "
    "yes no please let lets let's decided decide decision agreed going to will should "
    "default current currently new old also actually instead just "
    # The labels an observation log's lines open with ("Date: Jan 5, 2026",
    # "User: ..."): every log states a date, and none of them supersedes another.
    "date time user assistant "
    # Words that open a label or a clause, not a subject ("THOUGHT: ...",
    # "Issue: ...", "here is ...", "which is ...").
    "thought tool_call issue note example output error result step todo summary answer "
    "question problem reason here there which other if http https".split())
# A clause holding one of these is code, a call or markup, not a statement (``>``
# is left out: ``->`` and ``=>`` are arrows).
_CODE = re.compile(r"[(){}\[\]<\"|$\\]")
# An observation log's bullet opens with a mark and a clock time: "🔴 (12:01) ".
_LOG_PREFIX = re.compile(r"^[^\w(]*\(\d{1,2}:\d\d\)\s*")
_QUESTION_WORDS = frozenset(
    "what which who whom whose where when why how is are was were do does did can could "
    "would shall".split())
# A value that opens with one of these is a clause ("the plan is to read every
# file", "the problem is that ..."), not a value.
_CLAUSE_WORDS = frozenset("to that because why how what when where whether if".split())
_CLAUSE_END = re.compile(r";|(?<=[.!?])\s+")
_WORD = re.compile(r"[a-z0-9_][a-z0-9_./-]*")
_ARROW = r"(?:→|->|=>)"
_SHAPES = (
    re.compile(r"\b(?:switch|switched|switching|change|changed|changing|move|moved|moving"
               r"|migrate|migrated|migrating)\s+(?P<subject>.+?)\s+from\s+.+?\s+to\s+"
               r"(?P<value>.+)", re.I),
    re.compile(r"\b(?:set|sets|setting)\s+(?P<subject>.+?)\s+to\s+(?P<value>.+)", re.I),
    re.compile(r"\b(?:use|uses|using)\s+(?P<value>.+?)\s+(?:for|as)\s+(?P<trailing>.+)", re.I),
    re.compile(r"^(?P<subject>.+?)\s+(?:is\s+now|is|are|will\s+be|should\s+be|stays)\s+"
               r"(?P<value>.+)", re.I),
    re.compile(rf"^(?P<subject>[^=:→]+?)\s*(?:=|:|{_ARROW})\s*(?P<value>.+)", re.I),
)
# Where a value stops: its reason or a second thought.
_VALUE_END = re.compile(r",|\s(?:because|since|as|so|but|and|which|instead|until|from now)\s"
                        r"|\s[-–—]\s|\(", re.I)


@dataclass(frozen=True, slots=True)
class Statement:
    """A value given for a subject: both normalised for comparison."""

    subject: str
    value: str


def statements(text: str) -> list[Statement]:
    """The statements ``text`` makes, in order; one per clause at most."""
    found: list[Statement] = []
    for line in text.split("\n"):
        clauses = _CLAUSE_END.split(line)
        # ``key: value`` stands on a line of its own; opening a longer line it is a
        # speaker or a label ("Caroline: Thanks, Mel! ...", "Note: ...").
        shapes = _SHAPES if len(clauses) == 1 else _SHAPES[:-1]
        for clause in clauses:
            found.extend(_clause_statement(clause, shapes))
            if len(found) > MAX_STATEMENTS:
                return []
    return found


def _clause_statement(clause: str, shapes: tuple[re.Pattern[str], ...]) -> list[Statement]:
    """The statement one clause makes, if any (a list of at most one)."""
    clause = _LOG_PREFIX.sub("", clause.strip().strip("*_`#>- "))
    if not clause or _is_question(clause) or _CODE.search(clause) \
            or len(clause.split()) > MAX_CLAUSE_WORDS:
        return []
    clause = clause.rstrip(".!")
    for shape in shapes:
        match = shape.search(clause)
        if match is None:
            continue
        groups = match.groupdict()
        subject = groups.get("subject") or _VALUE_END.split(groups["trailing"], 1)[0]
        statement = _statement(subject, match.group("value"))
        if statement is not None:
            return [statement]
    return []


def _is_question(clause: str) -> bool:
    """A question names a subject without stating its value ("what is the TTL?")."""
    first = clause.split(maxsplit=1)[0].lower()
    return clause.endswith("?") or first in _QUESTION_WORDS


def _statement(subject: str, value: str) -> Statement | None:
    # The subject is what follows a label or an opening clause ("Decision: the
    # datastore", "ok, the cache TTL", "we decided that the port").
    subject = re.split(r"[:,]|\bthat\b", subject, flags=re.I)[-1]
    words = [w for w in _WORD.findall(subject.lower()) if w not in _FILLER]
    if not 1 <= len(words) <= MAX_SUBJECT_WORDS \
            or not any(re.search("[a-z].*[a-z]", w) for w in words):
        return None  # prose, a number, a clock time, a variable ("x = 3")
    value = re.split(_ARROW, value)[-1]
    if value.split()[:1] and value.split()[0].lower() in _CLAUSE_WORDS:
        return None
    value = _VALUE_END.split(value, maxsplit=1)[0]
    kept = [w for w in value.strip().strip("`'\"*").split() if w.lower() not in ("the", "a", "an")]
    if not 1 <= len(kept) <= MAX_VALUE_WORDS:
        return None
    key = "".join(kept).lower().strip(".`'\"*")
    return Statement(" ".join(words), key) if key else None


def changed_subject(old: str, new: str) -> str | None:
    """A subject both texts state with different values (``new``'s value being the
    current one), or ``None``: whether ``new`` supersedes ``old``."""
    was = {s.subject: s.value for s in statements(old)}
    for statement in statements(new):
        before = was.get(statement.subject)
        if before is not None and before != statement.value:
            return statement.subject
    return None


def supersede(hits: list[Hit], query: str = "") -> list[Hit]:
    """``hits`` (best first) with each older statement of a changed value labelled
    ``superseded_by`` its newest successor among them, and placed just below it
    when ``query`` names the changed subject (``_names``).

    The scores stay where they were, position by position, so the list is still
    best first by score (tiers, a merge of several results, the confidence
    scaling all read it that way); the hits move.
    """
    said = {h.ref: statements(h.content) for h in hits if h.role in STATING_ROLES}
    if sum(1 for s in said.values() if s) < 2:
        return hits
    by_ref = {h.ref: h for h in hits}
    # (project, subject) -> (newest hit, its value): a decision holds in its project.
    newest: dict[tuple[str, str], tuple[Hit, str]] = {}
    values: dict[tuple[str, str], set[str]] = {}
    for hit in sorted((h for h in hits if said.get(h.ref)), key=_age):
        for statement in said[hit.ref]:
            newest[hit.project, statement.subject] = (hit, statement.value)
            values.setdefault((hit.project, statement.subject), set()).add(statement.value)
    labels = {key for key, seen in values.items() if len(seen) > MAX_VALUES}
    successor: dict[str, str] = {}
    moved: set[str] = set()  # superseded hits whose subject the question names
    asked = _key_words(query)
    for ref, found in said.items():
        for statement in found:
            key = (by_ref[ref].project, statement.subject)
            current, value = newest[key]
            if key not in labels and current.ref != ref and value != statement.value \
                    and _age(current) > _age(by_ref[ref]):
                successor.setdefault(ref, current.ref)
                if _key_words(statement.subject) <= asked:
                    moved.add(ref)
    if not successor:
        return hits
    followers: dict[str, list[Hit]] = {}
    for hit in hits:
        if hit.ref in moved:
            followers.setdefault(successor[hit.ref], []).append(hit)
    order: list[Hit] = []
    placed: set[str] = set()

    def place(hit: Hit) -> None:
        if hit.ref in placed:
            return
        placed.add(hit.ref)
        order.append(hit)
        for follower in sorted(followers.get(hit.ref, ()), key=_age, reverse=True):
            place(follower)

    for hit in hits:
        if hit.ref not in moved:  # a moved hit comes after its successor
            place(hit)
    return [replace(hit, score=score, superseded_by=successor.get(hit.ref, ""))
            for hit, score in zip(order, _scores(hits), strict=True)]


def _key_words(text: str) -> set[str]:
    """Lower-cased words without filler or a plural's ``s``: "the cache TTLs" and
    "What is the cache TTL?" name the same subject."""
    return {w.removesuffix("s") if len(w) > 3 else w
            for w in _WORD.findall(text.lower()) if w not in _FILLER}


def _age(hit: Hit) -> tuple[float, int]:
    """Oldest first: the store's time, then its id (one turn's messages share a time)."""
    ref = hit.ref[2:]
    return hit.created_at, int(ref) if ref.isdigit() else 0


def _scores(hits: Iterable[Hit]) -> list[float]:
    return sorted((h.score for h in hits), reverse=True)
