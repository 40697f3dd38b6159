"""Turning a free-text recall query into FTS5 MATCH expressions.

A recall query is written by a model ("When did Caroline go to the support
group?"), not by a search expert, so every FTS5 operator in it is treated as text:
terms are extracted with a Unicode word pattern, lower-cased, stripped of stop
words (question words included) and quoted. Quoting means ``AND``, ``NEAR`` or a
stray ``"`` in the query can never become FTS syntax or a syntax error.

Natural-language questions rarely share *every* content word with the answer
turn, so search ranks the disjunction of the terms. On a large store a common
term makes that disjunction match (and FTS5 score) a large share of every row, so
:func:`plan_match` chooses, from each term's document frequency, which terms a
search can afford and whether it must fall back to the conjunction over the most
recent matches (docs/search.md, "Latency").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# Longest query we parse; recall queries are a sentence or two. Anything longer is
# most likely pasted content, and 32 terms already make a broad OR query.
MAX_TERMS = 32
# Single characters are noise for BM25 (and the porter stemmer leaves them alone).
MIN_TERM_CHARS = 2
# Shorter terms are matched exactly: a short prefix ("go"*) expands to many terms,
# and FTS5 merges all their doclists on every query.
PREFIX_MIN_CHARS = 4

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)
# An identifier: word characters joined by ``_ . / : -`` (snake_case, dotted names,
# paths, ``file.py:123``). Matched as one FTS5 phrase, so ``get_child_arguments``
# finds those three tokens adjacent, not each of them anywhere.
_IDENTIFIER = re.compile(r"\w+(?:[./:\-]+\w+)+|\w*_\w+", re.UNICODE)
# Identifiers of more parts than this are pasted text, not a name.
MAX_IDENTIFIER_PARTS = 8

# English function words plus question words: they carry no topic. Kept short on
# purpose; content-bearing words ("first", "last", "before") stay, because temporal
# questions depend on them less than on the nouns, but they do no harm to BM25.
STOP_WORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been
being below between both but by can can't cannot could couldn't did didn't do does
doesn't doing don't down during each few for from further had hadn't has hasn't have
haven't having he he'd he'll he's her here here's hers herself him himself his how
how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most
mustn't my myself no nor not of off on once only or other ought our ours ourselves out
over own same shan't she she'd she'll she's should shouldn't so some such than that
that's the their theirs them themselves then there there's these they they'd they'll
they're they've this those through to too under until up very was wasn't we we'd we'll
we're we've were weren't what what's when when's where where's which while who who's
whom why why's with won't would wouldn't you you'd you'll you're you've your yours
yourself yourselves also just will would like likely kind sort thing things get got
""".split())


# What an agent's transcript shows when it did the thing a question asks about. A
# question about an edit ("which file did the agent change …") is answered by the
# message that wrote the file, which rarely repeats the question's words; these
# phrases (shell edits, the Claude Code / Codex edit tools and their arguments)
# mark such messages, and search lifts candidates that hold one.
EDIT_WORDS = frozenset("""
edit edited editing edits modify modified modifying change changed changing patch
patched patching rewrite rewrote rewritten wrote create created
""".split())
EDIT_PHRASES = ('"sed -i"', '"perl -i"', '"tool_call:edit"', '"tool_call:multiedit"',
                '"tool_call:write"', '"apply_patch"', '"update file"', '"old_string"',
                '"writelines"', '"write_text"', '"str_replace"')


def intent_phrases(text: str) -> tuple[str, ...]:
    """FTS5 phrases that mark a message as doing what ``text`` asks about (may be empty)."""
    words = set(tokenize(text))
    return EDIT_PHRASES if words & EDIT_WORDS else ()


@dataclass(frozen=True, slots=True)
class ParsedQuery:
    """The content terms of a query, in first-seen order."""

    terms: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.terms


def phrase(term: str, *, prefix: bool) -> str:
    """One quoted FTS5 phrase, optionally a prefix query (``"deploy"*``).

    Prefix matching (lore-spec G.4 does the same) lets "deploy" find "deployment"
    where the porter stemmer keeps them apart.
    """
    return _quote(term) + ("*" if prefix else "")


def prefix_eligible(term: str) -> bool:
    """Plain words of ≥ 4 characters; identifiers are matched exactly."""
    return len(term) >= PREFIX_MIN_CHARS and _WORD.fullmatch(term) is not None


