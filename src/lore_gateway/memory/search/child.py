"""The child's side of memory search: a ``Searcher`` answering queries on a socket.

Run in a search process (``LORE_SEARCH_WORKERS`` > 0) or on a thread of the
embedding process (the default), never in the gateway. Kept apart from
``search_process.py``, the gateway's side, so that a child never imports
asyncio (with ssl, 6.7 MiB of RSS in the embedding process) or multiprocessing:
the framing is ``multiprocessing.connection``'s (a 4-byte big-endian length,
then the pickle), read and written on the socket directly.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from lore_gateway.storage.errors import MemoryUnavailable

if TYPE_CHECKING:
    from lore_gateway.memory.embed.embedder import Embedder, FloatArray
    from lore_gateway.memory.search.searcher import Searcher

# Query vectors remembered per search process (1.5 KiB each).
QUERY_CACHE_SIZE = 1024
# How often the child checks that the gateway that started it is alive.
PARENT_CHECK_S = 1.0
_HEAD = struct.Struct("!i")


def _receive(conn: socket.socket) -> bytes:
    """One framed request; ``EOFError`` when the gateway closed its end."""
    (size,) = _HEAD.unpack(_exactly(conn, _HEAD.size))
    if size < 0:  # the gateway never sends the over-2-GiB form
        raise OSError(f"bad search request frame (length {size})")
    return _exactly(conn, size)


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the gateway closed the search socket")
        data += chunk
    return bytes(data)


def searcher(address: str, embedder: Embedder | None, *, rerank: bool = False) -> Searcher:
    """A child's ``Searcher`` over the database at ``address``, with ``embedder``
    (``None``: BM25 only) behind the query-vector cache, and the cross-encoder
    when ``rerank`` (``LORE_RERANK``, passed by the gateway: the child reads no settings)."""
    from lore_gateway.memory.search.rerank import load_reranker
    from lore_gateway.memory.search.searcher import Searcher
    from lore_gateway.storage import db
    from lore_gateway.storage.target import parse_url

    cached = _QueryCache(embedder) if embedder is not None else None
    reranker = load_reranker() if rerank else None
    return Searcher(db.conn_factory(parse_url(address)), cached, reranker)


def _init(address: str, embeddings: bool, parent: int, rerank: bool) -> Searcher:
    threading.Thread(target=_exit_with_parent, args=(parent,), name="lore-search-parent",
                     daemon=True).start()
    from lore_gateway import heap

    heap.name_process("lore-search")
    heap.start_trimmer()
    embedder = None
    if embeddings:
        from lore_gateway.memory.embed.embedder import load_embedder

        embedder = load_embedder()
    return searcher(address, embedder, rerank=rerank)


class _QueryCache:
    """The embedder, remembering the vectors of recent queries.

    The query embedding is three quarters of a search's CPU (11 ms of 14 on this
    machine), and an agent asks the same question again: a follow-up recall, a
    retried turn, a second session on the same topic. The vectors are a pure
    function of the text, so a cache never changes a result.
    """

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self.model_name = embedder.model_name
        self.dim = embedder.dim
        self._cache: OrderedDict[str, FloatArray] = OrderedDict()

    def embed(self, texts: list[str]) -> FloatArray:
        if len(texts) != 1:
            return self._embedder.embed(texts)
        (text,) = texts
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        vectors = self._embedder.embed(texts)
        self._cache[text] = vectors
        if len(self._cache) > QUERY_CACHE_SIZE:
            self._cache.popitem(last=False)
        return vectors


def _exit_with_parent(parent: int) -> None:
    """A gateway killed with SIGKILL cannot stop us, and the pool's queue never
    reports it (this process holds both ends of its pipe): look for ourselves."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _failure(exc: Exception) -> MemoryUnavailable | str:
    """What goes back for a failed search: our own typed "memory cannot answer"
    errors as they are (an unreachable database must reach the recall as that, not
    as a generic failure), anything else as its text."""
    if isinstance(exc, MemoryUnavailable):
        return type(exc)(str(exc))
    return f"{type(exc).__name__}: {exc}"


def child_main(fd: int, address: str, embeddings: bool, parent: int, rerank: bool) -> None:
    """A search child: load, then answer queries until the gateway closes its end."""
    serve(fd, _init(address, embeddings, parent, rerank))


def serve(fd: int, searcher: Searcher) -> None:
    """Answer one query at a time, in the order they came, until the gateway closes
    its end of the socket ``fd``. Also the search loop of the embedding process
    (``embed_process.py``)."""
    conn = socket.socket(fileno=fd)
    while True:
        try:
            request_id, query, args = pickle.loads(_receive(conn))
        except (EOFError, OSError):
            return  # the gateway closed its end: stop
        tenant, project, session, scope, limit = args
        try:
            result = searcher.search(query, tenant=tenant, project=project, session=session,
                                     scope=scope, limit=limit)
            reply = pickle.dumps((request_id, True, result))
        except Exception as exc:  # a failed search fails that recall, not the process
            reply = pickle.dumps((request_id, False, _failure(exc)))
        try:
            conn.sendall(_HEAD.pack(len(reply)) + reply)
        except OSError:
            return
