"""`lore setup gemini`: GOOGLE_GEMINI_BASE_URL in ~/.gemini/.env line by line (the
user's other lines kept), `--undo` byte for byte, a merge when the user edited
since, `--print`, team mode, and `lore run gemini`'s environment (issue 35)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from lore_gateway.agents import gemini
from lore_gateway.agents.codex import SetupConflict
from lore_gateway.cli import setup as _setup_cli  # noqa: F401  (attaches the command)
from lore_gateway.cli.main import app
from lore_gateway.cli.run import agent_command
from lore_gateway.config import Settings

GATEWAY = "http://127.0.0.1:43210"
USER_ENV = b"# my keys\nGEMINI_API_KEY=AIza-not-a-real-key\nexport DEBUG=1\n"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "home" / ".config"),
        "CODEX_HOME": str(tmp_path / "home" / ".codex"),
        "LORE_DATA_DIR": str(tmp_path / "data"),
        "LORE_PORT": "43210",
        "LORE_TENANCY": "personal",
        "LORE_KEY": "",
    }


def lore(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.output


def env_file(env: dict[str, str]) -> Path:
    return Path(env["HOME"]) / ".gemini" / ".env"


@pytest.mark.parametrize("original", [USER_ENV, None, b"GOOGLE_GEMINI_BASE_URL=http://x\n"])
def test_setup_then_undo_is_byte_identical(env: dict[str, str], original: bytes | None) -> None:
    path = env_file(env)
    if original is not None:
        path.parent.mkdir(parents=True)
        path.write_bytes(original)
    code, out = lore(env, "setup", "gemini")
    assert code == 0, out
    text = path.read_text()
    assert gemini.points_at_gateway(text, GATEWAY)
    assert text.count("GOOGLE_GEMINI_BASE_URL=") == 1
    if original == USER_ENV:
        assert text.startswith(USER_ENV.decode())
    code, out = lore(env, "setup", "--status", "--json")
    assert '"gemini"' in out and code == 0
    code, out = lore(env, "setup", "--undo", "gemini")
    assert code == 0, out
    if original is None:
        assert not path.exists()
    else:
        assert path.read_bytes() == original


def test_undo_keeps_later_user_lines(env: dict[str, str]) -> None:
    path = env_file(env)
    path.parent.mkdir(parents=True)
    path.write_bytes(USER_ENV)
    assert lore(env, "setup", "gemini")[0] == 0
    path.write_text(path.read_text() + "LATER=yes\n")
    code, out = lore(env, "setup", "--undo", "gemini")
    assert code == 0, out
    assert path.read_text() == USER_ENV.decode() + "LATER=yes\n"


def test_undo_refuses_when_lores_line_was_edited() -> None:
    text, edit = gemini.apply_setup("A=1\n", GATEWAY)
    with pytest.raises(SetupConflict):
        gemini.revert_setup(text.replace(GATEWAY, "http://elsewhere"), edit)


def test_team_mode_adds_the_key_header_and_print_shows_the_lines(env: dict[str, str]) -> None:
    text, edit = gemini.apply_setup('GEMINI_CLI_CUSTOM_HEADERS="X-Team: a"\n', GATEWAY, "k-1")
    assert 'GEMINI_CLI_CUSTOM_HEADERS="X-Team: a, X-Lore-Key: k-1"' in text.splitlines()
    assert gemini.revert_setup(text, edit) == 'GEMINI_CLI_CUSTOM_HEADERS="X-Team: a"\n'
    code, out = lore(env, "setup", "--print", "gemini")
    assert code == 0 and out == f"GOOGLE_GEMINI_BASE_URL={GATEWAY}\n"


def test_gemini_cli_home_moves_the_file(tmp_path: Path) -> None:
    assert gemini.env_path({"HOME": "/h", "GEMINI_CLI_HOME": str(tmp_path)}) \
        == tmp_path / ".gemini" / ".env"


def test_lore_run_gemini_sets_the_base_url_and_the_project_header(tmp_path: Path) -> None:
    binary = tmp_path / "gemini"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    settings = Settings(data_dir=tmp_path, port=43210, gemini_bin=str(binary))
    env = {"GEMINI_CLI_CUSTOM_HEADERS": "X-Team: a"}
    argv, child = agent_command("gemini", settings, ["-p", "hi"], env, "/work/proj")
    assert argv == [str(binary), "-p", "hi"]
    assert child["GOOGLE_GEMINI_BASE_URL"] == GATEWAY
    assert child["GEMINI_CLI_CUSTOM_HEADERS"] == "X-Team: a, X-Lore-Project: /work/proj"
    # A comma would split the header: the project is read from the CLI's context.
    _, child = agent_command("gemini", settings, [], {}, "/work/a,b")
    assert "GEMINI_CLI_CUSTOM_HEADERS" not in child
