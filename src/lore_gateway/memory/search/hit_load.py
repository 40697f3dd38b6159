"""From ranked message ids to hits: what a search result never holds.

Every path that searches (the hidden recall tool, ``lore recall`` locally and
through the gateway, the UI's search) gets its hits here, so none of them shows:

- **the same message twice**: the same text stored twice (a history sent again
  under a new session, a prompt a side call quoted, a command's output each time
  it ran, timings aside: ``dedupe``) says nothing new the second time; the
  best-ranked copy stays and names the others (``Hit.folded``);
- **a side channel**: a title or classifier call is stored for the record
  (``meta.side_channel``) but is not the conversation, and its prompt quotes the
  conversation's words, so it would crowd the real messages out; a tool-less
  app's first exchange (a one-shot) is the conversation's and is shown
  (``hits.hidden_side_channel``);
- **recall traffic**: the recall tool's own calls and results
  (``render.is_recall_traffic``), which repeat the question or earlier results.

The ranking may hold many such rows (OpenCode's title calls all share one
session), so rows are read in slices until ``wanted`` hits are found, never
more than ``MAX_READ`` candidates, and the result stays full rather than
short by the rows skipped. The rows of the last slice read after it is full
still fold into the hits they copy, so a copy's count does not hang on where
the slice ended.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from lore_gateway.memory.search.dedupe import Folder
from lore_gateway.memory.search.hits import Hit, hidden_side_channel
from lore_gateway.memory.search.render import is_recall_traffic
from lore_gateway.memory.search.textindex import TextIndex
from lore_gateway.storage.base import Connection

# Candidates read beyond ``wanted`` at first: most searches skip none or a few.
SPARE_HITS = 10
# Each later read, when skipped rows left the result short.
READ_SLICE = 50
# At most this many candidates are read for one result: a ranking that is all
# noise this far down has nothing more to give (and reading costs content I/O).
MAX_READ = 400


def load_hits(conn: Connection, index: TextIndex, ranked: list[tuple[int, float]],
              tenant: str, wanted: int) -> list[Hit]:
    """The best ``wanted`` hits of ``ranked`` (id, score; best first), scores
    divided by the best candidate's, without the rows a result never holds."""
    if not ranked:
        return []
    top = max(ranked[0][1], 1e-9)
    hits = Folder()
    start = 0
    size = wanted + SPARE_HITS
    while len(hits) < wanted and start < min(len(ranked), MAX_READ):
        part = ranked[start:min(start + size, MAX_READ)]
        start += len(part)
        size = READ_SLICE
        rows = _rows(conn, index, [mid for mid, _ in part], tenant)
        for mid, score in part:
            row = rows.get(mid)
            if row is None:  # deleted since it was indexed, or another tenant's
                continue
            content = str(row[2])
            meta = orjson.loads(str(row[6])) if row[6] else None
            if is_recall_traffic(content) or hidden_side_channel(meta):
                continue
            hits.add(Hit(ref=f"t:{mid}", score=float(np.clip(score / top, 0.0, 1.0)),
                         role=str(row[1]), content=content, created_at=float(row[3]),
                         session=str(row[4]), project=str(row[5]), meta=meta),
                     keep=len(hits) < wanted)
    return hits.hits()


def _rows(conn: Connection, index: TextIndex, ids: list[int],
          tenant: str) -> dict[int, tuple[Any, ...]]:
    marks = ",".join("?" * len(ids))
    return {int(r[0]): r for r in conn.execute(
        f"SELECT id, role, content, created_at, session, project, meta FROM messages"
        f" WHERE id IN ({marks}) AND {index.tenant_column} = ?", (*ids, tenant))}
