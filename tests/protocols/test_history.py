"""One history adapter per protocol family (protocols/history.py)."""

from __future__ import annotations

from lore_gateway.protocols.history import ADAPTERS, adapter_for
from lore_gateway.routing import FAMILIES, Family


def test_every_family_has_its_adapter() -> None:
    assert set(ADAPTERS) == set(Family) == set(FAMILIES.values())
    for family in Family:
        assert adapter_for(family).family is family


def test_the_history_key_is_each_protocols() -> None:
    assert {f: adapter_for(f).items_key for f in Family} == {
        Family.RESPONSES: "input", Family.ANTHROPIC: "messages", Family.CHAT: "messages",
        Family.GEMINI: "contents"}
