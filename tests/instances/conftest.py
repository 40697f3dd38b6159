"""Fixtures of the several-instances tests: a fresh Postgres database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A new, migrated memory database on the tests' Postgres (``postgres_server``)."""
    from lore_gateway.storage.target import close_shared

    server = request.getfixturevalue("postgres_server")
    url: str = server.fresh_url()
    yield url
    close_shared(url)
    server.drop(url)
