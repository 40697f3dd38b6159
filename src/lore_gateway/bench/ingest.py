"""Finding a benchmark's data set and loading its turns into a throw-away memory.

The data sets live in ``shared/data`` beside the repository and are never
copied into it (their licences). The retrieval benches (``locomo``, ``coding``)
store their data the way the gateway would and then wait for it to be written
and embedded; on this small machine the embedding is most of a bench's time, so
it reports progress too.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from lore_gateway.config import Settings
from lore_gateway.memory.store.records import TurnRecord

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

Progress = Callable[[str, int, int], None]

# Turns allowed in the writer's queue before the benchmark waits (its bound is 10,000).
BACKLOG = 5_000
# How often the embedding progress is read while the ingest is flushed.
FLUSH_POLL_S = 0.5
# Turns between two progress reports while storing.
REPORT_EVERY = 100


def find_data(path: Path | None, default: Path, what: str) -> Path:
    """``--data`` as given, else ``default`` relative to the cwd, then to the repo root."""
    if path is not None:
        if not path.is_file():
            raise FileNotFoundError(f"{what} not found at {path}; pass --data PATH")
        return path
    repo_root = Path(__file__).resolve().parents[3]
    for candidate in (Path.cwd() / default, repo_root / default):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{what} not found at {default} (relative to the current directory or "
        f"to {repo_root}); pass --data PATH")


def ingest(memory: Memory, settings: Settings, records: Iterable[TurnRecord], total: int,
           progress: Progress | None) -> float:
    """Store ``records`` (``total`` of them), wait until every one is written and
    embedded; the seconds it took."""
    started = time.perf_counter()
    for done, record in enumerate(records, 1):
        # The benchmark may wait for the writer; the proxy never does.
        while memory.queue_depth > BACKLOG:
            time.sleep(0.005)
        if not memory.submit_turn(record):
            raise RuntimeError("the memory writer refused a turn; see the log")
        if progress is not None and (done % REPORT_EVERY == 0 or done == total):
            progress("ingest", done, total)
    _flush(memory, settings, progress)
    return time.perf_counter() - started


def _flush(memory: Memory, settings: Settings, progress: Progress | None) -> None:
    """``memory.flush()``, reporting the embedding of the ingested messages."""
    if progress is None or not memory.embeddings:
        memory.flush()
        return
    from lore_gateway.storage import db

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        flushing = pool.submit(memory.flush)
        conn = db.connect(settings.database, readonly=True)
        try:
            finished = False
            while not finished:
                try:
                    flushing.result(timeout=FLUSH_POLL_S)
                    finished = True
                except concurrent.futures.TimeoutError:
                    pass
                row = conn.execute("SELECT (SELECT COUNT(*) FROM messages), "
                                   "(SELECT COUNT(*) FROM embeddings)").fetchone()
                if row is not None:
                    progress("embedding", int(row[1]), int(row[0]))
        finally:
            conn.close()
