"""Editing JSON with comments (JSONC) as text, so the user's comments and layout survive.

OpenCode reads ``opencode.json`` and ``opencode.jsonc`` with a JSONC parser: ``//``
and ``/* */`` comments and trailing commas are allowed in both. Re-serialising
such a file would drop every comment, so ``lore setup opencode`` edits it the
way ``agents/codex.py`` edits TOML: it parses the text once into spans
(``parse``), then changes one member at a time (``set_member``,
``delete_member``), touching nothing outside that member. Everything here is
pure: text in, text out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# One indentation step for members lore adds where the file shows none to copy
# (OpenCode's documentation and its own writes use two spaces).
INDENT = "  "
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = {"true": True, "false": False, "null": None}


class JsoncError(ValueError):
    """The text is not JSON with comments (the message says where)."""


@dataclass(slots=True)
class Node:
    """A value and where it sits in the text: ``text[start:end]`` is its source."""

    start: int
    end: int
    value: Any = None  # scalars only; objects and arrays: see ``data``
    members: list[Member] | None = None  # an object's, in order
    items: list[Node] | None = None  # an array's

    def data(self) -> Any:
        """The plain Python value (dicts, lists, scalars)."""
        if self.members is not None:
            return {m.key: m.value.data() for m in self.members}
        if self.items is not None:
            return [item.data() for item in self.items]
        return self.value

    def member(self, key: str) -> Member | None:
        """The last member named ``key`` (the one a JSON reader keeps)."""
        found = None
        for m in self.members or ():
            if m.key == key:
                found = m
        return found


@dataclass(slots=True)
class Member:
    key: str
    key_start: int
    value: Node
    comma: int | None = field(default=None)  # the position of the comma after it


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> JsoncError:
        line = self.text.count("\n", 0, self.pos) + 1
        column = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        return JsoncError(f"{what} at line {line} column {column}")

    def skip(self) -> None:
        """Past whitespace and comments."""
        text, n = self.text, len(self.text)
        while self.pos < n:
            ch = text[self.pos]
            if ch in " \t\r\n\ufeff":
                self.pos += 1
            elif text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    raise self.fail("unterminated comment")
                self.pos = end + 2
            else:
                return

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos:self.pos + 1]

    def value(self) -> Node:
        ch = self.peek()
        start = self.pos
        if ch == "{":
            return self.obj()
        if ch == "[":
            return self.array()
        if ch == '"':
            return Node(start, self.string_end(), self.string_at(start))
        for word, literal in _LITERALS.items():
            if self.text.startswith(word, start):
                self.pos = start + len(word)
                return Node(start, self.pos, literal)
        match = _NUMBER.match(self.text, start)
        if match is None:
            raise self.fail("expected a value" if ch else "unexpected end of text")
        self.pos = match.end()
        return Node(start, self.pos, json.loads(match.group()))

    def string_end(self) -> int:
        """Past the string that starts at ``pos``; return its end."""
        text, i = self.text, self.pos + 1
        while i < len(text):
            if text[i] == "\\":
                i += 2
            elif text[i] == '"':
                self.pos = i + 1
                return self.pos
            elif text[i] == "\n":
                break
            else:
                i += 1
        raise self.fail("unterminated string")

    def string_at(self, start: int) -> str:
        try:
            decoded: str = json.loads(self.text[start:self.pos])
        except ValueError:
            raise self.fail("invalid string") from None
        return decoded

    def obj(self) -> Node:
        start = self.pos
        self.pos += 1
        members: list[Member] = []
        while True:
            ch = self.peek()
            if ch == "}":
                self.pos += 1
                return Node(start, self.pos, members=members)
            if ch != '"':
                raise self.fail("expected a member name or '}'")
            key_start = self.pos
            self.string_end()
            key = self.string_at(key_start)
            if self.peek() != ":":
                raise self.fail("expected ':'")
            self.pos += 1
            member = Member(key, key_start, self.value())
            members.append(member)
            ch = self.peek()
            if ch == ",":
                member.comma = self.pos
                self.pos += 1
            elif ch != "}":
                raise self.fail("expected ',' or '}'")

    def array(self) -> Node:
        start = self.pos
        self.pos += 1
        items: list[Node] = []
        while True:
            ch = self.peek()
            if ch == "]":
                self.pos += 1
                return Node(start, self.pos, items=items)
            items.append(self.value())
            ch = self.peek()
            if ch == ",":
                self.pos += 1
            elif ch != "]":
                raise self.fail("expected ',' or ']'")


def parse(text: str) -> Node:
    """The text's one top-level value, with spans; raises ``JsoncError``."""
    parser = _Parser(text)
    node = parser.value()
    if parser.peek():
        raise parser.fail("unexpected text after the value")
    return node


def loads(text: str) -> Any:
    """The plain value of JSONC text (``json.loads`` with comments and trailing commas)."""
    return parse(text).data()


