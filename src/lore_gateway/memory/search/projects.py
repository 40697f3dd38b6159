"""The asking project first: whose results a search in scope ``all`` puts ahead.

A developer asks from one project. In scope ``all`` (the recall tool's default)
a big session of another project that shares the question's words would
otherwise outrank the project's own answer, and cross-project recall that
derails a session is a top complaint against the reference system (issue 33).
So the candidates of other projects keep ``OTHER_PROJECT_FACTOR`` of their score,
unless the question points elsewhere:

- it **names** another project: the last part of its path (``lore-gateway`` for
  ``/home/dev/src/lore-gateway``) as a word of the question, when that name is
  not a plain word (it holds a digit, ``-``, ``_`` or ``.``) or stands next to a
  word like "project" or "repo" ("in the billing project"): a project called
  ``main`` is not named by "the main function";
- or it holds a **path inside** another project (``/home/dev/src/infra/deploy.sh``).

Then the named projects go first instead. A path outside every candidate's
project (``/usr/lib/python3.11/…`` in a traceback) points nowhere in memory and
changes nothing.

Projects are what the identity gives (``memory/tenancy/identity.py``): the client's
working directory, a header's label, or ``unknown``. Two path projects are the
same project when one holds the other, so ``lore recall`` run from a
subdirectory of a stored project favours that project.

Pure functions, plus ``favour`` (one read of the best candidates' projects).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lore_gateway.storage.base import Connection

# identity.UNKNOWN_PROJECT: a request that named no project asks from none.
UNKNOWN = "unknown"
# The share of its score a candidate of another project keeps in scope ``all``.
# ``lore bench coding``, multi_project (30 sessions in 5 projects), tuning part:
# 1.0 (no preference) 0.727 natural / 0.865 rule-made hit@10; 0.5, 0.25 and 0.1
# all 0.818 / 0.897 (docs/notes/2026-12-05-issue-33-coding-bench.md). Of that
# plateau 0.25 is taken: the own project outranks another's match unless that
# one is four times stronger (a weak own match against an exact one elsewhere).
OTHER_PROJECT_FACTOR = 0.25
# The best candidates whose project is read. Enough for any top 10 after the rows a
# result never holds are skipped; a candidate further down is below every favoured
# one of these already, so leaving it undemoted cannot put it ahead of them.
PROJECT_CANDIDATES = 200
# A project name shorter than this ("a", "x1") names nothing.
MIN_NAME_CHARS = 3
# Words that make a plain word next to them a project's name.
PROJECT_WORDS = frozenset({"project", "projects", "repo", "repos", "repository",
                           "repositories", "codebase", "workspace", "checkout"})
# A project path longer than this is labelled by its end (the part that tells
# projects apart); a recall result line is at most ~1,200 characters.
LABEL_CHARS = 80
_TOKEN = re.compile(r"\w[\w.\-]*\w|\w")
# An absolute or home-relative path in a question.
_PATH = re.compile(r"(?<![\w.~/])[~/][\w.\-~/]*\w")


def is_path(project: str) -> bool:
    return project.startswith(("/", "~"))


def contains(outer: str, inner: str) -> bool:
    """Whether path ``inner`` is path ``outer`` or lies inside it (the root holds
    nothing but itself: an agent started in ``/`` is not every project)."""
    stem = outer.rstrip("/")
    return inner == outer or (stem != "" and inner.startswith(stem + "/"))


def related(a: str, b: str) -> bool:
    """The same project: equal, or two paths of which one holds the other."""
    return a == b or (is_path(a) and is_path(b) and (contains(a, b) or contains(b, a)))


def name_of(project: str) -> str:
    """A project's name as a question would write it: its last path part, lower-cased."""
    if project == UNKNOWN:
        return ""
    name = project.rstrip("/").rsplit("/", 1)[-1].lower()
    return name if len(name) >= MIN_NAME_CHARS else ""


def _named(tokens: list[str], name: str) -> bool:
    for i, token in enumerate(tokens):
        if token != name:
            continue
        if not name.isalpha():
            return True
        if PROJECT_WORDS.intersection(tokens[max(0, i - 1):i] + tokens[i + 1:i + 2]):
            return True
    return False


def favoured(query: str, asking: str, projects: Iterable[str]) -> frozenset[str] | None:
    """The projects among ``projects`` whose candidates go first, or None for no
    preference (the question asks from no project and names none)."""
    tokens = _TOKEN.findall(query.lower())
    paths = _PATH.findall(query)
    candidates = set(projects)
    named = frozenset(
        p for p in candidates if not (asking and related(p, asking)) and (
            ((name := name_of(p)) and _named(tokens, name))
            or (is_path(p) and any(contains(p, path) for path in paths))))
    if named:
        return named
    if not asking or asking == UNKNOWN:
        return None
    return frozenset(p for p in candidates if related(p, asking))


def favour(conn: Connection, scores: dict[int, float], query: str, asking: str) -> None:
    """Multiply the best candidates that are not of a favoured project by
    ``OTHER_PROJECT_FACTOR`` (in place)."""
    best = sorted(scores, key=lambda mid: -scores[mid])[:PROJECT_CANDIDATES]
    if not best:
        return
    marks = ",".join("?" * len(best))
    project_of = {int(mid): str(project) for mid, project in conn.execute(
        f"SELECT id, project FROM messages WHERE id IN ({marks})", best)}
    chosen = favoured(query, asking, set(project_of.values()))
    if chosen is None:
        return
    for mid, project in project_of.items():
        if project not in chosen:
            scores[mid] *= OTHER_PROJECT_FACTOR


def label(project: str, asking: str) -> str:
    """How a hit of another project says so in the recall text ("" for the asking
    project's own hits, and when the search asked from no project)."""
    if not asking or related(project, asking):
        return ""
    return project if len(project) <= LABEL_CHARS else "…" + project[-(LABEL_CHARS - 1):]
