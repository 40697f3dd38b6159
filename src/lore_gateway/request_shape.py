"""The shape check every model request passes before any handler sees it.

The handlers (storage, identity, recall) read request fields with the types the
protocol defines. A client that sends ``"messages": 5`` or JSON nested 300 deep
must get a 400 in its protocol's own error shape, not a 500 or a cut stream from
somewhere inside a handler. So the shape is checked once, here, at the boundary:
only what the handlers rely on, never anything a provider might accept (the
provider stays the judge of everything else).

Depth: orjson parses up to 1024 levels but re-encodes at most 254, and a request
is re-encoded whenever the gateway changes it (the recall tool is added to any
request that offers a tool). ``MAX_JSON_DEPTH`` makes the two agree: a body the
gateway cannot re-encode is refused up front, on every route, whether or not
this particular request would have been rewritten.
"""

from __future__ import annotations

from typing import Any

import orjson

from lore_gateway.errors import GatewayError
from lore_gateway.routing import Protocol

# orjson.dumps raises beyond 254 levels of nesting; requests from real agents
# nest about 8 deep. Checked by re-encoding, which fails exactly where the
# rewrite would.
MAX_JSON_DEPTH = 254


class BadRequestShape(GatewayError):
    """A request field has a type the protocol does not allow (400)."""

    def __init__(self, protocol: Protocol, param: str, message: str) -> None:
        super().__init__(400, "invalid_request_error", message)
        self.protocol = protocol
        self.param = param

    def body(self) -> bytes:
        if self.protocol is Protocol.ANTHROPIC:
            return orjson.dumps({"type": "error", "error": {
                "type": self.error_type, "message": self.message}})
        if self.protocol is Protocol.GEMINI:
            return orjson.dumps({"error": {"code": 400, "message": self.message,
                                           "status": "INVALID_ARGUMENT"}})
        return orjson.dumps({"error": {"message": self.message, "type": self.error_type,
                                       "param": self.param, "code": "invalid_type"}})


def check_request(protocol: Protocol, payload: dict[str, Any], body: bytes = b"") -> None:
    """Raise ``BadRequestShape`` when ``payload`` (parsed from ``body``) cannot be
    handled as ``protocol``."""
    # A body with fewer brackets than the limit cannot nest deeper than it; the
    # count is C-speed, the re-encoding is not.
    if not body or body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH:
        _check_depth(protocol, payload)
    _optional(protocol, payload, "model", str, "a string")
    _optional(protocol, payload, "stream", bool, "a boolean")
    for pos, tool in enumerate(_list_of_objects(protocol, payload, "tools", required=False)):
        _strings(protocol, f"tools[{pos}]", tool, ("type", "name"))
        function = tool.get("function")
        if function is not None:
            if not isinstance(function, dict):
                raise BadRequestShape(protocol, f"tools[{pos}].function",
                                      f"Invalid type for 'tools[{pos}].function': expected an "
                                      f"object, got {_type_name(function)}.")
            _strings(protocol, f"tools[{pos}].function", function, ("name",))
    if protocol is Protocol.CHAT:
        _messages(protocol, payload, content_blocks=True)
    elif protocol is Protocol.ANTHROPIC:
        _messages(protocol, payload, content_blocks=True)
        system = payload.get("system")
        if system is not None and not isinstance(system, str):
            _blocks(protocol, "system", system)
        _optional(protocol, payload, "metadata", dict, "an object")
    elif protocol is Protocol.GEMINI:
        _gemini(protocol, payload)
    else:
        _optional(protocol, payload, "instructions", str, "a string")
        inp = payload.get("input")
        if inp is not None and not isinstance(inp, str):
            items = _list_of_objects(protocol, payload, "input", required=False)
            for pos, item in enumerate(items):
                _strings(protocol, f"input[{pos}]", item, ("type", "role", "call_id", "name"))
                content = item.get("content")
                if content is not None and not isinstance(content, str):
                    _blocks(protocol, f"input[{pos}].content", content)


