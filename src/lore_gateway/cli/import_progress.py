"""The progress display of ``lore import``: files read, then messages embedded.

Reading and writing a history is quick; embedding its messages is most of the
wait, so that is the bar with a count and an estimate. The import runs on a
worker thread while this thread redraws; on a pipe or file nothing is drawn.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from lore_gateway.memory.importers import ImportStats, Parser, import_files
from lore_gateway.memory.service import Memory

REDRAW_SECONDS = 0.1


def run_with_progress(memory: Memory, source: str, files: list[Path], parse: Parser,
                      recognise: Callable[[Path], bool], *, tenant: str,
                      console: Console | None = None) -> ImportStats:
    """Import ``files`` into ``tenant``, drawing progress on a terminal; the stats."""
    console = console or Console(stderr=True)
    progress = Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                        transient=True, disable=not console.is_terminal)
    result: list[ImportStats] = []
    failure: list[BaseException] = []
    files_done = [0]

    def work() -> None:
        try:
            result.append(import_files(
                memory, files, parse, tenant=tenant, recognise=recognise,
                on_file=lambda _: files_done.__setitem__(0, files_done[0] + 1)))
        except BaseException as exc:  # re-raised on the calling thread
            failure.append(exc)

    worker = threading.Thread(target=work, name="lore-import", daemon=True)
    with progress:
        reading = progress.add_task(f"reading {source}", total=len(files))
        embedding = progress.add_task("embedding messages", total=None,
                                      visible=memory.embedding_progress is not None)
        worker.start()
        while worker.is_alive():
            worker.join(REDRAW_SECONDS)
            progress.update(reading, completed=files_done[0])
            counts = memory.embedding_progress
            if counts is not None:
                done, total = counts
                progress.update(embedding, completed=done, total=max(total, done) or None)
    if failure:
        raise failure[0]
    return result[0]
