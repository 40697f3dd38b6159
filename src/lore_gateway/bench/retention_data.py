"""The sessions and key-fact questions ``lore bench retention`` replays (pure, plus reads).

Two corpora, one shape (``Corpus``): sessions of (index, role, text) messages and
questions whose ``facts`` are verbatim strings.

- **coding**: the 30 sessions of ``coding_eval.json`` with both question sets
  (``coding_data``: the rule set's ``evidence``, the natural set's ``key_facts``);
- **locomo**: each of LoCoMo's five dev-half conversations as one long session
  (one thread of a chat app; speaker A is the user), and its category 1–4
  questions whose answer appears verbatim in the evidence turns, is at least
  ``MIN_ANSWER_CHARS`` long and occurs at most ``MAX_ANSWER_OCCURRENCES`` times in
  the conversation: a short or common answer ("yes", "2022") would be "kept" by
  any text. 156 of the 762 category 1–4 questions qualify.

The held-out part is ``coding_data.held_out`` of the session id (LoCoMo: of the
sample id, as ``lore bench locomo`` splits it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lore_gateway.bench import locomo
from lore_gateway.bench.coding_data import EPOCH, ROLES, TENANT, CodingSets, Question
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message

LOCOMO = "locomo"
LOCOMO_PROJECT = "bench-locomo"
MIN_ANSWER_CHARS = 8
MAX_ANSWER_OCCURRENCES = 2
# Bump when what is stored changes: a reused store is rebuilt.
STORE_VERSION = "retention-store-v1"


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    identity: Identity
    messages: tuple[tuple[int, str, str], ...]  # (index, role, content)
    created: tuple[float, ...]  # each message's time


@dataclass(frozen=True, slots=True)
class Corpus:
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]
    paths: tuple[Path, ...]

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha1(STORE_VERSION.encode())
        for path in self.paths:
            digest.update(path.read_bytes())
        return digest.hexdigest()

    def records(self) -> Iterator[TurnRecord]:
        """One turn per message, its index in the meta (the bench maps golds by it)."""
        for session in self.sessions:
            for (index, role, content), at in zip(session.messages, session.created,
                                                   strict=True):
                yield TurnRecord(identity=session.identity, protocol="bench:retention",
                                 model=None, messages=(Message(ROLES.get(role, "user"),
                                                               content),),
                                 created_at=at, metas=({"index": index},))


def coding(sets: CodingSets) -> Corpus:
    sessions = tuple(Session(s.session_id, Identity(TENANT, sets.projects[s.session_id],
                                                    s.session_id),
                             s.messages, tuple(EPOCH + i for i, _, _ in s.messages))
                     for s in sets.sessions)
    return Corpus(sessions, sets.questions, sets.paths)


def with_locomo(corpus: Corpus, path: Path) -> Corpus:
    """``corpus`` and LoCoMo's conversations (same tenant, their own project)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    answers = {(item["sample_id"], qa["question"]): str(qa.get("answer", ""))
               for item in raw for qa in item["qa"]}
    sessions = list(corpus.sessions)
    questions = list(corpus.questions)
    for conv in locomo.load(path):
        index = {t.dia_id: i for i, t in enumerate(conv.turns)}
        messages = tuple((i, "user" if t.speaker == conv.speaker_a else "assistant", t.text)
                         for i, t in enumerate(conv.turns))
        sessions.append(Session(conv.sample_id, Identity(TENANT, LOCOMO_PROJECT,
                                                         conv.sample_id),
                                messages, tuple(t.created_at for t in conv.turns)))
        whole = " ".join(t.text for t in conv.turns).lower()
        for number, q in enumerate(conv.questions):
            answer = answers.get((conv.sample_id, q.question), "").strip()
            if q.category not in (1, 2, 3, 4) or not _specific(answer, whole):
                continue
            golds = tuple(sorted(index[e] for e in q.evidence))
            evidence = " ".join(conv.turns[i].text for i in golds)
            at = evidence.lower().find(answer.lower())
            if at < 0:
                continue
            # The fact as the conversation spells it (the answer's case may differ).
            fact = evidence[at:at + len(answer)]
            questions.append(Question(LOCOMO, f"{conv.sample_id}-{number}", conv.sample_id,
                                      f"category {q.category}", "", q.question, golds[-1],
                                      golds, (fact,)))
    return Corpus(tuple(sessions), tuple(questions), (*corpus.paths, path))


def _specific(answer: str, conversation: str) -> bool:
    return (len(answer) >= MIN_ANSWER_CHARS
            and conversation.count(answer.lower()) <= MAX_ANSWER_OCCURRENCES)
