"""The config file: where it lives, what it sets, and that env and flags override it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from clikit import LORE_TIMEOUT_S, lore, lore_env
from opskit import free_port

from lore_gateway.config import Settings
from lore_gateway.obs.status import is_loopback


def write_config(root: Path, text: str) -> Path:
    path = root / "config" / "lore" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def show(env: dict[str, str]) -> dict[str, dict[str, object]]:
    result = lore(env, "config", "show", "--json")
    assert result.returncode == 0, result.stderr
    settings: dict[str, dict[str, object]] = json.loads(result.stdout)["settings"]
    return settings


def test_config_path_follows_xdg_and_lore_config(tmp_path: Path):
    env = lore_env(tmp_path)
    assert lore(env, "config", "path").stdout == f"{tmp_path}/config/lore/config.toml\n"
    env.pop("XDG_CONFIG_HOME")
    assert lore(env, "config", "path").stdout == f"{tmp_path}/home/.config/lore/config.toml\n"
    env["LORE_CONFIG"] = str(tmp_path / "elsewhere.toml")
    assert lore(env, "config", "path").stdout == f"{tmp_path}/elsewhere.toml\n"


def test_file_then_environment_then_flag(tmp_path: Path):
    file_port, env_port, flag_port = free_port(), free_port(), free_port()
    path = write_config(tmp_path, f'port = {file_port}\nlog_level = "warning"\nrecall = false\n')
    env = lore_env(tmp_path)

    settings = show(env)
    assert settings["port"] == {"value": file_port, "env": "LORE_PORT",
                                "source": f"file {path}"}
    assert settings["recall"]["value"] is False
    assert settings["host"]["source"] == "default"

    env["LORE_PORT"] = str(env_port)
    settings = show(env)
    assert settings["port"] == {"value": env_port, "env": "LORE_PORT", "source": "env LORE_PORT"}
    assert settings["log_level"] == {"value": "warning", "env": "LORE_LOG_LEVEL",
                                     "source": f"file {path}"}

    serve = subprocess.Popen([sys.executable, "-m", "lore_gateway", "serve", "--port",
                              str(flag_port)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stderr is not None
        banner = ""
        while "listening on" not in banner:
            line = serve.stderr.readline()
            assert line, "lore serve exited before listening"
            banner += line
        assert re.search(rf"listening on http://127\.0\.0\.1:{flag_port}\b", banner)
        # The file's recall = false reached the gateway too.
        while "memory " not in banner:
            banner += serve.stderr.readline()
        assert "recall off" in banner
    finally:
        serve.terminate()
        serve.wait(timeout=LORE_TIMEOUT_S)


def test_config_show_lists_every_setting_as_plain_lines_when_piped(tmp_path: Path):
    result = lore(lore_env(tmp_path), "config", "show")
    lines = result.stdout.splitlines()
    assert lines[0] == f"config file: {tmp_path}/config/lore/config.toml (absent)"
    assert lines[1] == "setting\tvalue\tfrom"
    names = [line.split("\t")[0] for line in lines[2:]]
    assert names == list(Settings.model_fields)
    assert f"data_dir\t{tmp_path}/data\tenv LORE_DATA_DIR" in lines


def test_status_route_refuses_other_hosts():
    assert is_loopback({"client": ("127.0.0.1", 5000)})
    assert is_loopback({"client": ("::1", 5000)})
    assert not is_loopback({"client": ("192.168.1.20", 5000)})
    assert not is_loopback({})


def test_a_home_relative_data_dir_is_expanded(tmp_path: Path):
    write_config(tmp_path, 'data_dir = "~/memory"\n')
    env = lore_env(tmp_path)
    env.pop("LORE_DATA_DIR")
    assert show(env)["data_dir"]["value"] == f"{tmp_path}/home/memory"
