"""A gateway whose Postgres goes away: plain forwarding goes on, what needs memory
fails with one clear line, and once the database is back memory works again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from psycopg.conninfo import conninfo_to_dict

from lore_gateway.testing import ANTHROPIC_KEY, BackgroundServer, FakeUpstream, gateway_settings

from .relay import Relay

AUTH = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
        "content-type": "application/json"}
UNREACHABLE = "the memory database cannot be reached"
TOOLS = [{"name": "exec", "description": "run a command",
          "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


@pytest.fixture
def relay(postgres_url: str) -> Iterator[tuple[Relay, str]]:
    params = conninfo_to_dict(postgres_url)
    host = str(params.get("host") or "127.0.0.1")
    port = int(params.get("port") or 5432)
    with Relay(host, port) as relay:
        user = params.get("user") or "postgres"
        password = f":{params['password']}" if params.get("password") else ""
        dbname = params.get("dbname") or "postgres"
        yield relay, f"postgresql://{user}{password}@127.0.0.1:{relay.port}/{dbname}"


@pytest.fixture
def gateway(fake_upstream: FakeUpstream, relay: tuple[Relay, str],
            tmp_path: Path) -> Iterator[Any]:
    from lore_gateway.server import Gateway

    settings = gateway_settings(fake_upstream, tmp_path / "data", database_url=relay[1],
                                worker=False, knowledge=False)
    runner = BackgroundServer(Gateway(settings), name="gateway-on-relay")
    yield runner.start()
    runner.stop()


def ask(gw: Any, text: str, scenario: str, session: str = "lost-db") -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    body = {"model": "claude-fake", "max_tokens": 100, "tools": TOOLS,
            "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(gw.url + "/v1/messages", data=orjson.dumps(body),
                                     method="POST", headers={
                                         **AUTH, "x-lore-session-id": session,
                                         "x-fake-scenario": scenario})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def local_recall(gw: Any, query: str) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    body = {"db": gw.memory.database.url, "query": query, "scope": "all"}
    request = urllib.request.Request(gw.url + "/lore/recall", data=orjson.dumps(body),
                                     method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def test_forwarding_goes_on_and_memory_fails_clearly_while_postgres_is_gone(
        gateway: Any, fake_upstream: FakeUpstream, relay: tuple[Relay, str]) -> None:
    status, _ = ask(gateway, "The deploy key lives in vault tangerine.", "text:noted")
    assert status == 200
    gateway.memory.flush(30)
    assert local_recall(gateway, "deploy key tangerine")[0] == 200

    relay[0].cut()
    fake_upstream.reset()
    status, answer = ask(gateway, "Just say hello.", "text:hello there")
    assert status == 200 and answer["content"][0]["text"] == "hello there"
    (forwarded,) = fake_upstream.model_requests
    assert b"Just say hello." in forwarded.body

    fake_upstream.reset()
    status, answer = ask(gateway, "Where is the deploy key?", "recall:deploy key")
    assert status == 200
    _, follow_up = fake_upstream.model_requests
    assert UNREACHABLE.encode() in follow_up.body

    status, error = local_recall(gateway, "deploy key")
    assert status == 503
    message = error["error"]["message"]
    assert UNREACHABLE in message and "\n" not in message

    relay[0].restore()
    # Memory comes back by itself (a failed check is retried after a second).
    deadline = time.monotonic() + 30
    while local_recall(gateway, "deploy key")[0] != 200:
        assert time.monotonic() < deadline, "memory did not come back with the database"
        time.sleep(0.2)
    fake_upstream.reset()
    status, _ = ask(gateway, "Where is the deploy key now?", "recall:deploy key tangerine")
    assert status == 200
    _, follow_up = fake_upstream.model_requests
    assert b"tangerine" in follow_up.body and UNREACHABLE.encode() not in follow_up.body
    # The turns answered while the database was gone waited in the writer's queue.
    gateway.memory.flush(60)
    stored = gateway.memory.read(lambda c: [str(r[0]) for r in c.execute(
        "SELECT content FROM messages WHERE role = 'user'")])
    for text in ("Just say hello.", "Where is the deploy key?"):
        assert sum(text in s for s in stored) == 1, stored


def _turn(text: str) -> Any:
    from lore_gateway.memory.store.records import Identity, Message, TurnRecord

    return TurnRecord(identity=Identity("personal", "p", "lost-db"), protocol="test",
                      model=None, messages=(Message("user", text),), created_at=time.time())


def _wait_for(check: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_writer_recovers_from_a_connection_lost_inside_its_transaction(
        postgres_url: str, relay: tuple[Relay, str]) -> None:
    """The server goes away while the writer's batch is mid-transaction: once it is
    back, the batch is written on a new connection (it used to retry for ever on the
    dead one: "the connection is closed")."""
    import psycopg

    from lore_gateway.memory.store.writer import TurnWriter
    from lore_gateway.storage import db
    from lore_gateway.storage.target import parse_url

    with psycopg.connect(postgres_url, autocommit=True) as admin:
        # Holds the writer's INSERT (inside its BEGIN … COMMIT) while hold_once has a row.
        admin.execute("CREATE TABLE hold_once(x int)")
        admin.execute("INSERT INTO hold_once VALUES (1)")
        admin.execute("CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                      " IF EXISTS (SELECT 1 FROM hold_once) THEN PERFORM pg_sleep(60); END IF;"
                      " RETURN NEW; END $$")
        admin.execute("CREATE TRIGGER hold BEFORE INSERT ON turns FOR EACH ROW"
                      " EXECUTE FUNCTION hold()")
        database = parse_url(relay[1])
        writer = TurnWriter(db.conn_factory(database), max_message_bytes=100_000)
        try:
            writer.submit(_turn("The staging key is in locker nine."))

            def sleeping() -> list[Any]:
                return admin.execute("SELECT pid FROM pg_stat_activity WHERE wait_event ="
                                     " 'PgSleep' AND datname = current_database()").fetchall()

            _wait_for(sleeping, "the writer's INSERT never reached the trigger")
            relay[0].cut()
            for (pid,) in sleeping():  # the server notices a lost client only later
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            admin.execute("DELETE FROM hold_once")
            _wait_for(lambda: writer.degraded is not None, "the writer saw no outage")
            writer.submit(_turn("Just say hello."))
            relay[0].restore()
            assert writer.flush(60), f"the writer did not recover: {writer.degraded}"
            assert writer.degraded is None
        finally:
            writer.close()
            database.close()
        stored = [str(r[0]) for r in admin.execute(
            "SELECT content FROM messages ORDER BY id")]
        assert stored == ["The staging key is in locker nine.", "Just say hello."]


def test_a_connection_left_mid_command_is_replaced(relay: tuple[Relay, str]) -> None:
    """A call that failed while libpq still waited for its result (older libpq
    leaves a connection so after a read error other than a reset) must not poison
    the connection: every later statement would fail with "another command is
    already in progress", which is what the storage process once logged for ever."""
    from lore_gateway.storage.errors import StorageUnavailable
    from lore_gateway.storage.target import parse_url

    database = parse_url(relay[1])
    conn = database.connect()
    try:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.raw.pgconn.send_query(b"SELECT 2")  # type: ignore[attr-defined]  # sent, never read
        with pytest.raises(StorageUnavailable, match="another command is already in progress"):
            conn.execute("SELECT 3")
        assert conn.execute("SELECT 4").fetchone() == (4,)
        conn.begin()
        conn.execute("SELECT 5")
        conn.commit()
    finally:
        conn.close()
        database.close()