@dataclass(frozen=True, slots=True)
class TermCost:
    """A query term as it will be matched, with how many stored rows match it."""

    phrase: str
    df: int


@dataclass(frozen=True, slots=True)
class MatchPlan:
    """What one search asks FTS5: the phrases and how they are combined.

    ``recent`` means the affordable plan is too broad to score every match: the
    conjunction of ``phrases`` is ranked over its ``recent`` newest matches only.
    ``ranked=False`` means no term is affordable at all: the newest matches of the
    conjunction are returned in recency order, without BM25.
    """

    phrases: tuple[str, ...]
    conjunction: bool = False
    recent: int = 0
    ranked: bool = True

    @property
    def empty(self) -> bool:
        return not self.phrases

    @property
    def expression(self) -> str:
        return (" AND " if self.conjunction else " OR ").join(self.phrases)


def plan_match(terms: Sequence[TermCost], *, scope_fraction: float, max_df: int,
               max_counted: int, max_scored: int) -> MatchPlan:
    """Choose the terms a search can afford, rarest first.

    FTS5's BM25 costs two things per phrase: its IDF walks the phrase's whole
    doclist (``df`` rows, cheap each), and every in-scope match is scored (about
    30 times dearer per row). So terms are taken from the rarest while the rows
    counted stay within ``max_counted`` and the estimated in-scope matches
    (``df · scope_fraction``) within ``max_scored``; a term matching more than
    ``max_df`` rows is a stop word for this store. The rarest terms carry most
    of BM25's weight anyway (IDF = log(N / df)). On a small store nothing is
    dropped. When even the rarest term has too many in-scope matches, the plan
    ranks the conjunction of what is affordable over its ``max_scored`` newest
    matches instead; when every term is a stop word, the conjunction of all of
    them is returned newest first, unranked (BM25's IDF walk alone would cost
    more than the whole budget).
    """
    usable = sorted((t for t in terms if 0 < t.df <= max_df), key=lambda t: t.df)
    if not usable:
        common = tuple(t.phrase for t in terms if t.df > max_df)
        return MatchPlan(common, conjunction=True, ranked=False) if common else MatchPlan(())
    fraction = min(max(scope_fraction, 0.0), 1.0)
    if usable[0].df * fraction > max_scored:
        chosen: list[str] = []
        counted = 0
        for t in usable:
            if chosen and counted + t.df > max_counted:
                break
            chosen.append(t.phrase)
            counted += t.df
        return MatchPlan(tuple(chosen), conjunction=True, recent=max_scored)
    chosen, counted = [], 0
    for t in usable:
        if chosen and (counted + t.df > max_counted or (counted + t.df) * fraction > max_scored):
            break
        chosen.append(t.phrase)
        counted += t.df
    return MatchPlan(tuple(chosen))


def _quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens, apostrophes normalised, possessive ``'s`` dropped."""
    out = []
    for match in _WORD.finditer(text.lower()):
        word = match.group(0).replace("’", "'")
        if word.endswith("'s"):
            word = word[:-2]
        out.append(word)
    return out


def identifiers(text: str) -> list[str]:
    """Identifier-shaped words of ``text`` (``snake_case``, ``a.b.c``, paths), lower-cased."""
    out = []
    for match in _IDENTIFIER.finditer(text.lower()):
        parts = [p for p in re.split(r"[\W_]+", match.group(0)) if p]
        if 2 <= len(parts) <= MAX_IDENTIFIER_PARTS:
            out.append(match.group(0).strip("_"))
    return out


def parse_query(text: str) -> ParsedQuery:
    """Content terms of ``text``, in first-seen order, de-duplicated and capped.

    Identifiers come first, each as one term (an FTS5 phrase of its parts), then
    every word on its own: the phrase rewards the exact name, the words still
    match prose that spells it differently.
    """
    seen: dict[str, None] = dict.fromkeys(identifiers(text)[:MAX_TERMS // 2])
    for word in tokenize(text):
        if len(word) < MIN_TERM_CHARS or word in STOP_WORDS or word in seen:
            continue
        seen[word] = None
        if len(seen) >= MAX_TERMS:
            break
    return ParsedQuery(terms=tuple(seen))
