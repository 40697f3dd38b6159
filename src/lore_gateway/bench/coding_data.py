"""The coding-session sets of ``lore bench coding``, and how they are stored.

Two question sets over the same 30 sessions (``shared/data/coding-sessions``, see
its SOURCES.md; read in place, never copied here):

- ``coding_eval.json``: the sessions and 173 rule-made questions. Mapped as:
  ``message_index`` → ``gold``, ``gold_indices`` (plus ``message_index``) →
  ``golds``, ``evidence`` (verbatim in the gold message) → the one key fact;
- ``natural_questions.json``: 120 questions written by hand, asked the way people
  ask. Its fields map one to one (``key_facts`` are verbatim strings of gold
  messages); it holds no sessions of its own.

**Held-out part (fixed before any tuning, for both sets):** a session is held out
when the first byte of ``sha1("lore-holdout:" + session_id)`` is divisible by 3.
That is 8 of the 30 sessions (``HELD_OUT_SESSIONS`` in the tests), 47 rule-made
and 32 natural questions. The rule was fixed for the rule-made set before issue 11
tuned anything, and kept unchanged for the natural set, which no ranking was
tuned on before it was split. Tune on the rest; read the held-out figures last.

**Projects:** the sessions are spread over ``PROJECTS`` projects so that a search
in scope ``all`` meets other projects' sessions: sorted by
``sha1("lore-project:" + session_id)`` and dealt out in turn, six sessions to a
project, which mixes the upstream repositories (a django session's project also
holds sympy and pytest sessions, and other projects hold django sessions).

**Noise** is stored beside the conversations, so the bench can count what a top
10 must never hold: after each session's last message, the traces of a hidden
recall per question (the stored ``[tool_call:recall] {...}`` row and a recall
result a client sent back, quoting the gold message) and, for its first question,
a recall *detail* block; and per session one title-generation call (OpenCode's
shape: the task quoted, a short title back), marked ``side_channel`` and stored
in project ``unknown``'s one side-channel session. Recall rows sit after the
conversation, so they change no real message's neighbours or context.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message, Role

TENANT = "bench-coding"
DEFAULT_DATA = Path("../shared/data/coding-sessions/coding_eval.json")
# Read from beside ``coding_eval.json`` (the set's own folder), when present.
NATURAL_FILE = "natural_questions.json"
RULE, NATURAL = "rule", "natural"
SETS = (NATURAL, RULE)
# Five projects of six sessions: each scope-``all`` question meets 24 sessions
# of other projects, as a developer's memory holds several projects.
PROJECTS = 5
PROJECT_PREFIX = "/bench/project-"
# Where OpenCode's title calls land (issue 33: one session in project unknown).
SIDE_CHANNEL_PROJECT = "unknown"
SIDE_CHANNEL_SESSION = "bench-side-channel"
# Characters of a gold message quoted in a stored recall result (a rendered
# result line is at most ~1,200 characters: ``render.MAX_RESULT_CHARS``).
QUOTED_CHARS = 600
# Stored timestamps: message ``index`` seconds after this, so order is the index.
EPOCH = 1.7e9
ROLES: dict[str, Role] = {"user": "user", "assistant": "assistant", "tool": "tool",
                          "system": "system"}
# Meta of the bench's noise rows (what the bench knows a row is, whatever
# search concludes from its text).
NOISE_RECALL = {"noise": "recall"}
NOISE_SIDE = {"noise": "side_channel", "side_channel": True}


def held_out(key: str) -> bool:
    """The fixed held-out rule shared by the quality benches (docs/search.md)."""
    return hashlib.sha1(f"lore-holdout:{key}".encode()).digest()[0] % 3 == 0


def assign_projects(session_ids: list[str]) -> dict[str, str]:
    """Each session's project: sessions in a stable hash order, dealt out in turn."""
    order = sorted(session_ids,
                   key=lambda s: hashlib.sha1(f"lore-project:{s}".encode()).hexdigest())
    return {sid: f"{PROJECT_PREFIX}{i % PROJECTS + 1}" for i, sid in enumerate(order)}


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    messages: tuple[tuple[int, str, str], ...]  # (index, role, content)


@dataclass(frozen=True, slots=True)
class Question:
    set: str
    qid: str
    session_id: str
    kind: str
    position: str
    question: str
    gold: int  # the one message that best holds the answer
    golds: tuple[int, ...]  # every message holding (part of) it, ``gold`` included
    facts: tuple[str, ...]  # verbatim strings a top 10 must show to answer


@dataclass(frozen=True, slots=True)
class CodingSets:
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]
    projects: dict[str, str]
    paths: tuple[Path, ...]

    def of(self, name: str) -> list[Question]:
        return [q for q in self.questions if q.set == name]

    @property
    def fingerprint(self) -> str:
        """What a reused store must have been built from (``coding.run`` ``store``)."""
        digest = hashlib.sha1(NOISE_VERSION.encode())
        for path in self.paths:
            digest.update(path.read_bytes())
        return digest.hexdigest()


