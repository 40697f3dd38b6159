"""``lore db copy``: move a whole memory from one database into another.

The usual move is a personal SQLite memory into a team's Postgres database
(docs/storage.md, "Operations"), so the copy

* keeps every id when the target is empty, and otherwise shifts each table's ids
  past the target's own (``offsets``), rewriting the references between tables
  (``messages.turn_id``, ``embeddings.message_id``, a distillation's message and
  source ids) by the same shifts, so nothing collides with what is there;
* may rename the source's ``personal`` tenant (``tenant``): a team database keeps
  each person's memory under their own tenant;
* is resumable: its plan (the offsets, the tenant) is stored in the target's
  ``kv`` table before the first row, every batch commits with the rows it
  copies, and a second run with the same source and target continues after the
  last committed batch;
* is verified: at the end each table's rows in the target (in the copied id
  range, or for the copied tenants) are counted against the source.

Search indexes and scopes are not copied: the target's triggers build them from
the messages as they arrive (on Postgres ``search_docs``, on SQLite FTS5), in id
order, so each message's context (its predecessor) is the same as in the source.
Not copied either: ``worker_jobs`` (a running gateway's queue, re-planned from
the memory on the next turn), ``metrics_samples`` (one gateway's charts),
``kv`` (caches keyed by a tenant, rebuilt when needed) and ``context_sessions``
(a session's context layout, planned again on its next request).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from lore_gateway.storage import schema
from lore_gateway.storage.base import Connection, Database

# Rows per target transaction: large enough to amortise the commit, small enough
# that an interrupted copy loses little and a reader never waits long.
BATCH_ROWS = 2_000
PERSONAL = "personal"
_STATE_KEY = "lore-db-copy:"

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class Table:
    """One table to copy. ``key``: its integer id column (resumable by id) or
    None (small tables keyed otherwise, copied whole, conflicts ignored).
    ``shifts``: columns that hold ids of another table (that table's offset)."""

    name: str
    columns: tuple[str, ...]
    key: str | None = None
    offset_of: str | None = None  # whose offset shifts ``key`` (default: this table)
    shifts: tuple[tuple[str, str], ...] = ()
    tenant: bool = True


# In dependency order: a row's references are copied before it.
TABLES: tuple[Table, ...] = (
    Table("turns", ("id", "tenant", "project", "session", "protocol", "model", "created_at",
                    "complete", "dedup_key"), key="id"),
    Table("messages", ("id", "turn_id", "tenant", "project", "session", "seq", "role",
                       "content", "tokens", "created_at", "truncated", "meta"), key="id",
          shifts=(("turn_id", "turns"),)),
    Table("embeddings", ("message_id", "model", "vector"), key="message_id",
          offset_of="messages", tenant=False),
    Table("sessions", ("tenant", "id", "project", "first_seen", "last_seen", "turns")),
    Table("recall_anchors", ("tenant", "session", "anchor_id", "protocol", "marker",
                             "call_id", "arguments", "position", "context_id", "assistant",
                             "tool_result", "created_at")),
    Table("distillations", ("id", "tenant", "project", "session", "generation", "message_id",
                            "text", "source_ids", "last_source", "input_tokens",
                            "output_tokens", "method", "created_at", "archived", "curated"),
          key="id", shifts=(("message_id", "messages"), ("last_source", "messages"))),
    Table("knowledge", ("id", "tenant", "project", "category", "title", "content",
                        "confidence", "source", "cross_project", "created_at", "updated_at")),
    Table("knowledge_history", ("entry_id", "version", "tenant", "project", "change", "actor",
                                "source", "before_category", "before_title", "before_content",
                                "before_confidence", "before_cross", "category", "title",
                                "content", "confidence", "cross_project", "created_at")),
    Table("knowledge_sessions", ("tenant", "session", "project", "block", "entry_ids",
                                 "deltas", "created_at")),
    Table("worker_usage", ("tenant", "day", "requests", "tokens_in", "tokens_out")),
    Table("gateway_keys", ("id", "tenant", "hash", "created_at", "revoked_at")),
)
# Tables whose ids other tables' offsets are taken from.
_ID_TABLES = ("turns", "messages", "distillations")


class CopyError(Exception):
    """The copy cannot go on; the message says why and what to do."""


@dataclass(slots=True)
class Plan:
    """What a copy does, stored in the target so a second run resumes it."""

    source: str
    tenant: str | None
    offsets: dict[str, int]
    before: dict[str, int] = field(default_factory=dict)  # target rows per keyless table
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def to_json(self) -> str:
        return orjson.dumps({"source": self.source, "tenant": self.tenant,
                             "offsets": self.offsets, "before": self.before,
                             "started_at": self.started_at,
                             "finished_at": self.finished_at}).decode()

    @classmethod
    def from_json(cls, raw: str) -> Plan:
        d = orjson.loads(raw)
        return cls(str(d["source"]), d.get("tenant"), {k: int(v) for k, v in
                                                        d["offsets"].items()},
                   {k: int(v) for k, v in d.get("before", {}).items()},
                   float(d.get("started_at", 0.0)), d.get("finished_at"))


@dataclass(frozen=True, slots=True)
class TableCount:
    table: str
    source: int
    target: int
    copied_now: int

    @property
    def ok(self) -> bool:
        return self.source == self.target


@dataclass(frozen=True, slots=True)
class CopyResult:
    plan: Plan
    resumed: bool
    counts: list[TableCount]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.counts)


