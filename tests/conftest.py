"""Shared fixtures: the fake upstream, a gateway in front of it, SDK clients.

The fake and the gateway each run in a background thread with their own event
loop (``BackgroundServer``), so both the synchronous SDK clients and the
async tests (on pytest-asyncio's session loop) can talk to them over loopback.
Both servers live for the whole session; ``fake_upstream`` resets the fake's
records and scripts before every test that uses it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lore_gateway.testing import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    BackgroundServer,
    FakeUpstream,
    gateway_settings,
)

# A developer's own ~/.config/lore/config.toml must not change what the tests see;
# tests of the config file point LORE_CONFIG / XDG_CONFIG_HOME at their own.
os.environ["LORE_CONFIG"] = os.devnull

# CI clones the repository into a fresh folder with ``shared/`` beside it.
FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
REPO = Path(__file__).resolve().parents[1]

_OWN_BASETEMP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """A short base for ``tmp_path``: the listing tests print paths under it and
    check that they fit 80 columns, and pytest's default
    (``/tmp/pytest-of-<user>/pytest-<n>/``, then ``popen-gw<k>/`` per worker) is
    long enough to break that (and with a long user name, even in one process).
    Set once by the controlling process; the workers get their ``popen-gw<k>``
    folder under it from pytest-xdist."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="lore-t-")
        config.stash[_OWN_BASETEMP] = config.option.basetemp


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """That base is removed after a run that passed; a failed run's is kept to look at."""
    own = session.config.stash.get(_OWN_BASETEMP, None)
    if own is not None and exitstatus == 0:
        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The recorded provider streams and requests (``shared/fixtures``)."""
    assert FIXTURES.is_dir(), f"{FIXTURES} is missing: clone shared/ beside the repository"
    return FIXTURES


def recorded_streams() -> list[Path]:
    """Every recorded stream: ``*.sse`` and ``*.chunks.jsonl`` under the fixtures."""
    found = [*FIXTURES.rglob("*.sse"), *FIXTURES.rglob("*.chunks.jsonl")]
    return sorted(found)


# The suites whose database tests run once per storage backend (docs/storage.md,
# "Tests"): a test under these folders that uses the memory database (the
# ``database_url`` fixture, itself or through ``memory``, ``gateway``,
# ``make_gateway`` or ``lore_serve``) runs on SQLite and on Postgres, unless marked
# ``sqlite_only`` (it is about the SQLite file itself); a test that uses none runs
# once, since a second backend would change nothing it does. A module elsewhere
# joins with ``pytestmark = pytest.mark.both_backends``.
BACKEND_SUITES = ("memory", "recall", "knowledge")
BACKENDS = ("sqlite", "postgres")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test with a ``recorded_stream`` argument runs once per recorded stream; a
    database test of the backend suites runs once per storage backend."""
    if "recorded_stream" in metafunc.fixturenames:
        streams = recorded_streams()
        ids = [str(p.relative_to(FIXTURES)) for p in streams]
        metafunc.parametrize("recorded_stream", streams, ids=ids)
    if "db_backend" in metafunc.fixturenames and _on_both_backends(metafunc.definition):
        metafunc.parametrize("db_backend", BACKENDS, indirect=True, scope="session")


def _on_both_backends(item: pytest.Item) -> bool:
    """Whether ``item``'s database use runs on Postgres too (BACKEND_SUITES)."""
    if item.get_closest_marker("sqlite_only") is not None:
        return False
    if item.get_closest_marker("both_backends") is not None:
        return True
    try:
        relative = item.path.relative_to(REPO / "tests")
    except ValueError:
        return False
    return relative.parts[0] in BACKEND_SUITES


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """The tests' Postgres (pgserver, or ``LORE_TEST_DATABASE_URL``), started on first use."""
    from lore_gateway.testing.postgres import PostgresForTests

    server = PostgresForTests()
    yield server
    server.close()