def find(root: Node, path: Sequence[str]) -> Node | None:
    """The node at ``path`` (object keys), or None where a key is missing."""
    node: Node | None = root
    for key in path:
        member = None if node is None or node.members is None else node.member(key)
        if member is None:
            return None
        node = member.value
    return node


def _line_indent(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    match = re.match(r"[ \t]*", text[line_start:pos])
    return match.group() if match else ""


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _dumps(value: Any, indent: str, newline: str = "\n") -> str:
    """``value`` as JSON whose continuation lines sit at ``indent``."""
    dumped = json.dumps(value, indent=len(INDENT), ensure_ascii=False)
    return dumped.replace("\n", newline + indent)


def set_member(text: str, path: Sequence[str], value: Any) -> tuple[str, list[str], str | None]:
    """Set ``path`` (object keys from the top) to ``value`` in JSONC ``text``.

    Returns the new text, the path of the member that was added or replaced
    (the shallowest key that did not exist, or ``path`` itself), and the source
    text of the value it replaced (None: nothing was replaced). Missing objects
    on the way are created; a member that is not an object on the way raises
    ``JsoncError``. A new member goes first in its object, on a line of its own
    when the object's members have lines of their own.
    """
    node = parse(text)
    for depth, key in enumerate(path):
        if node.members is None:
            raise JsoncError(f'"{".".join(path[:depth])}" is not an object')
        member = node.member(key)
        if member is None:
            rest: Any = value
            for inner in reversed(path[depth + 1:]):
                rest = {inner: rest}
            return _insert(text, node, key, rest), list(path[:depth + 1]), None
        node = member.value
    old = text[node.start:node.end]
    new = _dumps(value, _line_indent(text, node.start), _newline(text))
    return text[:node.start] + new + text[node.end:], list(path), old


def _insert(text: str, obj: Node, key: str, value: Any) -> str:
    assert obj.members is not None
    nl = _newline(text)
    after_brace = obj.start + 1
    outer = _line_indent(text, obj.start)
    if obj.members and "\n" not in text[after_brace:obj.members[0].key_start]:
        # A one-line object: the new member stays on its line.
        entry = f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}, "
        return text[:after_brace] + entry + text[after_brace:]
    if obj.members:
        indent = _line_indent(text, obj.members[0].key_start)
        entry = f"{nl}{indent}{json.dumps(key)}: {_dumps(value, indent, nl)},"
    else:
        indent = outer + INDENT
        entry = f"{nl}{indent}{json.dumps(key)}: {_dumps(value, indent, nl)}"
        if not text[after_brace:obj.end - 1].strip():  # empty: lay it out afresh
            return text[:after_brace] + entry + nl + outer + text[obj.end - 1:]
    # After the rest of the brace's line when that holds only a comment, so the
    # comment stays where the user put it.
    at = after_brace
    line_end = text.find("\n", after_brace, obj.end)
    if line_end >= 0:
        rest = text[after_brace:line_end].strip()
        if not rest or rest.startswith("//"):
            at = line_end - 1 if text[line_end - 1] == "\r" else line_end
    return text[:at] + entry + text[at:]


def delete_member(text: str, path: Sequence[str]) -> str:
    """Take the member at ``path`` out of JSONC ``text``, with its comma and its line
    when it had one to itself; raises ``JsoncError`` when it is not there."""
    root = parse(text)
    parent = find(root, path[:-1])
    member = None if parent is None or parent.members is None else parent.member(path[-1])
    if parent is None or parent.members is None or member is None:
        raise JsoncError(f'"{".".join(path)}" is not there')
    start, end = member.key_start, member.value.end
    if member.comma is not None:
        end = member.comma + 1
    else:
        index = parent.members.index(member)
        if index > 0 and parent.members[index - 1].comma is not None:
            previous_comma = parent.members[index - 1].comma
            assert previous_comma is not None
            start = previous_comma
    # A member on a line of its own takes the line with it; one among others on
    # a line takes the spaces after its comma.
    spaces = re.match(r"[ \t]*", text[end:])
    tail = end + (spaces.end() if spaces else 0)
    line_start = text.rfind("\n", 0, start)
    if line_start >= 0 and not text[line_start + 1:start].strip() and (
            text.startswith("\n", tail) or text.startswith("\r\n", tail)):
        start = line_start - 1 if text[line_start - 1:line_start] == "\r" else line_start
        end = tail
    elif member.comma is not None:
        end = tail
    return text[:start] + text[end:]


def replace_value(text: str, path: Sequence[str], source: str) -> str:
    """Put ``source`` (JSONC text of a value) back as the value at ``path``."""
    node = find(parse(text), path)
    if node is None:
        raise JsoncError(f'"{".".join(path)}" is not there')
    return text[:node.start] + source + text[node.end:]
