"""The data events of a Responses stream applied to their item (sans-IO): content
parts, text and refusal deltas, tool-call arguments and reasoning summaries.

:class:`~lore_gateway.protocols.responses_items.ResponsesItems` locates the item
an event concerns (the sparse Codex rules); this module changes the item. ``strict``
is the public API's lifecycle (lore-spec D.4); ``max_text`` bounds accumulated text.
"""

from __future__ import annotations

from typing import Any

from lore_gateway.protocols.common import ProtocolError, TextBuffer
from lore_gateway.protocols.responses_model import Item, as_index, as_str


def apply_data(name: str, payload: dict[str, Any], item: Item, *, strict: bool,
               max_text: int | None) -> None:
    """Apply one data event (``name`` is a content, text, arguments or summary
    event) to ``item``."""
    if name.startswith("response.content_part."):
        _apply_part(name, payload, item, strict)
    elif name.startswith(("response.output_text.", "response.refusal.",
                          "response.reasoning_text.")):
        _apply_text(name, payload, item, strict, max_text)
    elif name.startswith(
        ("response.function_call_arguments.", "response.custom_tool_call_input.")
    ):
        _apply_arguments(name, payload, item, strict, max_text)
    else:
        _apply_summary(name, payload, item, strict)


def _content_index(name: str, payload: dict[str, Any], item: Item, strict: bool) -> int:
    ci = as_index(payload.get("content_index"))
    if ci is None or ci < 0:
        if strict:
            raise ProtocolError(
                f"Responses {name} requires content_index for index {item.index}"
            )
        if item.active_part is not None:
            return item.active_part
        return len(item.parts) if name.endswith(".added") or not item.parts else max(item.parts)
    return ci


def _apply_part(name: str, payload: dict[str, Any], item: Item, strict: bool) -> None:
    ci = _content_index(name, payload, item, strict)
    part = payload.get("part")
    if not isinstance(part, dict):
        raise ProtocolError(f"malformed Responses {name}")
    item.settle()
    for key in [k for k in item.texts if k[0] == ci]:
        del item.texts[key]
    if name.endswith(".added"):
        if strict and item.active_part is not None:
            raise ProtocolError(
                f"Responses {name} while a content part is active for index {item.index}"
            )
        if strict and ci in item.parts:
            raise ProtocolError(f"duplicate Responses content part {ci} for index {item.index}")
        item.parts[ci] = dict(part)
        item.active_part = ci
    else:
        if strict and item.active_part != ci:
            raise ProtocolError(
                f"Responses {name} does not match the active content part "
                f"for index {item.index}"
            )
        item.parts[ci] = dict(part)
        item.closed_parts.add(ci)
        item.active_part = None


def _apply_text(name: str, payload: dict[str, Any], item: Item, strict: bool,
                max_text: int | None) -> None:
    ci = _content_index(name, payload, item, strict)
    key = "refusal" if name.startswith("response.refusal.") else "text"
    part_type = {"refusal": "refusal"}.get(key) or (
        "reasoning_text" if name.startswith("response.reasoning_text.") else "output_text"
    )
    misplaced = item.active_part != ci or ci in item.closed_parts
    if strict and item.type == "message" and misplaced:
        raise ProtocolError(
            f"Responses {name} does not match the active content part for index {item.index}"
        )
    part = item.parts.setdefault(ci, {"type": part_type, key: ""})
    if name.endswith(".delta"):
        delta = payload.get("delta")
        if not isinstance(delta, str):
            raise ProtocolError(f"malformed Responses {name}")
        buf = item.texts.get((ci, key))
        if buf is None:
            buf = item.texts[(ci, key)] = TextBuffer(as_str(part.get(key)), max_text)
        buf.append(delta)
        return
    text = payload.get(key)
    if not isinstance(text, str):
        raise ProtocolError(f"malformed Responses {name}")
    item.settle()
    if strict and text != as_str(part.get(key)):
        raise ProtocolError(
            f"Responses {name} text does not match streamed deltas for index {item.index}"
        )
    item.texts.pop((ci, key), None)
    part[key] = text


def _apply_arguments(name: str, payload: dict[str, Any], item: Item, strict: bool,
                     max_text: int | None) -> None:
    key = "input" if item.type == "custom_tool_call" else "arguments"
    if item.args_done:
        raise ProtocolError(f"Responses {name} after arguments done for index {item.index}")
    if name.endswith(".delta"):
        delta = payload.get("delta")
        if not isinstance(delta, str):
            raise ProtocolError(f"malformed Responses {name}")
        if item.args_buf is None:
            item.args_buf = TextBuffer(limit=max_text)
        item.args_buf.append(delta)
        item.args_streamed = True
        return
    final = payload.get(key)
    if not isinstance(final, str):
        raise ProtocolError(f"malformed Responses {name}")
    item.settle()
    item.args_buf = None
    if strict and item.args_streamed and final != item.args:
        raise ProtocolError(
            f"Responses {name} arguments do not match streamed deltas for index {item.index}"
        )
    item.args = final
    item.args_done = True
    if not item.name and as_str(payload.get("name")):
        item.name = as_str(payload.get("name"))


def _apply_summary(name: str, payload: dict[str, Any], item: Item, strict: bool) -> None:
    si = as_index(payload.get("summary_index"))
    if si is None or si < 0:
        if strict:
            raise ProtocolError(
                f"Responses {name} requires summary_index for index {item.index}"
            )
        si = max(item.summaries, default=0)
    if name.startswith("response.reasoning_summary_part."):
        part = payload.get("part")
        if not isinstance(part, dict):
            raise ProtocolError(f"malformed Responses {name}")
        item.summaries[si] = dict(part)
        return
    part = item.summaries.setdefault(si, {"type": "summary_text", "text": ""})
    if name.endswith(".delta"):
        part["text"] = as_str(part.get("text")) + as_str(payload.get("delta"))
    else:
        part["text"] = as_str(payload.get("text"))
