"""`lore doctor` reports what is wrong and exits non-zero; `lore logs` shows the log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opskit import free_port
from typer.testing import CliRunner

from lore_gateway.cli import doctor as _doctor_cli  # noqa: F401  (attaches the command)
from lore_gateway.cli import logs as _logs_cli  # noqa: F401
from lore_gateway.cli import setup as _setup_cli  # noqa: F401
from lore_gateway.cli.main import app
from lore_gateway.storage import db, schema
from lore_gateway.testing import FakeUpstream


def doctor_env(tmp_path: Path, fake: FakeUpstream, port: int) -> dict[str, str]:
    return {
        "HOME": str(tmp_path / "home"),
        "CODEX_HOME": str(tmp_path / "home" / ".codex"),
        "LORE_DATA_DIR": str(tmp_path / "data"),
        "LORE_PORT": str(port),
        "LORE_UPSTREAM_OPENAI": fake.url,
        "LORE_UPSTREAM_CHATGPT": fake.url + "/backend-api",
        "LORE_UPSTREAM_ANTHROPIC": fake.url,
        "LORE_EMBEDDINGS": "false",
        "COLUMNS": "200",
    }


def row(output: str, check: str) -> str:
    """The check's line of doctor's plain output (CliRunner is not a terminal)."""
    return next(line for line in output.splitlines() if line.startswith(f"{check}\t"))


def lore(env: dict[str, str], *args: str) -> Any:
    return CliRunner().invoke(app, list(args), env=env)


def test_doctor_all_good(gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path):
    env = doctor_env(tmp_path, fake_upstream, gateway.port)
    conn = db.connect(tmp_path / "data" / "lore.db")
    schema.migrate(conn)
    conn.close()
    assert lore(env, "setup", "claude").exit_code == 0

    result = lore(env, "doctor")

    assert result.exit_code == 0, result.output
    for check in ("gateway", "upstream openai", "upstream anthropic", "data dir", "database",
                  "agent claude"):
        assert row(result.output, check).split("\t")[1] == "ok", result.output
    assert "schema version" in row(result.output, "database")
    assert "skipped" in row(result.output, "embedding model")


def test_doctor_reports_a_corrupt_database_and_a_dead_gateway(
    fake_upstream: FakeUpstream, tmp_path: Path
):
    env = doctor_env(tmp_path, fake_upstream, free_port())
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "lore.db").write_bytes(b"this is not a database" * 100)
    assert lore(env, "setup", "codex").exit_code == 0

    result = lore(env, "doctor")

    assert result.exit_code == 1
    assert "FAIL" in row(result.output, "database")
    gateway = row(result.output, "gateway")
    assert "FAIL" in gateway and "lore serve" in gateway  # codex points at a dead gateway


def test_logs_shows_the_tail_and_the_path(tmp_path: Path):
    env = {"LORE_DATA_DIR": str(tmp_path / "data")}
    assert lore(env, "logs").exit_code == 1  # no log yet, and it says where it looked
    log_file = tmp_path / "data" / "logs" / "gateway.log"
    log_file.parent.mkdir(parents=True)
    log_file.write_text("".join(f"line {i}\n" for i in range(100)))

    result = lore(env, "logs", "-n", "3")
    assert result.exit_code == 0
    assert result.output == "line 97\nline 98\nline 99\n"
    assert lore(env, "logs", "--path").output.strip() == str(log_file)
