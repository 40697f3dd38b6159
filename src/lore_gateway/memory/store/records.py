"""Plain records passed between the proxy, the importers and the store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from lore_gateway.protocols.common import Message


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a turn belongs to.

    ``tenant`` is ``personal`` in personal mode, the gateway key's tenant in team
    mode (never derived from a provider credential);
    ``project`` is a path-like label or ``"unknown"``; ``session`` is a client
    session id or a fingerprint of the conversation's first user message.
    """

    tenant: str
    project: str
    session: str


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One turn: the new user-side input plus the assistant's output.

    ``dedup_key`` makes imports idempotent; it is ``None`` for live turns. A key of
    the form ``"<stable>#<version>"`` replaces an earlier turn with the same
    ``<stable>`` part and a different version (an import of a transcript whose last
    turn has grown since the previous import).

    ``metas``, when given, has one entry per message and is stored as JSON.
    """

    identity: Identity
    protocol: str
    model: str | None
    messages: tuple[Message, ...]
    created_at: float
    complete: bool = True
    dedup_key: str | None = None
    metas: tuple[dict[str, Any] | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.metas is not None and len(self.metas) != len(self.messages):
            raise ValueError(
                f"TurnRecord.metas has {len(self.metas)} entries for "
                f"{len(self.messages)} messages; give one meta (or None) per message"
            )


# The largest answer handed to storage as its bytes (``RawOutputs``); a larger
# one is parsed by the gateway (and its messages handed over): a pipe message
# stays small, and the storage process never holds much of one turn.
RAW_OUTPUT_MAX_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class RecallRow:
    """A hidden recall's call as storage keeps it (``[tool_call:recall] {...}``),
    and the anchor of the marker the client got in its place (None: no marker),
    where the call is stored among the output (``memory/store/recall_order.py``)."""

    anchor: str | None
    message: Message


@dataclass(frozen=True, slots=True)
class RawOutputs:
    """A turn's output as the client received it: ``body``, the bytes of one
    ``protocol`` response (an event stream or JSON), and ``recalls``, the
    hidden recall calls the bytes show only as markers. Parsed for storage
    where the turn is written, off the event loop (``collector.raw_outputs``)."""

    protocol: str
    body: bytes
    recalls: tuple[RecallRow, ...] = ()


@dataclass(frozen=True, slots=True)
class RawTurn:
    """A turn whose output is still ``RawOutputs``: ``turn`` holds the identity,
    the input and any output already known; the writer appends the parsed
    output (``collector.resolve_turn``). ``side_channel`` marks every message
    as it does on a ``PendingTurn``."""

    turn: TurnRecord
    output: RawOutputs
    side_channel: str | None = None


# What crosses the pipe to the storage process (``turn_to_wire``): builtins only.
# pickle encodes a frozen slots dataclass through Python-level ``__getstate__``
# and ``__setstate__`` (``dataclasses.fields`` on every object, every time), so
# a turn of six such objects cost more to pickle and unpickle than its bytes.
Wire = tuple[Any, ...]


def turn_to_wire(turn: TurnRecord | RawTurn) -> Wire:
    """``turn`` as a tuple of builtins, for ``turn_from_wire`` in another process."""
    if isinstance(turn, RawTurn):
        out = turn.output
        return (_record_to_wire(turn.turn), out.protocol, out.body,
                tuple((r.anchor, r.message.role, r.message.text) for r in out.recalls),
                turn.side_channel)
    return (_record_to_wire(turn),)


def turn_from_wire(wire: Wire) -> TurnRecord | RawTurn:
    record = _record_from_wire(wire[0])
    if len(wire) == 1:
        return record
    _, protocol, body, recalls, side_channel = wire
    rows = tuple(RecallRow(anchor, Message(role, text)) for anchor, role, text in recalls)
    return RawTurn(record, RawOutputs(protocol, body, rows), side_channel)


def _record_to_wire(t: TurnRecord) -> Wire:
    ident = t.identity
    return (ident.tenant, ident.project, ident.session, t.protocol, t.model,
            tuple((m.role, m.text) for m in t.messages), t.created_at, t.complete,
            t.dedup_key, t.metas)


def _record_from_wire(w: Wire) -> TurnRecord:
    (tenant, project, session, protocol, model, messages, created_at, complete, dedup_key,
     metas) = w
    return TurnRecord(Identity(tenant, project, session), protocol, model,
                      tuple(Message(r, t) for r, t in messages), created_at, complete,
                      dedup_key, cast("tuple[dict[str, Any] | None, ...] | None", metas))