def copy(source: Database, target: Database, *, tenant: str | None = None,
         batch_rows: int = BATCH_ROWS, progress: Progress | None = None) -> CopyResult:
    """Copy everything in ``source`` into ``target`` (migrated first); see the module."""
    if source == target:
        raise CopyError("the source and the target are the same database")
    started = time.perf_counter()
    src = source.connect()
    dst = target.connect()
    try:
        _check_versions(src, dst, source, target)
        plan, resumed = _plan(src, dst, source.url, tenant)
        counts = []
        for table in TABLES:
            copied = _copy_table(src, dst, table, plan, batch_rows, progress)
            counts.append(_count(src, dst, table, plan, copied))
        if dst.backend == "postgres":
            _advance_identities(dst)
        if all(c.ok for c in counts):
            plan.finished_at = time.time()
            _save_plan(dst, plan)
        return CopyResult(plan, resumed, counts, time.perf_counter() - started)
    finally:
        src.close()
        dst.close()


def _check_versions(src: Connection, dst: Connection, source: Database,
                    target: Database) -> None:
    schema.migrate(dst)
    have, want = schema.current_version(src), schema.latest_version(src)
    if have != want:
        raise CopyError(f"the source {source.url} is at schema version {have}, not {want}; "
                        f"run `lore db migrate --url {source.url}` first (or start a gateway "
                        "on it once)")
    if schema.current_version(dst) != schema.latest_version(dst):
        raise CopyError(f"the target {target.url} is not at this lore-gateway's schema "
                        "version; upgrade lore-gateway")


def _plan(src: Connection, dst: Connection, source_url: str,
          tenant: str | None) -> tuple[Plan, bool]:
    row = dst.execute("SELECT value FROM kv WHERE key = ?", (_STATE_KEY + source_url,)
                      ).fetchone()
    if row is not None:
        plan = Plan.from_json(str(row[0]))
        if plan.tenant != tenant:
            raise CopyError(f"a copy of {source_url} into this database was started with "
                            f"--tenant {plan.tenant or '(none)'}; resume it with the same "
                            "--tenant")
        return plan, True
    offsets = {}
    for name in _ID_TABLES:
        found = dst.execute(f"SELECT max(id) FROM {name}").fetchone()
        offsets[name] = int(found[0]) if found and found[0] is not None else 0
    plan = Plan(source_url, tenant, offsets)
    for table in TABLES:
        if table.key is None:
            plan.before[table.name] = _tenant_rows(dst, table, _target_tenants(src, plan))
    if tenant is not None:
        clash = dst.execute("SELECT count(*) FROM turns WHERE tenant = ?", (tenant,)).fetchone()
        if clash and int(clash[0]):
            raise CopyError(f"the target already holds memory of tenant {tenant!r}; pick "
                            "another --tenant, or delete that memory first")
    _save_plan(dst, plan)
    return plan, False


def state_key_prefix() -> str:
    """Where copies keep their plans in the target's ``kv`` (one key per source)."""
    return _STATE_KEY


def _save_plan(dst: Connection, plan: Plan) -> None:
    dst.execute("INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET"
                " value = excluded.value", (_STATE_KEY + plan.source, plan.to_json()))


def _target_tenants(src: Connection, plan: Plan) -> list[str]:
    tenants = [str(r[0]) for r in src.execute("SELECT DISTINCT tenant FROM turns")]
    return sorted({_mapped(t, plan) for t in tenants} | ({plan.tenant} if plan.tenant else
                                                         set()))


def _mapped(tenant: str, plan: Plan) -> str:
    return plan.tenant if plan.tenant is not None and tenant == PERSONAL else tenant


def _tenant_rows(conn: Connection, table: Table, tenants: Sequence[str]) -> int:
    if not tenants:
        return 0
    marks = ",".join("?" * len(tenants))
    row = conn.execute(f"SELECT count(*) FROM {table.name} WHERE tenant IN ({marks})",
                       tuple(tenants)).fetchone()
    return int(row[0]) if row else 0


def _offset(table: Table, plan: Plan) -> int:
    return plan.offsets.get(table.offset_of or table.name, 0)


