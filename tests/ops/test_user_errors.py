"""Every bad setting is one line naming the setting and the fix, exit code 2, no traceback.

One test per case of issue 15's "Why", each run as the exact command a user types.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clikit import (
    lore,
    lore_env,
    make_read_only,
    make_writable,
    one_line_error,
    without_root_powers,
)
from opskit import free_port

from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory


def test_second_serve_on_a_port_held_by_a_lore_gateway(gateway: Any, tmp_path: Path):
    result = lore(lore_env(tmp_path), "serve", "--port", str(gateway.port))

    message = one_line_error(result)
    assert f"a lore gateway (version 0.1.0) is already listening on {gateway.url}" in message
    assert "lore status" in message and "--port to another port" in message


def test_serve_on_a_port_held_by_another_program(tmp_path: Path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]

        result = lore(lore_env(tmp_path, LORE_PORT=str(port)), "serve")

    message = one_line_error(result)
    assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in message
    assert "not by a lore gateway" in message
    assert f"set LORE_PORT or --port to a free port (for example LORE_PORT={port + 1})" \
        in message


def test_port_that_is_not_a_number(tmp_path: Path):
    message = one_line_error(lore(lore_env(tmp_path, LORE_PORT="abc"), "serve"))
    assert message == ("lore: error: LORE_PORT=abc: must be a port number from 1 to 65535; "
                       "set LORE_PORT to a valid value, or unset it for the default (3207)")


def test_port_flag_out_of_range(tmp_path: Path):
    message = one_line_error(lore(lore_env(tmp_path), "serve", "--port", "99999"))
    assert message == ("lore: error: --port 99999: must be a port number from 1 to 65535; "
                       "pass a valid --port")


def test_port_flag_that_is_not_a_number(tmp_path: Path):
    message = one_line_error(lore(lore_env(tmp_path), "serve", "--port", "abc"))
    assert message.startswith("lore: error: Invalid value for '--port': ")
    assert message.endswith("(see `lore serve --help`)")


def test_data_dir_under_a_file(tmp_path: Path):
    (tmp_path / "file").write_text("not a directory")
    env = lore_env(tmp_path, LORE_DATA_DIR=str(tmp_path / "file" / "lore"))

    message = one_line_error(lore(env, "serve", "--port", str(free_port())))

    assert f"{tmp_path / 'file'} is a file, not a directory" in message
    assert "set LORE_DATA_DIR to a directory" in message
    assert not (tmp_path / "file" / "lore").exists()


@pytest.fixture
def read_only_data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data dir holding an intact database, made read-only."""
    data = tmp_path / "data"
    Memory.open(Settings(data_dir=data, embeddings=False), embedder=None).close()
    make_read_only(data)
    yield data
    make_writable(data)


def test_serve_on_a_read_only_data_dir(read_only_data_dir: Path, tmp_path: Path):
    data = read_only_data_dir
    before = (data / "lore.db").read_bytes()

    result = lore(lore_env(tmp_path), "serve", "--port", str(free_port()),
                  prefix=without_root_powers())

    message = one_line_error(result)
    assert f"the data dir {data} is read-only" in message
    assert "the database is left as it is" in message
    assert "set LORE_DATA_DIR to a writable directory" in message
    assert (data / "lore.db").read_bytes() == before


def test_recall_on_a_read_only_data_dir(read_only_data_dir: Path, tmp_path: Path):
    result = lore(lore_env(tmp_path), "recall", "anything", prefix=without_root_powers())

    message = one_line_error(result)
    assert f"the data dir {read_only_data_dir} is read-only" in message
    assert "chmod -R u+w" in message and "LORE_DATA_DIR" in message


def test_upstream_url_without_a_scheme_is_refused_at_start(tmp_path: Path):
    env = lore_env(tmp_path, LORE_UPSTREAM_OPENAI="api.openai.com")

    message = one_line_error(lore(env, "serve", "--port", str(free_port())))

    assert message.startswith("lore: error: LORE_UPSTREAM_OPENAI=api.openai.com: must be a "
                              "URL starting with https:// or http://, such as "
                              "https://api.openai.com")


def test_other_bad_settings_name_themselves(tmp_path: Path):
    cases = {
        "LORE_LOG_LEVEL": ("loud", "must be one of debug, info, warning, error"),
        "LORE_UPSTREAM_READ_TIMEOUT": ("-1", "must be greater than 0"),
        "LORE_STORE": ("perhaps", "LORE_STORE=perhaps: Input should be a valid boolean"),
    }
    for name, (value, expected) in cases.items():
        message = one_line_error(lore(lore_env(tmp_path, **{name: value}), "serve"))
        assert f"{name}={value}" in message and expected in message


def test_a_broken_config_file(tmp_path: Path):
    config = tmp_path / "config" / "lore" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("port = 3300\nprot = 3301\n")
    message = one_line_error(lore(lore_env(tmp_path), "serve"))
    assert message == (f"lore: error: config file {config}: unknown setting 'prot'; "
                       "`lore config show` lists the settings")

    config.write_text("port = [")
    message = one_line_error(lore(lore_env(tmp_path), "config", "show"))
    assert f"config file {config} is not valid TOML" in message

    config.write_text('port = "abc"\n')
    message = one_line_error(lore(lore_env(tmp_path), "serve"))
    assert message.startswith(f"lore: error: port = 'abc' in {config}: must be a port number")
    assert message.endswith(f"fix port in {config}")


def test_a_file_that_is_not_a_database(tmp_path: Path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "lore.db").write_text("my notes, not a database\n" * 50)

    for command in (["serve", "--port", str(free_port())], ["data", "list"]):
        message = one_line_error(lore(lore_env(tmp_path), *command))
        assert f"{tmp_path}/data/lore.db is not an SQLite database" in message
        assert "set LORE_DATA_DIR to another directory" in message


def test_an_unexpected_error_is_one_line_unless_debug(tmp_path: Path):
    (tmp_path / "data").mkdir()
    # An SQLite header over garbage: nothing a setting explains.
    (tmp_path / "data" / "lore.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 8000)

    result = lore(lore_env(tmp_path), "data", "list")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("lore: error: unexpected ")
    assert result.stderr.endswith("(run with LORE_LOG_LEVEL=debug for the traceback, and "
                                  "please report it)\n")
    assert len(result.stderr.splitlines()) == 1

    debug = lore(lore_env(tmp_path, LORE_LOG_LEVEL="debug"), "data", "list")
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
