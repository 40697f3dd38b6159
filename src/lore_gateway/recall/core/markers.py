"""The traces a hidden recall leaves in the client's transcript (lore-spec B.6).

A recall the client never saw must still leave *something* at its position, so
that on the next request the gateway can put the exact ``function_call`` +
``function_call_output`` pair back where the model saw it: honest history, and a
prompt cache that keeps hitting. That something is:

* a visible status line (``📚 Searching all archives for "x"…``) for clients that
  render text, and
* an invisible anchor ``<!-- lore-recall:<uuid4> -->`` naming the stored recall.

Responses clients get only the anchor. The regular expressions are shared with
``memory.sanitize``, which strips the same traces before anything is stored.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.memory.store.sanitize import (
    ANCHOR_RE,
    DETAIL_MARKER_RE,
    SCOPE_LABELS,
    SEARCH_MARKER_RE,
)
from lore_gateway.recall.core.tool import RecallArgs


def search_marker(query: str, scope: str = "all") -> str:
    return f'📚 Searching {SCOPE_LABELS.get(scope, SCOPE_LABELS["all"])} for "{query}"…'


def detail_marker(ref: str) -> str:
    return f"📚 Fetching detail for {ref}…"


def visible_marker(args: RecallArgs) -> str:
    """The status line for a recall. A batch names its references in order."""
    if args.ids is not None:
        return detail_marker(", ".join(args.ids))
    if args.id is not None:
        return detail_marker(args.id)
    # Newlines would break the one-line marker and its parser.
    query = " ".join((args.query or "").split())
    return search_marker(query, args.scope)


def new_anchor_id() -> str:
    return str(uuid.uuid4())


def anchor_text(anchor_id: str) -> str:
    return f"<!-- lore-recall:{anchor_id} -->"


def anchored_marker(visible: str, anchor_id: str) -> str:
    """Visible line, newline, anchor: what text-rendering clients receive."""
    return f"{visible}\n{anchor_text(anchor_id)}"


@dataclass(frozen=True, slots=True)
class ParsedMarker:
    """A text block recognised as a recall trace."""

    anchor_id: str | None
    visible: str | None


def parse_marker(text: str) -> ParsedMarker | None:
    """Recognise a block that is *exactly* a recall trace: an anchor alone, a
    visible marker alone, or a marker, newline, anchor. Anything more (a model that
    quoted a marker inside its prose, a marker with trailing words) is not one,
    so user text is never rewritten by accident."""
    visible: str | None
    anchor_id: str | None = None
    head, sep, tail = text.rpartition("\n")
    candidate_anchor = tail if sep else text
    match = ANCHOR_RE.fullmatch(candidate_anchor)
    if match is not None:
        anchor_id = match.group("uuid")
        if anchor_text(anchor_id) != candidate_anchor:
            return None
        visible = head if sep else None
    else:
        visible = text
    if visible is not None and not (
        SEARCH_MARKER_RE.fullmatch(visible) or DETAIL_MARKER_RE.fullmatch(visible)
    ):
        return None
    return ParsedMarker(anchor_id=anchor_id, visible=visible)


def parse_anchor(text: str) -> str | None:
    """The anchor id when ``text`` is exactly one anchor, else None."""
    match = ANCHOR_RE.fullmatch(text)
    if match is None or anchor_text(match.group("uuid")) != text:
        return None
    return match.group("uuid")


def context_id(items: Iterable[Any]) -> str:
    """SHA-256 (64 hex) over a length-framed JSON serialisation of ``items``.

    The caller passes the normalised transcript prefix before the recall (see each
    protocol's expand module). Length framing keeps ``["ab","c"]`` and
    ``["a","bc"]`` apart; sorted keys make the hash independent of the key order
    a client happens to re-serialise with.
    """
    digest = hashlib.sha256()
    for item in items:
        blob = orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
        digest.update(len(blob).to_bytes(8, "big"))
        digest.update(blob)
    return digest.hexdigest()