def _copy_table(src: Connection, dst: Connection, table: Table, plan: Plan,
                batch_rows: int, progress: Progress | None) -> int:
    cols = ", ".join(table.columns)
    total_row = src.execute(f"SELECT count(*) FROM {table.name}").fetchone()
    total = int(total_row[0]) if total_row else 0
    vector = "vector" in table.columns
    values = ", ".join("CAST(? AS vector)" if c == "vector" and dst.backend == "postgres"
                       else "?" for c in table.columns)
    conflict = "" if table.key is not None else " ON CONFLICT DO NOTHING"
    insert = f"INSERT INTO {table.name}({cols}) VALUES ({values}){conflict}"
    copied = 0
    if table.key is None:
        rows = src.execute(f"SELECT {cols} FROM {table.name}").fetchall()
        for start in range(0, len(rows), batch_rows):
            chunk = [_row(table, r, plan, dst.backend) for r in rows[start:start + batch_rows]]
            with dst:
                dst.executemany(insert, chunk)
            copied += len(chunk)
            if progress:
                progress(table.name, copied, total)
        return copied
    offset = _offset(table, plan)
    done_row = dst.execute(f"SELECT max({table.key}) FROM {table.name} WHERE {table.key} > ?",
                           (offset,)).fetchone()
    last = int(done_row[0]) - offset if done_row and done_row[0] is not None else 0
    already_row = src.execute(f"SELECT count(*) FROM {table.name} WHERE {table.key} <= ?",
                              (last,)).fetchone()
    done = int(already_row[0]) if already_row else 0
    while True:
        rows = src.execute(f"SELECT {cols} FROM {table.name} WHERE {table.key} > ? "
                           f"ORDER BY {table.key} LIMIT ?", (last, batch_rows)).fetchall()
        if not rows:
            return copied
        chunk = [_row(table, r, plan, dst.backend, vector=vector) for r in rows]
        with dst:
            dst.executemany(insert, chunk)
        last = int(rows[-1][table.columns.index(table.key)])
        copied += len(chunk)
        if progress:
            progress(table.name, done + copied, total)


def _row(table: Table, row: Sequence[Any], plan: Plan, backend: str, *,
         vector: bool = False) -> tuple[Any, ...]:
    out = list(row)
    cols = table.columns
    if table.key is not None:
        out[cols.index(table.key)] = int(out[cols.index(table.key)]) + _offset(table, plan)
    for column, other in table.shifts:
        i = cols.index(column)
        if out[i] is not None and int(out[i]) > 0:
            out[i] = int(out[i]) + plan.offsets[other]
    if table.tenant:
        i = cols.index("tenant")
        out[i] = _mapped(str(out[i]), plan)
    if table.name == "distillations":
        i = cols.index("source_ids")
        shift = plan.offsets["messages"]
        if shift:
            out[i] = orjson.dumps([int(x) + shift for x in orjson.loads(out[i])]).decode()
    if vector:
        i = cols.index("vector")
        out[i] = _vector_for(backend, out[i])
    return tuple(out)


def _vector_for(backend: str, value: Any) -> Any:
    """A stored vector as the target backend stores it: float32 bytes on SQLite,
    pgvector's text form on Postgres (the INSERT casts it)."""
    if isinstance(value, bytes | bytearray | memoryview):
        array = np.frombuffer(bytes(value), dtype="<f4")
    elif isinstance(value, str):
        array = np.asarray(orjson.loads(value), dtype=np.float32)
    else:
        array = np.asarray(value, dtype=np.float32)
    if backend == "postgres":
        return "[" + ",".join(repr(float(x)) for x in array) + "]"
    return array.astype("<f4").tobytes()


def _count(src: Connection, dst: Connection, table: Table, plan: Plan,
           copied_now: int) -> TableCount:
    source_row = src.execute(f"SELECT count(*) FROM {table.name}").fetchone()
    source = int(source_row[0]) if source_row else 0
    if table.key is not None:
        offset = _offset(table, plan)
        top = src.execute(f"SELECT max({table.key}) FROM {table.name}").fetchone()
        high = int(top[0]) if top and top[0] is not None else 0
        row = dst.execute(f"SELECT count(*) FROM {table.name} WHERE {table.key} > ? AND "
                          f"{table.key} <= ?", (offset, offset + high)).fetchone()
        target = int(row[0]) if row else 0
    else:
        tenants = _target_tenants(src, plan)
        if table.tenant:
            target = _tenant_rows(dst, table, tenants) - plan.before.get(table.name, 0)
        else:
            whole = dst.execute(f"SELECT count(*) FROM {table.name}").fetchone()
            target = int(whole[0]) if whole else 0
    return TableCount(table.name, source, target, copied_now)


def _advance_identities(dst: Connection) -> None:
    """Explicit ids do not move Postgres's identity sequences: move them past the
    copied rows, so the next turn a gateway writes gets a free id."""
    for name in _ID_TABLES:
        dst.execute(f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), "
                    f"greatest((SELECT max(id) FROM {name}), 1))")
