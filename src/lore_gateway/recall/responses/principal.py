"""The principal's body of a recall-watched Responses stream, read by upstream
read (sans-IO): relayed as it came while an :class:`~.gate.UntouchedGate`
vouches for the reads, decoded and fed to the interceptor otherwise.

The interceptor always sees the start of the stream (``response.created``, and
whatever comes before it, cut out of the read that holds it); a gate opens once
it is :attr:`transparent <.live.LiveInterceptor.transparent>`, taking over any
unfinished frame the decoder holds.
From the first read the gate refuses, or the end of the body, the interceptor
catches up (``LiveInterceptor.catch_up``) and reads the rest itself. When the
gate lets the terminal through, the interceptor never tracked the items, and
storage reads them from the terminal's output (:meth:`PrincipalReader.untouched`).
"""

from __future__ import annotations

from lore_gateway.recall.responses.gate import UntouchedGate
from lore_gateway.recall.responses.live import Action, LiveInterceptor, Send
from lore_gateway.sse import DEFAULT_MAX_FRAMES, SSEDecoder

_CREATED = b"event: response.created\n"


def _after_created(data: bytes) -> int:
    """Where a ``response.created`` frame in ``data`` ends (0: it has none, or an
    unfinished one)."""
    if data.startswith(_CREATED):
        start = 0
    else:
        found = data.find(b"\n\n" + _CREATED)
        if found == -1:
            return 0
        start = found + 2
    end = data.find(b"\n\n", start)
    return 0 if end == -1 else end + 2


class PrincipalReader:
    """One principal body: upstream reads in, the interceptor's actions out."""

    def __init__(self, icpt: LiveInterceptor) -> None:
        self._icpt = icpt
        self._decoder = SSEDecoder()
        self._gate: UntouchedGate | None = None
        self._created = False  # a read was cut after response.created
        self._terminal: bytes | None = None  # the terminal frame, when a gate let it through
        self._after = b""  # the unfinished frame that gate carried past the terminal

    def feed(self, data: bytes) -> list[Action]:
        """One upstream read."""
        icpt = self._icpt
        if self._gate is not None:
            return self._through_gate(data)
        if not self._created and not icpt.transparent:
            # The interceptor takes the read up to response.created, a gate the rest
            # (on the Codex backend, rate limits come first, maybe in a read of their own).
            cut = _after_created(data)
            if 0 < cut < len(data):
                self._created = True
                head = icpt.feed_all(self._decoder.feed(data[:cut]))
                if self._open_gate():
                    return head + self._through_gate(data[cut:])
                return head + icpt.feed_all(self._decoder.feed(data[cut:]))
        actions = icpt.feed_all(self._decoder.feed(data))
        self._open_gate()
        return actions

    def end(self) -> list[Action]:
        """The body ended: what its last frames come to (then the interceptor's
        ``end_of_stream``)."""
        actions = self._take_over(b"") if self._gate is not None else []
        tail = self._decoder.close()
        if tail:
            actions += self._icpt.feed_all(tail)
        return actions

    def broken(self) -> list[Action]:
        """The body could not be read on: the interceptor takes over what a gate
        let through (and then reports the failure). An unfinished frame is
        dropped, as the decoder drops one."""
        gate, self._gate = self._gate, None
        return self._icpt.catch_up(gate.relayed) if gate is not None else []

    def after_terminal(self, data: bytes) -> bytes:
        """A read after the terminal went out, to relay as it is (the unfinished
        frame a gate carried comes first)."""
        if self._terminal is not None:
            tail, self._after = self._after, b""
            return tail + data
        return b"".join(e.raw for e in self._decoder.feed(data)) if data else b""

    def close_after_terminal(self) -> bytes:
        """The end of the body after the terminal: an unfinished frame, if any."""
        if self._terminal is not None:
            return self.after_terminal(b"")
        return b"".join(e.raw for e in self._decoder.close())

    def untouched(self) -> bytes | None:
        """The terminal frame, when a gate let it through: the interceptor never
        tracked the items, and storage reads them from its output."""
        return self._terminal

    def _open_gate(self) -> bool:
        if not self._icpt.transparent:
            return False
        tail = self._decoder.detach()
        if tail is None:
            return False
        self._gate = self._icpt.untouched_gate(frames=self._decoder.frames, tail=tail)
        return True

    def _through_gate(self, data: bytes) -> list[Action]:
        gate = self._gate
        assert gate is not None
        passed = gate.vouch(data)
        if passed is None:
            return self._take_over(data)
        actions: list[Action] = [Send(passed)] if passed else []
        if gate.finished:
            assert gate.relayed.terminal is not None
            self._terminal = gate.relayed.terminal[0].raw
            self._after, self._gate = gate.pending(b""), None
            actions += self._icpt.catch_up(gate.relayed)
        return actions

    def _take_over(self, data: bytes) -> list[Action]:
        """The interceptor catches up on what the gate let through, then decodes
        ``data`` (after the unfinished frame the gate carried) itself."""
        gate = self._gate
        assert gate is not None
        self._gate = None
        actions = self._icpt.catch_up(gate.relayed)
        pending = gate.pending(data)
        self._decoder = SSEDecoder(max_frames=DEFAULT_MAX_FRAMES - gate.frames)
        if actions or not pending:
            return actions
        return self._icpt.feed_all(self._decoder.feed(pending))
