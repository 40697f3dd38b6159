"""The memory suite's shared fixture: a memory store in the test's own folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    """A memory without the embedding model (BM25 search), closed after the test, on
    the test's backend (``database_url``); a module that needs another kind defines
    its own."""
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False, database_url=database_url),
                      embedder=None)
    yield mem
    mem.close()
