"""Recall markers and anchors (lore-spec B.6)."""

from __future__ import annotations

from lore_gateway.memory.store.sanitize import strip_recall_traces
from lore_gateway.recall.core import markers
from lore_gateway.recall.core.tool import RecallArgs


def test_visible_markers_per_scope_and_detail() -> None:
    assert markers.visible_marker(RecallArgs(query="auth flow")) == (
        '📚 Searching all archives for "auth flow"…'
    )
    assert markers.visible_marker(RecallArgs(query="x", scope="knowledge")) == (
        '📚 Searching knowledge base for "x"…'
    )
    assert markers.visible_marker(RecallArgs(id="t:12")) == "📚 Fetching detail for t:12…"
    assert (
        markers.visible_marker(RecallArgs(query="a\nb")) == '📚 Searching all archives for "a b"…'
    )


def test_anchor_round_trip_and_whole_text_anchoring() -> None:
    anchor_id = markers.new_anchor_id()
    text = markers.anchor_text(anchor_id)
    assert text == f"<!-- lore-recall:{anchor_id} -->"
    assert markers.parse_anchor(text) == anchor_id
    assert markers.parse_anchor(text + " ") is None
    assert markers.parse_anchor("see " + text) is None
    assert markers.parse_anchor(text.upper()) is None

    anchored = markers.anchored_marker('📚 Searching all archives for "q"…', anchor_id)
    parsed = markers.parse_marker(anchored)
    assert parsed is not None and parsed.anchor_id == anchor_id
    assert parsed.visible == '📚 Searching all archives for "q"…'
    assert markers.parse_marker(text) == markers.ParsedMarker(anchor_id=anchor_id, visible=None)
    assert markers.parse_marker("I said: " + anchored) is None
    assert markers.parse_marker("hello") is None


def test_markers_never_survive_storage_sanitising() -> None:
    anchor_id = markers.new_anchor_id()
    text = (
        "Before.\n"
        + markers.anchored_marker(markers.visible_marker(RecallArgs(query="q")), anchor_id)
        + "\nAfter."
    )
    assert strip_recall_traces(text) == "Before.\n\nAfter."


def test_context_id_is_stable_and_framed() -> None:
    a = markers.context_id([{"role": "user", "text": "ab"}, {"role": "user", "text": "c"}])
    b = markers.context_id([{"text": "ab", "role": "user"}, {"role": "user", "text": "c"}])
    c = markers.context_id([{"role": "user", "text": "a"}, {"role": "user", "text": "bc"}])
    assert a == b and a != c and len(a) == 64
