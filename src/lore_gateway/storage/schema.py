"""Versioned forward migrations of the memory database, for both backends.

Each migration runs once, in its own transaction, and records its version in
``schema_version``. Migrations are only ever appended: a released version is never
edited, so any older database upgrades by replaying the tail of the list. This
module holds SQLite's list (``MIGRATIONS``); ``schema_pg.py`` holds Postgres's,
with the same version numbers for the same tables (docs/storage.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lore_gateway.storage.base import Connection


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    sql: str
    # The step builds the HNSW vector index (Postgres): its memory is sized first.
    builds_vector_index: bool = False


_V1 = """
CREATE TABLE turns(
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    project TEXT NOT NULL,
    session TEXT NOT NULL,
    protocol TEXT NOT NULL,
    model TEXT,
    created_at REAL NOT NULL,
    complete INTEGER NOT NULL,
    dedup_key TEXT UNIQUE
);
-- Incomplete turns are rare; this partial index makes "supersede the failed attempt
-- of this session" a lookup instead of a scan.
CREATE INDEX turns_incomplete ON turns(tenant, session) WHERE complete = 0;

CREATE TABLE messages(
    id INTEGER PRIMARY KEY,
    turn_id INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
    tenant TEXT NOT NULL,
    project TEXT NOT NULL,
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    created_at REAL NOT NULL,
    truncated INTEGER NOT NULL DEFAULT 0,
    meta TEXT
);
CREATE INDEX messages_tenant_session ON messages(tenant, session);
CREATE INDEX messages_tenant_project ON messages(tenant, project);
CREATE INDEX messages_created_at ON messages(created_at);
CREATE INDEX messages_turn ON messages(turn_id);

CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, content='messages', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_au AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;

CREATE TABLE embeddings(
    message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    model TEXT NOT NULL,
    vector BLOB NOT NULL
);

CREATE TABLE sessions(
    tenant TEXT,
    id TEXT,
    project TEXT,
    first_seen REAL,
    last_seen REAL,
    turns INTEGER,
    PRIMARY KEY (tenant, id)
);

CREATE TABLE kv(key TEXT PRIMARY KEY, value TEXT);
"""

# v2 (search): ``context_fts`` indexes each message together with the message
# before it in the same session, so a search can score an answer by the question
# it answers (docs/search.md). Contentless: it stores only the index, not a second
# copy of the text. The previous message contributes its first 2,000 characters.
_V2 = """
CREATE VIRTUAL TABLE context_fts USING fts5(
    content, content='', contentless_delete=1, tokenize='porter unicode61'
);
CREATE TRIGGER context_fts_ai AFTER INSERT ON messages BEGIN
    INSERT INTO context_fts(rowid, content) VALUES (new.id, coalesce((
        SELECT substr(p.content, 1, 2000) FROM messages p
        WHERE p.tenant = new.tenant AND p.session = new.session AND p.id < new.id
        ORDER BY p.id DESC LIMIT 1), '') || char(10) || new.content);
END;
CREATE TRIGGER context_fts_ad AFTER DELETE ON messages BEGIN
    DELETE FROM context_fts WHERE rowid = old.id;
END;
CREATE TRIGGER context_fts_au AFTER UPDATE OF content ON messages BEGIN
    DELETE FROM context_fts WHERE rowid = old.id;
    INSERT INTO context_fts(rowid, content) VALUES (new.id, coalesce((
        SELECT substr(p.content, 1, 2000) FROM messages p
        WHERE p.tenant = new.tenant AND p.session = new.session AND p.id < new.id
        ORDER BY p.id DESC LIMIT 1), '') || char(10) || new.content);
END;
INSERT INTO context_fts(rowid, content)
    SELECT m.id, coalesce((
        SELECT substr(p.content, 1, 2000) FROM messages p
        WHERE p.tenant = m.tenant AND p.session = m.session AND p.id < m.id
        ORDER BY p.id DESC LIMIT 1), '') || char(10) || m.content
    FROM messages m;