# Bump when the stored rows change (noise, projects, metas): a reused store is rebuilt.
NOISE_VERSION = "coding-store-v1"


def load(data: Path, natural: Path | None) -> CodingSets:
    """Both sets; ``natural`` None (or missing) leaves the natural set out."""
    raw = json.loads(data.read_text(encoding="utf-8"))
    sessions = tuple(Session(str(s["session_id"]), tuple(
        (int(m["index"]), str(m["role"]), str(m["content"])) for m in s["messages"]))
        for s in raw["sessions"])
    questions = [_rule_question(i, q) for i, q in enumerate(raw["questions"])]
    paths = [data]
    if natural is not None and natural.is_file():
        paths.append(natural)
        questions += [_natural_question(q) for q in
                      json.loads(natural.read_text(encoding="utf-8"))["questions"]]
    known = {s.session_id for s in sessions}
    questions = [q for q in questions if q.session_id in known]
    return CodingSets(sessions, tuple(questions),
                      assign_projects([s.session_id for s in sessions]), tuple(paths))


def _rule_question(number: int, q: dict[str, Any]) -> Question:
    gold = int(q["message_index"])
    evidence = q.get("evidence")
    return Question(RULE, f"rule-{number}", str(q["session_id"]), str(q["kind"]), "",
                    str(q["question"]), gold,
                    tuple(sorted({gold, *(int(i) for i in q.get("gold_indices", ()))})),
                    (str(evidence),) if evidence else ())


def _natural_question(q: dict[str, Any]) -> Question:
    gold = int(q["message_index"])
    return Question(NATURAL, str(q["id"]), str(q["session_id"]), str(q["kind"]),
                    str(q.get("position", "")), str(q["question"]), gold,
                    tuple(sorted({gold, *(int(i) for i in q["gold_indices"])})),
                    tuple(str(f) for f in q["key_facts"]))


def identity(sets: CodingSets, session_id: str) -> Identity:
    return Identity(TENANT, sets.projects[session_id], session_id)


def turn_records(sets: CodingSets, noise: bool = True) -> Iterator[TurnRecord]:
    """Every session, one turn per message (its index in the meta), then the noise
    (``noise`` False: the sessions alone, as the bench stored them before issue 33)."""
    by_session: dict[str, list[Question]] = {}
    for q in sets.questions:
        by_session.setdefault(q.session_id, []).append(q)
    for session in sets.sessions:
        ident = identity(sets, session.session_id)
        for index, role, content in session.messages:
            yield TurnRecord(identity=ident, protocol="bench:coding", model=None,
                             messages=(Message(ROLES.get(role, "user"), content),),
                             created_at=EPOCH + index, metas=({"index": index},))
        if noise:
            yield from _recall_traces(session, ident, by_session.get(session.session_id, []))
    if not noise:
        return
    side = Identity(TENANT, SIDE_CHANNEL_PROJECT, SIDE_CHANNEL_SESSION)
    for number, session in enumerate(sets.sessions):
        task = session.messages[0][2] if session.messages else ""
        title = next((line.strip() for line in task.splitlines() if line.strip()
                      and not line.startswith("<")), "Untitled")[:80]
        yield TurnRecord(identity=side, protocol="bench:coding", model=None, messages=(
            Message("user", f"Generate a title for this conversation:\n{task}"),
            Message("assistant", title)), created_at=EPOCH + number, metas=(NOISE_SIDE,) * 2)


def _recall_traces(session: Session, ident: Identity,
                   questions: list[Question]) -> Iterator[TurnRecord]:
    """A hidden recall's stored call and a recall result echoed back, per question."""
    text = {index: content for index, _, content in session.messages}
    at = EPOCH + (session.messages[-1][0] + 1 if session.messages else 0)
    for number, q in enumerate(questions):
        quoted = " ".join(text.get(q.gold, "").split())[:QUOTED_CHARS]
        call = f"[tool_call:recall] {json.dumps({'query': q.question, 'scope': 'all'})}"
        result = (f"[tool:toolu_bench_{number}] ## Recall Results\n"
                  "Found 3 results, showing top 1 (score range: 0.80–0.80).\n\n"
                  f"### Strong Matches\n#### Conversation\n- (tool, 2h ago) {quoted} "
                  f"(t:{q.gold})\n\n---\n*1 of 3 results shown.*")
        messages = [Message("assistant", call), Message("tool", result)]
        if number == 0:
            messages.append(Message("tool", f"[tool:toolu_bench_detail] ## Recall Detail: "
                                            f"t:{q.gold}\n#### Conversation\n- (tool, 2h ago)\n"
                                            f"{text.get(q.gold, '')}"))
        yield TurnRecord(identity=ident, protocol="bench:coding", model=None,
                         messages=tuple(messages), created_at=at + number,
                         metas=(NOISE_RECALL,) * len(messages))
