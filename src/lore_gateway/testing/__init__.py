"""Test rig: a scripted fake provider and a helper to run servers in a thread."""

from lore_gateway.testing.background import BackgroundServer
from lore_gateway.testing.fake_delivery import RecordedRequest
from lore_gateway.testing.fake_upstream import FakeUpstream
from lore_gateway.testing.gateway import ANTHROPIC_KEY, OPENAI_KEY, gateway_settings
from lore_gateway.testing.waiting import wait_until, wait_until_stored

__all__ = [
    "ANTHROPIC_KEY",
    "OPENAI_KEY",
    "BackgroundServer",
    "FakeUpstream",
    "RecordedRequest",
    "gateway_settings",
    "wait_until",
    "wait_until_stored",
]
