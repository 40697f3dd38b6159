"""Plain records passed between the proxy, the importers and the store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True, slots=True)
class RawOutputs:
    """A turn's output as the client received it: ``body``, the bytes of one
    ``protocol`` response (an event stream or JSON), then ``after`` (messages
    the bytes do not show, such as the recall calls the gateway answered).
    Parsed for storage where the turn is written, off the event loop
    (``collector.raw_outputs``)."""

    protocol: str
    body: bytes
    after: tuple[Message, ...] = ()


@dataclass(frozen=True, slots=True)
class RawTurn:
    """A turn whose output is still ``RawOutputs``: ``turn`` holds the identity,
    the input and any output already known; the writer appends the parsed
    output (``collector.resolve_turn``). ``side_channel`` marks every message
    as it does on a ``PendingTurn``."""

    turn: TurnRecord
    output: RawOutputs
    side_channel: bool = False