def _gemini(protocol: Protocol, payload: dict[str, Any]) -> None:
    """``contents`` and ``systemInstruction`` (either spelling): contents are
    objects whose ``role`` is a string and whose ``parts`` are objects."""
    for name in ("systemInstruction", "system_instruction"):
        system = payload.get(name)
        if system is not None and not isinstance(system, str):
            _gemini_content(protocol, name, system)
    for pos, content in enumerate(_list_of_objects(protocol, payload, "contents",
                                                   required=False)):
        _strings(protocol, f"contents[{pos}]", content, ("role",))
        _gemini_content(protocol, f"contents[{pos}]", content)


def _gemini_content(protocol: Protocol, name: str, content: Any) -> None:
    if not isinstance(content, dict):
        raise BadRequestShape(protocol, name, f"Invalid type for '{name}': expected an "
                                              f"object, got {_type_name(content)}.")
    parts = content.get("parts")
    if parts is None or isinstance(parts, dict):
        return
    if not isinstance(parts, list):
        raise BadRequestShape(protocol, f"{name}.parts",
                              f"Invalid type for '{name}.parts': expected an array of "
                              f"objects, got {_type_name(parts)}.")
    for pos, part in enumerate(parts):
        if not isinstance(part, dict):
            raise BadRequestShape(protocol, f"{name}.parts[{pos}]",
                                  f"Invalid type for '{name}.parts[{pos}]': expected an "
                                  f"object, got {_type_name(part)}.")


def _check_depth(protocol: Protocol, payload: dict[str, Any]) -> None:
    try:
        orjson.dumps(payload)
    except orjson.JSONEncodeError as exc:
        raise BadRequestShape(
            protocol, "",
            f"Request JSON cannot be handled: {exc}. JSON nested deeper than "
            f"{MAX_JSON_DEPTH} levels is not supported by the gateway.") from None


def _optional(protocol: Protocol, payload: dict[str, Any], name: str, kind: type,
              what: str) -> None:
    value = payload.get(name)
    if value is not None and not isinstance(value, kind):
        raise BadRequestShape(protocol, name,
                              f"Invalid type for '{name}': expected {what}, "
                              f"got {_type_name(value)}.")


def _list_of_objects(protocol: Protocol, payload: dict[str, Any], name: str, *,
                     required: bool) -> list[dict[str, Any]]:
    value = payload.get(name)
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise BadRequestShape(protocol, name,
                              f"Invalid type for '{name}': expected an array of objects, "
                              f"got {_type_name(value)}.")
    for pos, item in enumerate(value):
        if not isinstance(item, dict):
            raise BadRequestShape(protocol, f"{name}[{pos}]",
                                  f"Invalid type for '{name}[{pos}]': expected an object, "
                                  f"got {_type_name(item)}.")
    return value


def _messages(protocol: Protocol, payload: dict[str, Any], *, content_blocks: bool) -> None:
    messages = _list_of_objects(protocol, payload, "messages", required=True)
    for pos, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str):
            raise BadRequestShape(protocol, f"messages[{pos}].role",
                                  f"Invalid type for 'messages[{pos}].role': expected a "
                                  f"string, got {_type_name(role)}.")
        content = message.get("content")
        if content_blocks and content is not None and not isinstance(content, str):
            _blocks(protocol, f"messages[{pos}].content", content)


def _blocks(protocol: Protocol, name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise BadRequestShape(protocol, name,
                              f"Invalid type for '{name}': expected a string or an array "
                              f"of objects, got {_type_name(value)}.")
    for pos, block in enumerate(value):
        if not isinstance(block, dict):
            raise BadRequestShape(protocol, f"{name}[{pos}]",
                                  f"Invalid type for '{name}[{pos}]': expected an object, "
                                  f"got {_type_name(block)}.")
        _strings(protocol, f"{name}[{pos}]", block, ("type",))


def _strings(protocol: Protocol, where: str, obj: dict[str, Any],
             names: tuple[str, ...]) -> None:
    """The discriminating fields handlers compare and hash must be strings."""
    for name in names:
        value = obj.get(name)
        if value is not None and not isinstance(value, str):
            raise BadRequestShape(protocol, f"{where}.{name}",
                                  f"Invalid type for '{where}.{name}': expected a string, "
                                  f"got {_type_name(value)}.")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
