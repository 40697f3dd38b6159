"""Test rig: a scripted fake provider and a helper to run servers in a thread."""

from lore_gateway.testing.background import BackgroundServer
from lore_gateway.testing.fake_upstream import FakeUpstream, RecordedRequest

__all__ = ["BackgroundServer", "FakeUpstream", "RecordedRequest"]
