"""One client request as the gateway understood it, shared by every handler, and
the parse that makes one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import orjson

from lore_gateway.errors import invalid_request
from lore_gateway.knowledge.sidechannel import SideChannel
from lore_gateway.memory.store.records import Identity
from lore_gateway.request_shape import check_request
from lore_gateway.routing import Protocol, Route

RawHeaders = list[tuple[bytes, bytes]]

# Bodies above this size are parsed in a worker thread so one huge agent request
# (a long session is several MB of JSON) does not stall every other stream.
PARSE_OFF_LOOP_BYTES = 256 * 1024


async def parse_payload(body: bytes, protocol: Protocol) -> dict[str, Any]:
    """:func:`parse_request`, off the loop when the body is big."""
    if len(body) > PARSE_OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_request, body, protocol)
    return parse_request(body, protocol)


def parse_request(body: bytes, protocol: Protocol) -> dict[str, Any]:
    """Parse and shape-check a model request (``request_shape``): a 400 in the
    protocol's error shape for anything that is not one."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"Invalid JSON body: {exc}") from None
    if not isinstance(payload, dict):
        raise invalid_request("Invalid JSON body: expected a JSON object")
    check_request(protocol, payload, body)
    return payload


@dataclass(slots=True)
class Exchange:
    """A parsed model request and what the gateway decided to do with it.

    ``body`` is the decoded client body; ``upstream_body`` the bytes sent upstream,
    the same object when the gateway changed nothing (forwarded untouched).
    """

    route: Route
    headers: RawHeaders
    header_map: dict[str, str]
    body: bytes
    payload: dict[str, Any]
    upstream_url: str
    upstream_headers: list[tuple[str, str]]
    upstream_body: bytes
    # What the client asked for, and what the upstream is asked for.
    client_stream: bool
    upstream_stream: bool
    identity: Identity | None = None  # None when memory is off
    # A coding agent's turn, not a side channel such as a title or a classifier
    # (``knowledge.sidechannel.is_coding_turn``): decided once, as it reads every
    # system item (a quarter of a millisecond on a long session), for the turn's
    # storage, knowledge, context and the background worker. False without memory.
    coding: bool = False
    # Why it is a side channel (``side_channel_reason``), stored with the turn so a
    # search can tell a helper's call from a tool-less app's first exchange; None
    # for a coding turn and without memory.
    side_channel: SideChannel | None = None
    # The upstream request as a dict when the gateway changed it (else None), and
    # whether the change includes the hidden recall tool.
    upstream_payload: dict[str, Any] | None = None
    recall: bool = False
    # Whether memory keeps anything of this turn: False under ``x-lore-no-store``
    # or amnesia (``TurnSink.keeps``). Memory is still read (recall, knowledge,
    # context); nothing is written: no turn, no recall anchors, no context or
    # knowledge state, no background work. False without memory.
    keep: bool = False
    started: float = field(default_factory=perf_counter)
    # The model the request asks for (``requested_model``), read once: storage,
    # context and the worker each want it, and the payload never changes.
    model: str | None = field(init=False)

    def __post_init__(self) -> None:
        self.model = requested_model(self.route, self.payload)

    @property
    def protocol(self) -> Protocol:
        assert self.route.protocol is not None
        return self.route.protocol


def requested_model(route: Route, payload: dict[str, Any]) -> str | None:
    """The model a request asks for: the body's ``model``, else the one its path
    names (Gemini sends none in the body: ``models/{model}:generateContent``)."""
    model = payload.get("model")
    if isinstance(model, str):
        return model
    return route.model or None
