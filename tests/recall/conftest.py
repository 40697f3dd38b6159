"""Fixtures for the recall handler tests: a fake provider of their own per test,
and an upstream client whose every base URL points at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.testing import FakeUpstream
from lore_gateway.upstream import UpstreamClient


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    server = FakeUpstream()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def upstream(fake: FakeUpstream, tmp_path: Path) -> AsyncIterator[UpstreamClient]:
    client = UpstreamClient(Settings(data_dir=tmp_path, upstream_openai=fake.url,
                                     upstream_chatgpt=fake.url + "/backend-api",
                                     upstream_anthropic=fake.url))
    await client.start()
    yield client
    await client.close()