"""

# v3 (recall): the recalls a client transcript points at through its anchors, kept
# so the next request can put the exact tool-call pair back upstream after a
# restart (lore-spec B.6, I.14; recall/anchor_store.py). ``assistant`` and
# ``tool_result`` are the JSON the follow-up sent, verbatim.
_V3 = """
CREATE TABLE recall_anchors(
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    anchor_id TEXT NOT NULL,
    protocol TEXT NOT NULL,
    marker TEXT,
    call_id TEXT NOT NULL,
    arguments TEXT NOT NULL,
    position INTEGER NOT NULL,
    context_id TEXT NOT NULL,
    assistant TEXT NOT NULL,
    tool_result TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (tenant, session, anchor_id)
) WITHOUT ROWID;
"""

# v4 (search at scale): both search indexes gain a ``scope`` column holding three
# short tokens per message (``t<n> p<n> s<n>``: its tenant, project and session, as
# ids into ``search_scopes``). A scoped search then matches ``{scope}: p7 AND
# {content}: (...)``, so FTS5 scores only in-scope rows instead of every match in
# the database; ``bm25(…, 1.0, 0.0)`` gives the scope column no weight. Both tables
# become contentless (``messages`` holds the text; search never reads it from the
# index). Rebuilt from ``messages`` once, here.
_SCOPE_TOKENS = """(SELECT 't' || t.id || ' p' || p.id || ' s' || s.id FROM search_scopes t,
        search_scopes p, search_scopes s
        WHERE t.kind = 't' AND t.tenant = {m}.tenant AND t.name = ''
          AND p.kind = 'p' AND p.tenant = {m}.tenant AND p.name = {m}.project
          AND s.kind = 's' AND s.tenant = {m}.tenant AND s.name = {m}.session)"""
_PREVIOUS = """coalesce((SELECT substr(p.content, 1, 2000) FROM messages p
        WHERE p.tenant = {m}.tenant AND p.session = {m}.session AND p.id < {m}.id
        ORDER BY p.id DESC LIMIT 1), '') || char(10) || {m}.content"""
_CLAIM_SCOPES = """INSERT OR IGNORE INTO search_scopes(kind, tenant, name)
        VALUES ('t', {m}.tenant, ''), ('p', {m}.tenant, {m}.project),
               ('s', {m}.tenant, {m}.session)"""
_INDEX_ROW = """INSERT INTO messages_fts(rowid, content, scope)
        VALUES ({m}.id, {m}.content, """ + _SCOPE_TOKENS + """);
    INSERT INTO context_fts(rowid, content, scope)
        VALUES ({m}.id, """ + _PREVIOUS + """, """ + _SCOPE_TOKENS + """);"""
_V4 = """
DROP TRIGGER messages_fts_ai;
DROP TRIGGER messages_fts_ad;
DROP TRIGGER messages_fts_au;
DROP TRIGGER context_fts_ai;
DROP TRIGGER context_fts_ad;
DROP TRIGGER context_fts_au;
DROP TABLE messages_fts;
DROP TABLE context_fts;
CREATE TABLE search_scopes(
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    UNIQUE (kind, tenant, name)
);
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, scope, content='', contentless_delete=1, tokenize='porter unicode61'
);
CREATE VIRTUAL TABLE context_fts USING fts5(
    content, scope, content='', contentless_delete=1, tokenize='porter unicode61'
);
CREATE TRIGGER search_index_ai AFTER INSERT ON messages BEGIN
    """ + _CLAIM_SCOPES.format(m="new") + """;
    """ + _INDEX_ROW.format(m="new") + """
END;
CREATE TRIGGER search_index_ad AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    DELETE FROM context_fts WHERE rowid = old.id;
END;
CREATE TRIGGER search_index_au AFTER UPDATE OF content, tenant, project, session ON messages
BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    DELETE FROM context_fts WHERE rowid = old.id;
    """ + _CLAIM_SCOPES.format(m="new") + """;
    """ + _INDEX_ROW.format(m="new") + """
