"""Gemini clients: the official ``google-genai`` SDK, straight to the fake and
through the gateway, with an API key or an OAuth bearer."""

from __future__ import annotations

from typing import Any

import pytest

from lore_gateway.testing import FakeUpstream

from .kit import genai_client


@pytest.fixture
def gemini_client(gateway: Any) -> Any:
    return genai_client(gateway.url)


@pytest.fixture
def gemini_direct(fake_upstream: FakeUpstream) -> Any:
    return genai_client(fake_upstream.url)