def test_a_connection_idle_through_an_outage_serves_its_next_statement(
        relay: tuple[Relay, str]) -> None:
    """The reader (or any long-held connection) sat idle while the server went away
    and came back: its next statement runs on a fresh connection, instead of failing
    once with "server closed the connection unexpectedly" after memory is back."""
    from lore_gateway.storage.errors import StorageUnavailable
    from lore_gateway.storage.target import parse_url

    database = parse_url(relay[1])
    conn = database.connect()
    try:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        relay[0].cut()
        with pytest.raises(StorageUnavailable):
            database.connect()  # the server is gone: nothing new connects
        relay[0].restore()
        deadline = time.monotonic() + 30
        while True:  # a failed check is remembered for a second
            try:
                database.connect().close()
                break
            except StorageUnavailable:
                assert time.monotonic() < deadline, "the database did not come back"
                time.sleep(0.2)
        assert conn.execute("SELECT 2").fetchone() == (2,)
    finally:
        conn.close()
        database.close()


def test_a_storage_process_waiting_out_an_outage_still_sees_its_gateway_go(
        relay: tuple[Relay, str]) -> None:
    """``lore-store`` with a flush pending while the database cannot be reached
    still notices that its gateway is gone, and exits (it used to wait inside the
    flush for ever and outlive the gateway)."""
    from lore_gateway.memory.store.process import TurnStoreProcess
    from lore_gateway.storage.target import parse_url

    database = parse_url(relay[1])
    store = TurnStoreProcess(database, max_message_bytes=100_000)
    try:
        assert store.submit(_turn("Before the outage."))
        assert store.flush(30)
        relay[0].cut()
        assert store.submit(_turn("During the outage."))
        assert not store.flush(1.0)  # the child's writer keeps the turn and retries
        store._closing = True  # what follows is the gateway dying, not a stop
        store._turns.close()  # the child sees end of file, no stop message
        store._process.join(60)
        assert not store._process.is_alive(), "lore-store outlived its gateway"
    finally:
        relay[0].restore()
        if store._process.is_alive():
            store._process.kill()
        database.close()
