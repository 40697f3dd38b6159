"""Empty-completion telemetry (lore-spec F.1).

An answer with no tool call, no reasoning and only whitespace text is a bug
somewhere between the provider, the recall chain and the client (the class of
bug behind "no response data" reports). When one is delivered the gateway logs
one warning and counts it; extra sinks (an error tracker, a test) may listen.

Telemetry must never change or delay the response it describes. The warning and
the counter are cheap and guarded; extra sinks run on one daemon thread fed by a
bounded queue, so a sink that raises is logged and ignored, and a sink that hangs
only stalls that thread (later reports are dropped once the queue is full).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lore_gateway.obs import metrics

log = logging.getLogger("lore.recall")

# Reports waiting for the extra sinks. Empty completions are rare; a backlog this
# long means a sink is stuck, and dropping is better than growing.
MAX_PENDING = 64
SESSION_CHARS = 16


@dataclass(frozen=True, slots=True)
class EmptyCompletion:
    """What one empty completion looked like (no payload text, ever)."""

    protocol: str
    model: str
    session: str
    stop_reason: str
    output_tokens: int | None
    recall_depth: int


Sink = Callable[[EmptyCompletion], object]


class _Dispatcher:
    """The extra sinks and the thread that calls them."""

    def __init__(self) -> None:
        self._sinks: list[Sink] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue[EmptyCompletion] = queue.Queue(maxsize=MAX_PENDING)
        self._thread: threading.Thread | None = None

    def add(self, sink: Sink) -> Callable[[], None]:
        with self._lock:
            self._sinks.append(sink)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="lore-empty-completion", daemon=True
                )
                self._thread.start()

        def remove() -> None:
            with self._lock:
                if sink in self._sinks:
                    self._sinks.remove(sink)

        return remove

    def submit(self, event: EmptyCompletion) -> None:
        with self._lock:
            if not self._sinks:
                return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.debug("empty-completion telemetry queue full; report dropped")

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            with self._lock:
                sinks = list(self._sinks)
            for sink in sinks:
                try:
                    sink(event)
                except Exception:
                    log.warning("empty-completion telemetry sink failed", exc_info=True)


_dispatcher = _Dispatcher()


def add_sink(sink: Sink) -> Callable[[], None]:
    """Also send every empty completion to ``sink`` (off the response path).
    Returns a function that removes it."""
    return _dispatcher.add(sink)


def report_empty_completion(event: EmptyCompletion) -> None:
    """Log one warning, count it, notify the extra sinks. Never raises."""
    try:
        log.warning(
            "empty completion → client: protocol=%s model=%s stopReason=%s outputTokens=%s "
            "recallDepth=%d session=%s",
            event.protocol, event.model, event.stop_reason,
            "unknown" if event.output_tokens is None else event.output_tokens,
            event.recall_depth, event.session[:SESSION_CHARS],
        )
        metrics.record_empty_completion(event.protocol)
        _dispatcher.submit(event)
    except Exception:
        log.debug("empty-completion telemetry failed", exc_info=True)


# --- what counts as empty, per protocol ---------------------------------------------


def _blank(text: Any) -> bool:
    return not isinstance(text, str) or not text.strip()


def responses_output_is_empty(output: Iterable[Any]) -> bool:
    """A Responses ``output``: no function call, no reasoning, no refusal, no
    other item kind, and every text part whitespace-only (an empty list counts)."""
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") != "message":
            return False
        for part in item.get("content") or []:
            if not isinstance(part, dict):
                continue
            if part.get("type") not in ("output_text", "text") or not _blank(part.get("text")):
                return False
    return True


def anthropic_content_is_empty(content: Iterable[Any]) -> bool:
    """An Anthropic ``content`` list: no tool_use, no (redacted) thinking, and
    every text block whitespace-only. tool_result blocks are ignored."""
    for block in content:
        if not isinstance(block, dict) or block.get("type") == "tool_result":
            continue
        if block.get("type") != "text" or not _blank(block.get("text")):
            return False
    return True


def chat_message_is_empty(message: Any) -> bool:
    """A Chat Completions assistant ``message``: no tool calls, no refusal, and
    whitespace-only content."""
    if not isinstance(message, dict):
        return True
    if message.get("tool_calls") or message.get("function_call") or message.get("refusal"):
        return False
    content = message.get("content")
    if isinstance(content, list):
        return all(
            not isinstance(p, dict) or _blank(p.get("text")) for p in content
        )
    return _blank(content)


def check_responses(response: dict[str, Any], *, protocol: str, session: str,
                    recall_depth: int) -> bool:
    """Report ``response`` (a Responses body as delivered) if it is empty.
    Returns whether it was. Never raises."""
    try:
        if not responses_output_is_empty(response.get("output") or []):
            return False
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        tokens = usage.get("output_tokens") if usage else None
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        report_empty_completion(EmptyCompletion(
            protocol=protocol,
            model=str(response.get("model") or "unknown"),
            session=session,
            stop_reason=str(reason or response.get("status") or "unknown"),
            output_tokens=tokens if isinstance(tokens, int) else None,
            recall_depth=recall_depth,
        ))
        return True
    except Exception:
        log.debug("empty-completion check failed", exc_info=True)
        return False
