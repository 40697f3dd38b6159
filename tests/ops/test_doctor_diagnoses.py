"""``lore doctor`` names the real problem in the three cases it used to misdiagnose."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from clikit import lore, lore_env, make_read_only, make_writable, without_root_powers

from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory
from lore_gateway.testing import FakeUpstream


def doctor(env: dict[str, str], prefix: list[str] | None = None) -> tuple[int, dict[str, Any]]:
    result = lore(env, "doctor", "--json", prefix=prefix)
    assert "Traceback" not in result.stderr
    checks = json.loads(result.stdout)["checks"]
    return result.returncode, {c["name"]: c for c in checks}


def upstreams_on(fake: FakeUpstream) -> dict[str, str]:
    return {"LORE_UPSTREAM_OPENAI": fake.url, "LORE_UPSTREAM_CHATGPT": fake.url + "/backend-api",
            "LORE_UPSTREAM_ANTHROPIC": fake.url}


def test_a_port_held_by_another_program_is_not_a_stopped_gateway(
        fake_upstream: FakeUpstream, tmp_path: Path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = lore_env(tmp_path, LORE_PORT=str(port), **upstreams_on(fake_upstream))

        code, checks = doctor(env)

    gateway = checks["gateway"]
    assert code == 1 and gateway["status"] == "FAIL"
    assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in gateway["detail"]
    assert "lore run" not in gateway["fix"]
    assert f"set LORE_PORT or --port to a free port (for example LORE_PORT={port + 1})" \
        == gateway["fix"]


def test_a_read_only_data_dir_keeps_its_intact_database(fake_upstream: FakeUpstream,
                                                        tmp_path: Path):
    data = tmp_path / "data"
    memory = Memory.open(Settings(data_dir=data, embeddings=False), embedder=None)
    memory.close()
    make_read_only(data)
    try:
        code, checks = doctor(lore_env(tmp_path, **upstreams_on(fake_upstream)),
                              prefix=without_root_powers())
    finally:
        make_writable(data)

    assert code == 1
    assert checks["data dir"]["status"] == "FAIL"
    assert f"the data dir {data} is read-only" in checks["data dir"]["detail"]
    assert "set LORE_DATA_DIR to a writable directory" in checks["data dir"]["fix"]
    database = checks["database"]
    assert database["status"] == "ok", database
    assert "integrity ok" in database["detail"] and "checked read-only" in database["detail"]
    assert "aside" not in json.dumps(checks)


def test_an_upstream_url_without_a_scheme(fake_upstream: FakeUpstream, tmp_path: Path):
    bare = fake_upstream.url.removeprefix("http://")
    env = lore_env(tmp_path, **upstreams_on(fake_upstream) | {"LORE_UPSTREAM_OPENAI": bare})

    code, checks = doctor(env)

    openai = checks["upstream openai"]
    assert code == 1 and openai["status"] == "FAIL"
    assert openai["detail"] == (f"LORE_UPSTREAM_OPENAI={bare}: must be a URL starting with "
                                f"https:// or http://, such as https://{bare}")
    assert openai["fix"].startswith("set LORE_UPSTREAM_OPENAI to a valid value")
    # The other upstreams are still probed.
    assert checks["upstream anthropic"]["status"] == "ok"


def test_a_broken_config_file_is_a_failed_check_not_a_stop(fake_upstream: FakeUpstream,
                                                           tmp_path: Path):
    config = tmp_path / "config" / "lore" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("port = [\n")

    code, checks = doctor(lore_env(tmp_path, **upstreams_on(fake_upstream)))

    assert code == 1
    assert checks["settings"]["status"] == "FAIL"
    assert checks["settings"]["detail"].startswith(f"config file {config} is not valid TOML")
    assert checks["data dir"]["status"] == "ok"  # the other checks still ran
