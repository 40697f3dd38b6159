"""The request pipeline's pure half: named transforms in a fixed order (issue 9 §5)."""

from __future__ import annotations

import copy
import logging
from types import MappingProxyType
from typing import Any

import pytest

from lore_gateway.context.transform import manage_context
from lore_gateway.memory.store.records import Identity
from lore_gateway.pipeline import transforms as pipeline
from lore_gateway.pipeline.transforms import RequestContext
from lore_gateway.routing import Family, Protocol

IDENTITY = Identity(tenant="t", project="p", session="session-pipeline")
TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]


def ctx(protocol: Protocol = Protocol.RESPONSES, **headers: str) -> RequestContext:
    return pipeline.request_context(protocol, headers, IDENTITY)


def test_slots_are_named_and_ordered() -> None:
    assert [name for name, _ in pipeline.REQUEST_PIPELINE] == [
        "expand_compaction", "context", "knowledge", "inject_tool"]
    slots = dict(pipeline.REQUEST_PIPELINE)
    assert slots["context"] is manage_context  # issue 13
    assert slots["knowledge"] is pipeline.add_knowledge


def test_recall_off_empties_its_slot_alone() -> None:
    """LORE_RECALL=false: no recall tool; every other slot as with recall on."""
    off = dict(pipeline.slots(recall=False))
    assert off["inject_tool"] is None
    assert {k: v for k, v in off.items() if k != "inject_tool"} == {
        k: v for k, v in pipeline.REQUEST_PIPELINE if k != "inject_tool"}
    payload: dict[str, Any] = {"model": "m", "input": "hi", "tools": TOOLS}
    assert pipeline.run(payload, ctx(), pipeline.slots(recall=False)) is payload
    assert pipeline.slots(recall=True) is pipeline.REQUEST_PIPELINE


def test_context_is_read_only() -> None:
    context = ctx(originator="codex_exec", authorization="Bearer x")
    assert context.codex_client and context.family is Family.RESPONSES
    assert isinstance(context.headers, MappingProxyType)
    with pytest.raises(TypeError):
        context.headers["x"] = "y"  # type: ignore[index]
    with pytest.raises(AttributeError):
        context.codex_client = False  # type: ignore[misc]
    assert (context.tenant, context.project, context.session) == (
        "t", "p", "session-pipeline")


def test_transforms_never_mutate_the_client_payload() -> None:
    payload: dict[str, Any] = {"model": "m", "input": "hi", "tools": TOOLS}
    before = copy.deepcopy(payload)
    out = pipeline.run(payload, ctx())
    assert payload == before
    assert [t["name"] for t in out["tools"]] == ["read_file", "recall"]
    assert pipeline.carries_recall(Family.RESPONSES, payload, out)


def test_unchanged_payload_is_the_same_object() -> None:
    """The proxy forwards the client's own bytes when nothing changed."""
    payload: dict[str, Any] = {"model": "m", "input": "hi"}
    assert pipeline.run(payload, ctx()) is payload


def test_a_transform_plugs_into_its_slot_and_sees_the_expanded_payload() -> None:
    """Plugging is replacing a slot's None; the knowledge step runs after the
    anchors were expanded and before the tool is injected."""
    seen: list[list[str]] = []

    def knowledge(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        seen.append([t["name"] for t in payload["tools"]])
        return {**payload, "instructions": "known facts"}

    plugged = tuple((name, knowledge if name == "knowledge" else step)
                    for name, step in pipeline.REQUEST_PIPELINE)
    out = pipeline.run({"model": "m", "input": "hi", "tools": TOOLS}, ctx(), plugged)
    assert seen == [["read_file"]]  # the recall tool comes after
    assert out["instructions"] == "known facts"
    assert [t["name"] for t in out["tools"]] == ["read_file", "recall"]


@pytest.mark.parametrize(("payload", "protocol", "reason"), [
    ({"model": "m", "input": "hi"}, Protocol.RESPONSES, "no client tool"),
    ({"model": "m", "messages": [], "tools": [
        {"type": "function", "function": {"name": "recall"}},
        {"type": "function", "function": {"name": "x"}}]}, Protocol.CHAT,
     "the client has its own recall tool"),
    ({"model": "m", "input": "hi", "tools": TOOLS, "parallel_tool_calls": True},
     Protocol.RESPONSES, "the client asked for parallel tool calls"),
])
def test_not_injecting_is_logged_with_the_reason_at_debug(
        payload: dict[str, Any], protocol: Protocol, reason: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="lore.recall")
    assert pipeline.run(payload, ctx(protocol)) is payload
    (record,) = [r for r in caplog.records if "recall not injected" in r.getMessage()]
    assert record.levelno == logging.DEBUG
    assert record.getMessage().endswith(reason)
