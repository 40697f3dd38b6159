"""The request pipeline's shell and the one turn outcome, without a gateway: a
feature that is not given is not run, the upstream's rules always apply, and
every delivery path's outcome ends a turn the same way (issue 34)."""

from __future__ import annotations

from typing import Any

import pytest

from lore_gateway.memory.store.records import Identity, RawOutputs
from lore_gateway.pipeline.request import RequestPipeline
from lore_gateway.protocols.common import Message
from lore_gateway.protocols.usage import Usage
from lore_gateway.routing import Protocol, Route, match
from lore_gateway.turns import TurnOutcome, TurnSink

IDENTITY = Identity(tenant="t", project="p", session="s")
TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]


def route(path: str) -> Route:
    found = match("POST", path, "", anthropic_version=False, upgrade=False)
    assert found is not None and found.protocol is not None
    return found


async def test_without_features_only_the_upstream_rules_apply() -> None:
    pipeline = RequestPipeline()  # no memory: no anchors, knowledge nor context
    payload: dict[str, Any] = {"model": "m", "input": "hi", "tools": TOOLS, "stream": True}
    plain = await pipeline.prepare(route("/v1/responses"), {}, payload, IDENTITY, b"{}",
                                   coding=True)
    assert (plain.upstream_payload, plain.upstream_stream, plain.inject) == (None, True, False)
    # The Codex backend streams, stores nothing and takes no max_output_tokens,
    # with or without an identity.
    codex = route("/backend-api/codex/responses")
    asked = {"model": "m", "input": "hi", "max_output_tokens": 9}
    for identity in (IDENTITY, None):
        prepared = await pipeline.prepare(codex, {}, asked, identity, b"{}", coding=True)
        assert prepared.upstream_payload == {"model": "m", "input": "hi", "stream": True,
                                             "store": False}
        assert prepared.upstream_stream and not prepared.inject


def test_recall_off_is_an_empty_slot() -> None:
    assert dict(RequestPipeline().slots)["inject_tool"] is None


class _Pending:
    """A PendingTurn's two ends, recorded."""

    protocol = Protocol.RESPONSES.value

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    def complete(self, outputs: Any, raw: Any = None) -> bool:
        self.calls.append(("complete", list(outputs), raw))
        return True

    def abandon(self, outputs: Any = ()) -> bool:
        self.calls.append(("abandon", list(outputs), None))
        return True


USAGE = Usage(input_tokens=60, output_tokens=5, cache_read=40)


@pytest.mark.parametrize(("outcome", "call"), [
    (TurnOutcome(True, [Message("assistant", "hi")], usage=USAGE),
     ("complete", [Message("assistant", "hi")], None)),
    (TurnOutcome(True, raw=RawOutputs("responses", b"data: x\n\n", ())),
     ("complete", [], RawOutputs("responses", b"data: x\n\n", ()))),
    (TurnOutcome(False, [Message("assistant", "half")]),
     ("abandon", [Message("assistant", "half")], None)),
])
def test_one_end_for_every_outcome(outcome: TurnOutcome, call: tuple[str, Any, Any]) -> None:
    pending = _Pending()
    TurnSink.end(pending, outcome, Protocol.RESPONSES)
    TurnSink.end(None, outcome, Protocol.RESPONSES)  # no memory: nothing to end
    assert pending.calls == [call]


def test_calibration_is_the_usage_of_one_request() -> None:
    assert TurnOutcome(True, usage=USAGE).calibration is USAGE
    assert TurnOutcome(True, usage=USAGE, follow_ups=True).calibration is None
    assert TurnOutcome.cut() == TurnOutcome(False)