@pytest.fixture(scope="session")
def db_backend(request: pytest.FixtureRequest) -> str:
    """The storage backend of this test: ``sqlite`` unless parametrised (BACKEND_SUITES)."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def database_url(db_backend: str, request: pytest.FixtureRequest,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[str | None]:
    """The memory database of a test that uses one: on Postgres a fresh database,
    named by ``LORE_DATABASE_URL`` so every ``Settings()`` the test makes (and every
    ``lore`` it starts) uses it; on SQLite ``None`` (each ``Settings`` names its data
    dir's file). Asking for it is what runs a test of the backend suites on both."""
    if db_backend != "postgres":
        yield None
        return
    server = request.getfixturevalue("postgres_server")
    url = server.fresh_url()
    monkeypatch.setenv("LORE_DATABASE_URL", url)
    yield url
    from lore_gateway.storage.target import close_shared

    close_shared(url)
    server.drop(url)


@pytest.fixture(autouse=True)
def database_undeclared(request: pytest.FixtureRequest,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """In the backend suites, a test that opens the memory database without asking
    for it fails (a plain ``Settings().database``, ``Memory.open(Settings(…))``):
    it would run on SQLite only and lose its Postgres run without a word."""
    if "db_backend" in request.fixturenames or not _on_both_backends(request.node):
        return
    from lore_gateway.storage import target

    def undeclared(settings: Any) -> Any:
        raise AssertionError(
            f"{request.node.nodeid} opens the memory database without the "
            "database_url fixture (or memory, gateway, make_gateway, lore_serve): "
            "ask for it, so the test runs on Postgres too")

    monkeypatch.setattr(target, "database_for", undeclared)


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeUpstream]:
    runner = BackgroundServer(FakeUpstream(fixtures_dir=FIXTURES), name="fake-upstream")
    yield runner.start()
    runner.stop()


@pytest.fixture
def fake_upstream(fake_server: FakeUpstream) -> FakeUpstream:
    """The session's fake upstream, with no recorded requests and no script."""
    fake_server.reset()
    return fake_server


@pytest.fixture(scope="session")
def gateway_server(
    fake_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory, db_backend: str,
    request: pytest.FixtureRequest,
) -> Iterator[Any]:
    """The session's gateway, one per backend (on Postgres: its own database)."""
    from lore_gateway.server import Gateway

    extra: dict[str, Any] = {}
    if db_backend == "postgres":
        extra["database_url"] = request.getfixturevalue("postgres_server").fresh_url()
    settings = gateway_settings(fake_server, tmp_path_factory.mktemp("lore-data"), **extra)
    runner = BackgroundServer(Gateway(settings), name="gateway")
    yield runner.start()
    runner.stop()


@pytest.fixture
def gateway(gateway_server: Any, fake_upstream: FakeUpstream) -> Any:
    """A running gateway (storage on) whose upstreams are the (reset) fake."""
    return gateway_server


@pytest.fixture
def make_gateway(
    fake_upstream: FakeUpstream, tmp_path: Path, database_url: str | None
) -> Iterator[Callable[..., Any]]:
    """Start an extra gateway with setting overrides; stopped after the test."""
    from lore_gateway.server import Gateway

    runners: list[BackgroundServer[Any]] = []

    def make(**overrides: Any) -> Any:
        if database_url is not None:
            overrides.setdefault("database_url", database_url)
        settings = gateway_settings(fake_upstream, tmp_path / f"data{len(runners)}", **overrides)
        runner = BackgroundServer(Gateway(settings), name="extra-gateway")
        runners.append(runner)
        return runner.start()

    yield make
    for runner in runners:
        runner.stop()


@pytest.fixture
def openai_client(gateway: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=OPENAI_KEY, max_retries=0)


@pytest.fixture
def openai_direct(fake_upstream: FakeUpstream) -> Any:
    import openai

    return openai.OpenAI(base_url=fake_upstream.url + "/v1", api_key=OPENAI_KEY, max_retries=0)


@pytest.fixture
def anthropic_client(gateway: Any) -> Any:
    import anthropic

    return anthropic.Anthropic(base_url=gateway.url, api_key=ANTHROPIC_KEY, max_retries=0)


@pytest.fixture
def anthropic_direct(fake_upstream: FakeUpstream) -> Any:
    import anthropic

    return anthropic.Anthropic(base_url=fake_upstream.url, api_key=ANTHROPIC_KEY, max_retries=0)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A raw HTTP client that shows bytes as sent (no decompression, no retries)."""
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(auto_decompress=False, timeout=timeout) as session:
        yield session


# ``lore serve`` as a subprocess: url, process, its stderr lines so far, data dir.
ServedGateway = tuple[str, "subprocess.Popen[str]", list[str], Path]
# A cold interpreter with the gateway's imports takes a couple of seconds.
STARTUP_TIMEOUT_S = 30


@pytest.fixture
def lore_serve(fake_upstream: FakeUpstream, tmp_path: Path,
               database_url: str | None) -> Iterator[ServedGateway]:
    """``lore serve --port 0`` in a subprocess, upstreams on the fake, debug logs; on
    Postgres its database is the test's (``LORE_DATABASE_URL``, passed on)."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LORE_")},
        **({"LORE_DATABASE_URL": database_url} if database_url else {}),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
        "LORE_UPSTREAM_OPENAI": fake_upstream.url,
        "LORE_UPSTREAM_CHATGPT": fake_upstream.url + "/backend-api",
        "LORE_UPSTREAM_ANTHROPIC": fake_upstream.url,
        "LORE_UPSTREAM_GEMINI": fake_upstream.url,
        "LORE_DATA_DIR": str(tmp_path / "data"),
        "LORE_LOG_LEVEL": "debug",
        "LORE_EMBEDDINGS": "false",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "lore_gateway", "serve", "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert process.stderr is not None
    url, seen = None, []
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while url is None and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        seen.append(line)
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        url = match.group(1) if match else None
    if url is None:
        process.kill()
        pytest.fail("lore serve did not start:\n" + "".join(seen))
    yield url, process, seen, tmp_path / "data"
    if process.poll() is None:
        process.kill()
        process.wait()