END;
INSERT OR IGNORE INTO search_scopes(kind, tenant, name)
    SELECT DISTINCT 't', tenant, '' FROM messages;
INSERT OR IGNORE INTO search_scopes(kind, tenant, name)
    SELECT DISTINCT 'p', tenant, project FROM messages;
INSERT OR IGNORE INTO search_scopes(kind, tenant, name)
    SELECT DISTINCT 's', tenant, session FROM messages;
INSERT INTO messages_fts(rowid, content, scope)
    SELECT m.id, m.content, """ + _SCOPE_TOKENS.format(m="m") + """ FROM messages m;
INSERT INTO context_fts(rowid, content, scope)
    SELECT m.id, """ + _PREVIOUS.format(m="m") + """, """ + _SCOPE_TOKENS.format(m="m") + """
    FROM messages m;
"""

# v5 (knowledge, issue 12): the background worker's durable job queue and its
# daily token ledger per tenant; distillations (observation logs, each also
# stored as an ``observations`` message so search and ``lore data show`` see
# it); long-term knowledge entries per project; and each session's frozen
# knowledge block with its appended updates (so a restart keeps the prefix).
# Self-contained: renumber freely when merging.
_V5_KNOWLEDGE = """
CREATE TABLE worker_jobs(
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    tenant TEXT NOT NULL,
    project TEXT NOT NULL,
    session TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL,
    last_error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE UNIQUE INDEX worker_jobs_open ON worker_jobs(kind, tenant, session)
    WHERE state = 'queued';
CREATE INDEX worker_jobs_due ON worker_jobs(state, next_at);
CREATE TABLE worker_usage(
    tenant TEXT NOT NULL,
    day TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, day)
) WITHOUT ROWID;
CREATE TABLE distillations(
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    project TEXT NOT NULL,
    session TEXT NOT NULL,
    generation INTEGER NOT NULL,
    message_id INTEGER,
    text TEXT NOT NULL,
    source_ids TEXT NOT NULL,
    last_source INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    method TEXT NOT NULL,
    created_at REAL NOT NULL,
    archived INTEGER NOT NULL DEFAULT 0,
    curated INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX distillations_session ON distillations(tenant, session);
CREATE INDEX distillations_project ON distillations(tenant, project);
CREATE TABLE knowledge(
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    project TEXT NOT NULL,
    category TEXT NOT NULL,
    title TEXT NOT NULL,
    content TEXT NOT NULL,
    confidence REAL NOT NULL,
    source TEXT NOT NULL,
    cross_project INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX knowledge_scope ON knowledge(tenant, project);
CREATE TABLE knowledge_sessions(
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    project TEXT NOT NULL,
    block TEXT NOT NULL,
    entry_ids TEXT NOT NULL,
    deltas TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (tenant, session)
) WITHOUT ROWID;
"""

# v6 (tenancy): team mode's gateway keys (memory/tenancy/keys.py; only a digest of each
# key is stored), and the move to personal mode: every tenant of an older
# database was a salted hash of a provider credential (or ``anonymous`` for
# imports), so one person's memory was split by API key and login. All of them
# are merged into the one tenant ``personal``. Sessions that two credentials
# shared become one session; updating ``messages.tenant`` re-indexes each row
# for search through the update trigger; search scopes of the old tenants are
# then unused and dropped. Self-contained: only this step knows about tenants.
_V6_TENANCY = """
CREATE TABLE gateway_keys(
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    revoked_at REAL
);
INSERT INTO sessions(tenant, id, project, first_seen, last_seen, turns)
    SELECT 'personal', id, max(project), min(first_seen), max(last_seen), sum(turns)
    FROM sessions WHERE tenant != 'personal' GROUP BY id
    ON CONFLICT(tenant, id) DO UPDATE SET
        first_seen = min(first_seen, excluded.first_seen),
        last_seen = max(last_seen, excluded.last_seen),
        turns = turns + excluded.turns;
DELETE FROM sessions WHERE tenant != 'personal';
UPDATE turns SET tenant = 'personal' WHERE tenant != 'personal';
UPDATE messages SET tenant = 'personal' WHERE tenant != 'personal';
UPDATE OR REPLACE recall_anchors SET tenant = 'personal' WHERE tenant != 'personal';
DELETE FROM search_scopes WHERE tenant != 'personal';
-- The knowledge tables (v5) carry the same tenants.
UPDATE distillations SET tenant = 'personal' WHERE tenant != 'personal';
UPDATE knowledge SET tenant = 'personal' WHERE tenant != 'personal';
UPDATE OR REPLACE knowledge_sessions SET tenant = 'personal' WHERE tenant != 'personal';
UPDATE OR REPLACE worker_jobs SET tenant = 'personal' WHERE tenant != 'personal';
DELETE FROM worker_usage WHERE tenant != 'personal';
"""

# v7 (search quality): two changes to what the search indexes hold, then a rebuild.
# - The context of a message is its predecessor's head *and tail* (1,000 characters
#   each) when that is longer than 2,000 characters: an agent's command sits at the
#   end of its reply, right before the output it produced, so a tool output is now
#   indexed together with the call that made it.
# - The recall tool's own traffic (its calls, and results a client sent back) is
#   indexed as empty text, so search never returns earlier recalls as hits.
_RECALL_TRAFFIC = """({c} GLOB '[[]tool_call:recall] *'
        OR {c} GLOB '[[]tool:*] ## Recall Results*'
        OR {c} GLOB '[[]tool:*] No results found for this query.*')"""
_V7_CONTENT = "CASE WHEN " + _RECALL_TRAFFIC + " THEN '' ELSE {c} END"
_V7_PREVIOUS = """CASE WHEN """ + _RECALL_TRAFFIC.format(c="{m}.content") + """ THEN ''
        ELSE coalesce((SELECT CASE WHEN """ + _RECALL_TRAFFIC.format(c="p.content") + """ THEN ''
            WHEN length(p.content) <= 2000 THEN p.content
            ELSE substr(p.content, 1, 1000) || char(10) || substr(p.content, -1000) END
        FROM messages p
        WHERE p.tenant = {m}.tenant AND p.session = {m}.session AND p.id < {m}.id
        ORDER BY p.id DESC LIMIT 1), '') || char(10) || {m}.content END"""
_V7_INDEX_ROW = """INSERT INTO messages_fts(rowid, content, scope)
        VALUES ({m}.id, """ + _V7_CONTENT.format(c="{m}.content") + """, """ + _SCOPE_TOKENS + """);
    INSERT INTO context_fts(rowid, content, scope)
        VALUES ({m}.id, """ + _V7_PREVIOUS + """, """ + _SCOPE_TOKENS + """);"""
_V7 = """
DROP TRIGGER search_index_ai;
DROP TRIGGER search_index_ad;
DROP TRIGGER search_index_au;
DROP TABLE messages_fts;
DROP TABLE context_fts;
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, scope, content='', contentless_delete=1, tokenize='porter unicode61'
);
CREATE VIRTUAL TABLE context_fts USING fts5(
    content, scope, content='', contentless_delete=1, tokenize='porter unicode61'
);
CREATE TRIGGER search_index_ai AFTER INSERT ON messages BEGIN
    """ + _CLAIM_SCOPES.format(m="new") + """;
    """ + _V7_INDEX_ROW.format(m="new") + """
END;
CREATE TRIGGER search_index_ad AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    DELETE FROM context_fts WHERE rowid = old.id;
END;
CREATE TRIGGER search_index_au AFTER UPDATE OF content, tenant, project, session ON messages
BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    DELETE FROM context_fts WHERE rowid = old.id;
    """ + _CLAIM_SCOPES.format(m="new") + """;
    """ + _V7_INDEX_ROW.format(m="new") + """
END;
INSERT INTO messages_fts(rowid, content, scope)
    SELECT m.id, """ + _V7_CONTENT.format(c="m.content") + """,
        """ + _SCOPE_TOKENS.format(m="m") + """
    FROM messages m;
INSERT INTO context_fts(rowid, content, scope)
    SELECT m.id, """ + _V7_PREVIOUS.format(m="m") + """, """ + _SCOPE_TOKENS.format(m="m") + """
    FROM messages m;
"""

# v8 (ui, issue 16): the gateway's own metrics over time for the /ui overview
# charts, so they survive a restart. One row per sampling interval that saw
# traffic, holding the increments of that interval (ui/samples.py). Only counts;
# no tenant, no content. Self-contained: renumber freely when merging.
_V8_UI_METRICS = """
CREATE TABLE metrics_samples(
    ts REAL NOT NULL,
    requests INTEGER NOT NULL,
    tokens_in INTEGER NOT NULL,
    tokens_out INTEGER NOT NULL,
    cache_read INTEGER NOT NULL,
    recall_calls INTEGER NOT NULL,
    recall_hits INTEGER NOT NULL,
    overhead_s REAL NOT NULL,
    overhead_n INTEGER NOT NULL
);
CREATE INDEX metrics_samples_ts ON metrics_samples(ts);
"""

# v9 (several instances, issue 17): worker jobs are leased, so that gateways sharing
# one database run each job once (worker/jobs.py). ``owner`` is the instance that
# queued the job (it holds the session's credential), ``leased_by`` and
# ``lease_until`` the instance running it and until when. Self-contained:
# renumber freely when merging.
_V9_WORKER_LEASES = """
ALTER TABLE worker_jobs ADD COLUMN owner TEXT;
ALTER TABLE worker_jobs ADD COLUMN leased_by TEXT;
ALTER TABLE worker_jobs ADD COLUMN lease_until REAL;
"""

# v10 (context, issue 13): each session's context-management state (layer, frozen
# distilled prefix, calibration) as one JSON document, so the layout survives a
# restart and can be shared by instances. Self-contained: renumber freely.
_V10_CONTEXT = """
CREATE TABLE context_sessions(
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    layer INTEGER NOT NULL,
    state TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (tenant, session)
) WITHOUT ROWID;
"""

# v11 (fast Postgres writes): Postgres fills its search index per statement
# (schema_pg's _PG_V11_SETWISE_INDEX); SQLite's FTS5 triggers stay as they are. The
# step exists so both backends keep the same version numbers. Renumber freely.
_V11_SETWISE_INDEX = "SELECT 1;"

# v12 (fast Postgres search): Postgres keeps per-lexeme document frequencies
# (schema_pg's _PG_V12_TERM_STATS); FTS5 needs none. Same version numbers; renumber freely.
_V12_TERM_STATS = "SELECT 1;"

# v13 (team mode): Postgres's row-level security (schema_pg's _PG_V13_TENANT_RLS);
# SQLite has none. Same version numbers; renumber freely.
_V13_TENANT_RLS = "SELECT 1;"

# v14 (knowledge history, issue 36): every change to a knowledge entry, with the
# entry's state before and after it (knowledge/history.py). Rows of a deleted entry
# stay (the audit trail) until the entry's project or its text is forgotten.
# Self-contained: renumber freely when merging.
_V14_KNOWLEDGE_HISTORY = """
CREATE TABLE knowledge_history(
    entry_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    project TEXT NOT NULL,
    change TEXT NOT NULL,
    actor TEXT NOT NULL,
    source TEXT NOT NULL,
    before_category TEXT,
    before_title TEXT,
    before_content TEXT,
    before_confidence REAL,
    before_cross INTEGER,
    category TEXT,
    title TEXT,
    content TEXT,
    confidence REAL,
    cross_project INTEGER,
    created_at REAL NOT NULL,
    PRIMARY KEY (tenant, entry_id, version)
) WITHOUT ROWID;
CREATE INDEX knowledge_history_scope ON knowledge_history(tenant, project, created_at);
"""

MIGRATIONS: list[Migration] = [
    Migration(1, "turns, messages + FTS5, embeddings, sessions, kv", _V1),
    Migration(2, "context_fts: each message with its predecessor, for search", _V2),
    Migration(3, "recall_anchors: recalls kept for next-turn expansion", _V3),
    Migration(4, "scope tokens in both search indexes; contentless", _V4),
    Migration(5, "knowledge: worker jobs and usage, distillations, knowledge entries",
              _V5_KNOWLEDGE),
    Migration(6, "personal tenant: gateway keys; credential tenants merged", _V6_TENANCY),
    Migration(7, "search: call + output context, recall traffic unindexed", _V7),
    Migration(8, "ui: metrics samples for the overview charts", _V8_UI_METRICS),
    Migration(9, "worker: job leases, for several instances on one database",
              _V9_WORKER_LEASES),
    Migration(10, "context: per-session layer, frozen prefix, calibration", _V10_CONTEXT),
    Migration(11, "search: Postgres indexes inserted messages set-wise (nothing here)",
              _V11_SETWISE_INDEX),
    Migration(12, "search: Postgres keeps document frequencies (nothing here)",
              _V12_TERM_STATS),
    Migration(13, "team mode: Postgres row-level security (nothing here)", _V13_TENANT_RLS),
    Migration(14, "knowledge: history of every change to an entry", _V14_KNOWLEDGE_HISTORY),
]


def migrations_for(conn: Connection) -> list[Migration]:
    """The migration list of ``conn``'s backend."""
    if conn.backend == "postgres":
        from lore_gateway.storage.schema_pg import PG_MIGRATIONS

        return PG_MIGRATIONS
    return MIGRATIONS


def latest_version(conn: Connection) -> int:
    return migrations_for(conn)[-1].version


def current_version(conn: Connection) -> int:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0


# The cap on an HNSW build's maintenance_work_mem (LORE_DATABASE_INDEX_MEMORY_MB).
DEFAULT_INDEX_MEMORY_MB = 4096


def migrate(conn: Connection, *, progress: Callable[[str], None] | None = None,
            index_memory_mb: int = DEFAULT_INDEX_MEMORY_MB) -> int:
    """Apply every migration newer than the database; return the resulting version.

    ``progress`` hears one line per step before it runs (``lore db migrate`` prints
    them: a step that builds the vector index of a large store takes minutes).

    Each step holds the schema lock (SQLite's write lock, taken by ``BEGIN
    IMMEDIATE``; a Postgres advisory lock) while it re-reads the version, so two
    processes or instances opening a fresh database at once cannot both apply a
    migration. A database written by a newer gateway is refused rather than guessed at.
    """
    steps = migrations_for(conn)
    latest = steps[-1].version
    while True:
        conn.begin(immediate=True)
        try:
            conn.lock_schema()
            version = current_version(conn)
            if version > latest:
                raise RuntimeError(
                    f"the memory database is at schema version {version}, newer than this "
                    f"lore-gateway understands ({latest}); upgrade lore-gateway"
                )
            pending = [m for m in steps if m.version > version]
            if not pending:
                conn.commit()
                return version
            step = pending[0]
            note = ""
            if step.builds_vector_index and conn.backend == "postgres":
                from lore_gateway.storage.schema_pg import prepare_hnsw_build

                vectors, mb = prepare_hnsw_build(conn, index_memory_mb)
                note = (f" (builds the vector index over {vectors:,} vectors with {mb:,} MB;"
                        " this can take minutes)" if vectors else "")
            if progress is not None:
                progress(f"schema v{step.version}: {step.description}{note}")
            conn.script(step.sql)
            conn.execute("INSERT INTO schema_version(version) VALUES (?)", (step.version,))
            conn.commit()
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
