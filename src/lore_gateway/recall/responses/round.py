"""The vocabulary of live Responses interception: the actions the sans-IO
:class:`~lore_gateway.recall.responses.live.LiveInterceptor` returns, its limits
(lore-spec E.1), and the per-round item state every upstream event is applied to
(forwarded, deferred or hidden alike, lore-spec D.3).

Kept apart from the state machine so that what an item *is* (its snapshot for
storage and the follow-up, whether it is a recall) can be read without the
delivery and failure logic around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lore_gateway.protocols.common import ProtocolError, TextBuffer
from lore_gateway.recall.core.chain import FailureCategory
from lore_gateway.recall.core.tool import RecallArgs, RecallArgumentError, is_recall_call
from lore_gateway.recall.responses.recovery import FreshIds

MiB = 1024 * 1024
# E.1 defaults. A real answer is a few hundred KiB; 64 MiB bounds a runaway stream.
MAX_STREAM_BYTES = 64 * MiB
# Item snapshots and the continuation spool kept until the chain ends.
MAX_RETAINED_BYTES = 16 * MiB
# Events held back (and hidden recall events) while a recall is open.
MAX_DEFERRED_BYTES = 1 * MiB

RECALL_FAILED_MESSAGE = "Lore could not continue the response after recall"
GATEWAY_FAILED_MESSAGE = "Gateway request failed"
RATE_LIMITS = "codex.rate_limits"
TERMINALS = ("response.completed", "response.incomplete", "response.failed", "response.done")


@dataclass(frozen=True, slots=True)
class Limits:
    stream_bytes: int = MAX_STREAM_BYTES
    retained_bytes: int = MAX_RETAINED_BYTES
    deferred_bytes: int = MAX_DEFERRED_BYTES


# --- actions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes


@dataclass(frozen=True, slots=True)
class RunRecall:
    """Execute ``args``; ``invalid`` is set instead when the arguments were rejected
    (the interceptor already knows the tool result; the shell just reports back)."""

    call_id: str
    arguments: str
    args: RecallArgs | None
    invalid: RecallArgumentError | None


@dataclass(frozen=True, slots=True)
class FollowUp:
    """Send the follow-up: the request's input plus ``items``."""

    items: tuple[dict[str, Any], ...]
    recovery: bool


@dataclass(frozen=True, slots=True)
class Done:
    ok: bool
    category: FailureCategory | None = None


Action = Send | RunRecall | FollowUp | Done


# --- per-round state ------------------------------------------------------------------


@dataclass(slots=True)
class RoundItem:
    index: int
    raw: dict[str, Any]
    kind: str
    recall: bool = False
    unresolved: bool = False
    done: bool = False
    # Streamed text and arguments (see TextBuffer: appends stay linear).
    args_buf: TextBuffer = field(default_factory=TextBuffer)
    text_buf: TextBuffer = field(default_factory=TextBuffer)

    @property
    def arguments(self) -> str:
        return self.args_buf.value

    @arguments.setter
    def arguments(self, value: str) -> None:
        self.args_buf = TextBuffer(value)

    @property
    def text(self) -> str:
        return self.text_buf.value

    @text.setter
    def text(self, value: str) -> None:
        self.text_buf = TextBuffer(value)

    @property
    def call_id(self) -> str:
        value = self.raw.get("call_id") or self.raw.get("id") or ""
        return str(value)

    def snapshot(self) -> dict[str, Any]:
        """The item as stored: the done item, or the added one completed from deltas."""
        raw = dict(self.raw)
        if self.kind == "function_call":
            raw["arguments"] = raw.get("arguments") or self.arguments
        elif self.kind == "message" and not raw.get("content") and self.text:
            raw["content"] = [{"type": "output_text", "text": self.text, "annotations": []}]
        return raw

    def classify(self, codex: bool) -> None:
        """Mark a function call as recall, or (Codex) as unresolved while its name
        is still unknown."""
        if self.kind != "function_call":
            return
        name = self.raw.get("name")
        self.recall = is_recall_call(name)
        self.unresolved = not self.recall and not name and codex

    def apply(self, name: str, payload: dict[str, Any], codex: bool) -> bool:
        """Apply one data or done event. True when an unresolved call turned out to
        be a recall (its deferred events must be dropped, not released)."""
        if name == "response.function_call_arguments.delta":
            if self.done:
                raise ProtocolError(
                    f"Responses event after output_item.done for index {self.index}"
                )
            self.args_buf.append(str(payload.get("delta") or ""))
        elif name == "response.function_call_arguments.done":
            arguments = payload.get("arguments")
            if isinstance(arguments, str):
                self.arguments = arguments
            self.raw["arguments"] = self.arguments
        elif name == "response.output_text.delta":
            self.text_buf.append(str(payload.get("delta") or ""))
        elif name == "response.output_text.done":
            text = payload.get("text")
            if isinstance(text, str):
                self.text = text
        elif name == "response.output_item.done":
            done = payload.get("item")
            if not isinstance(done, dict):
                raise ProtocolError("malformed Responses event response.output_item.done")
            merged = {**self.raw, **{k: v for k, v in done.items() if v not in (None, "")}}
            if self.kind == "function_call" and not merged.get("arguments"):
                merged["arguments"] = self.arguments
            was_unresolved = self.unresolved
            self.raw = merged
            self.kind = str(merged.get("type") or self.kind)
            self.done = True
            self.classify(codex)
            self.unresolved = False
            return self.recall and was_unresolved
        return False


@dataclass(slots=True)
class Round:
    number: int
    recovery: bool = False
    items: dict[int, RoundItem] = field(default_factory=dict)
    by_item_id: dict[str, int] = field(default_factory=dict)
    last_index: int = -1
    created: dict[str, Any] | None = None
    terminal_name: str | None = None
    terminal: dict[str, Any] | None = None
    fresh_ids: FreshIds | None = None  # a recovery answer gets gateway-made ids

    def recalls(self) -> list[RoundItem]:
        return [i for i in self.items.values() if i.recall]

    def open_hold(self) -> bool:
        return any(i.recall or i.unresolved for i in self.items.values())
