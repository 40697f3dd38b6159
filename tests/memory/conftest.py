"""The memory suite's shared fixture: a memory store in the test's own folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    """A memory without the embedding model (BM25 search), closed after the test;
    a module that needs another kind defines its own."""
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    yield mem
    mem.close()
