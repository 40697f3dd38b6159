"""`lore setup opencode`: the providers' base URLs merged into opencode.json or
opencode.jsonc as text (comments, other providers and layout kept), `--undo` byte
for byte, a merge when the user edited since, `lore uninstall`, and `lore run
opencode`'s inline config (issue 35)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lore_gateway.agents import jsonc, opencode
from lore_gateway.agents.codex import SetupConflict
from lore_gateway.cli import setup as _setup_cli  # noqa: F401  (attaches the command)
from lore_gateway.cli import uninstall as _uninstall_cli  # noqa: F401
from lore_gateway.cli.main import app

GATEWAY = "http://127.0.0.1:43210"
BASE_URL = GATEWAY + "/v1"

PLAIN = b"""{
  "$schema": "https://opencode.ai/config.json",
  "model": "anthropic/claude-sonnet-4-5",
  "provider": {
    "openrouter": {"options": {"baseURL": "https://openrouter.ai/api/v1"}},
    "anthropic": {"models": {"claude-sonnet-4-5": {"name": "Sonnet"}}}
  }
}
"""

WITH_COMMENTS = b"""// my OpenCode settings
{
  "$schema": "https://opencode.ai/config.json", // the schema
  /* the providers
     I use */
  "provider": {
    "openai": {
      "options": {
        "baseURL": "https://corp-proxy.example/v1", // through the proxy
        "timeout": 600000,
      },
    },
  },
  "share": "disabled", // never share
}
"""


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


def config_file(env: dict[str, str], name: str = "opencode.json") -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "opencode" / name


def base_urls(path: Path) -> dict[str, object]:
    providers = jsonc.loads(path.read_text())["provider"]
    return {p: providers[p]["options"]["baseURL"] for p in opencode.PROVIDERS}


# --- the CLI: setup, undo, status, print, uninstall -----------------------------------


@pytest.mark.parametrize("name,original", [
    ("opencode.json", PLAIN), ("opencode.json", None), ("opencode.jsonc", WITH_COMMENTS),
    ("opencode.json", WITH_COMMENTS.replace(b"\n", b"\r\n")), ("opencode.json", b"{}"),
])
def test_setup_then_undo_is_byte_identical(env: dict[str, str], name: str,
                                           original: bytes | None) -> None:
    path = config_file(env, name)
    if original is not None:
        path.parent.mkdir(parents=True)
        path.write_bytes(original)

    code, out = lore(env, "setup", "opencode")
    assert code == 0, out
    assert str(path) in out.replace("\n", "")
    assert base_urls(path) == {"anthropic": BASE_URL, "openai": BASE_URL}
    written = path.read_bytes()
    if original is not None and original.strip() != b"{}":
        data = jsonc.loads(path.read_text())
        assert data["$schema"] == "https://opencode.ai/config.json"
        # Every comment is still there, and CRLF files stay CRLF.
        for line in original.splitlines():
            if b"//" in line and b"http" not in line:
                assert line.split(b"//")[1] in written
        assert (b"\r\n" in written) == (b"\r\n" in original)
    if original == PLAIN:
        providers = jsonc.loads(path.read_text())["provider"]
        assert providers["openrouter"] == {"options": {"baseURL": "https://openrouter.ai/api/v1"}}
        assert providers["anthropic"]["models"] == {"claude-sonnet-4-5": {"name": "Sonnet"}}
    if original == WITH_COMMENTS:
        options = jsonc.loads(path.read_text())["provider"]["openai"]["options"]
        assert options == {"baseURL": BASE_URL, "timeout": 600000}

    code, out = lore(env, "setup", "--status", "--json")
    assert code == 0
    status = json.loads(out)["agents"]["opencode"]
    assert status == {"config": str(path), "exists": True, "set_up_by_lore": True,
                      "points_at_gateway": True}

    code, out = lore(env, "setup", "--undo", "opencode")
    assert code == 0, out
    if original is None:
        assert not path.exists()
    else:
        assert path.read_bytes() == original


def test_the_jsonc_file_is_the_one_edited_when_it_exists(env: dict[str, str]) -> None:
    folder = config_file(env).parent
    folder.mkdir(parents=True)
    (folder / "opencode.json").write_bytes(PLAIN)
    (folder / "opencode.jsonc").write_bytes(WITH_COMMENTS)
    assert lore(env, "setup", "opencode")[0] == 0
    assert (folder / "opencode.json").read_bytes() == PLAIN  # OpenCode reads .jsonc last
    assert base_urls(folder / "opencode.jsonc")["openai"] == BASE_URL


def test_undo_keeps_later_user_edits_and_comments(env: dict[str, str]) -> None:
    path = config_file(env, "opencode.jsonc")
    path.parent.mkdir(parents=True)
    path.write_bytes(WITH_COMMENTS)
    assert lore(env, "setup", "opencode")[0] == 0
    edited = path.read_text().replace(
        '"share": "disabled", // never share',
        '"share": "manual", // changed my mind\n  "theme": "tokyonight",')
    path.write_text(edited)

    code, out = lore(env, "setup", "--undo", "opencode")
    assert code == 0, out
    assert "keeping your later edits" in out
    text = path.read_text()
    assert "// changed my mind" in text and "/* the providers" in text
    assert jsonc.loads(text) == {**jsonc.loads(WITH_COMMENTS.decode()), "share": "manual",
                                 "theme": "tokyonight"}
    # The user's proxy is back as it was written, comment included.
    assert '"baseURL": "https://corp-proxy.example/v1", // through the proxy' in text


def test_undo_refuses_when_lores_base_url_was_edited(env: dict[str, str]) -> None:
    path = config_file(env)
    assert lore(env, "setup", "opencode")[0] == 0
    edited = path.read_text().replace(BASE_URL, "http://127.0.0.1:9999/v1", 1)
    path.write_text(edited)
    code, out = lore(env, "setup", "--undo", "opencode")
    assert code == 1
    assert "cannot be taken out safely" in out and "is no longer what lore wrote" in out
    assert path.read_text() == edited  # nothing was written


def test_setup_refuses_invalid_jsonc_and_writes_nothing(env: dict[str, str]) -> None:
    path = config_file(env)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"provider": {"anthropic": } /* unclosed')
    code, out = lore(env, "setup", "opencode")
    assert code == 1
    assert "not valid JSON or JSONC" in out and "line 1" in out
    assert path.read_bytes() == b'{"provider": {"anthropic": } /* unclosed'
    assert not (Path(env["LORE_DATA_DIR"]) / "setup" / "opencode").exists()


def test_setup_refuses_a_provider_that_is_not_an_object(env: dict[str, str]) -> None:
    path = config_file(env)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"provider": {"openai": "nope"}}')
    code, out = lore(env, "setup", "opencode")
    assert code == 1 and '"provider.openai" is not an object' in out


def test_team_mode_adds_the_gateway_key_header_and_print_shows_the_config(
        env: dict[str, str]) -> None:
    team = env | {"LORE_TENANCY": "keys", "LORE_KEY": "lore_k_team-key-opencode"}
    code, out = lore(team, "setup", "--print", "opencode")
    assert code == 0, out
    printed = json.loads(out)
    assert printed == opencode.provider_config(GATEWAY, "lore_k_team-key-opencode")
    assert printed["provider"]["anthropic"]["options"] == {
        "baseURL": BASE_URL, "headers": {"X-Lore-Key": "lore_k_team-key-opencode"}}
    assert not config_file(env).exists()  # --print writes nothing

    path = config_file(env)
    path.parent.mkdir(parents=True)
    path.write_bytes(PLAIN)
    assert lore(team, "setup", "opencode")[0] == 0
    providers = jsonc.loads(path.read_text())["provider"]
    assert providers["openai"]["options"]["headers"] == {"X-Lore-Key": "lore_k_team-key-opencode"}
    assert lore(team, "setup", "--undo", "opencode")[0] == 0
    assert path.read_bytes() == PLAIN


def test_uninstall_undoes_opencode(env: dict[str, str]) -> None:
    path = config_file(env, "opencode.jsonc")
    path.parent.mkdir(parents=True)
    path.write_bytes(WITH_COMMENTS)
    assert lore(env, "setup", "opencode")[0] == 0
    code, out = lore(env, "uninstall", "--dry-run")
    assert code == 0, out
    assert f"opencode: restore {path} byte for byte from its backup" in out.replace("\n  ", " ")
    code, out = lore(env, "uninstall", "--yes")
    assert code == 0, out
    assert path.read_bytes() == WITH_COMMENTS


# --- the pure parts ---------------------------------------------------------------------


def test_jsonc_parse_reads_comments_trailing_commas_and_slashes_in_strings() -> None:
    text = '{"a": "http://x//y", /* c */ "b": [1, 2.5e1, true, null,], "c": "\\"//",}'
    assert jsonc.loads(text) == {"a": "http://x//y", "b": [1, 25.0, True, None], "c": '"//'}
    for bad, where in (('{"a": 1', "line 1"), ('{"a": 1} x', "after the value"),
                       ('{\n  "a": /* open', "unterminated comment"), ('["a\n"]', "string")):
        with pytest.raises(jsonc.JsoncError, match=where):
            jsonc.parse(bad)


def test_jsonc_set_then_delete_restores_one_line_and_nested_objects() -> None:
    for text in ('{"model": "x"}', '{\n\t"a": {\n\t\t"b": 1\n\t}\n}\n', '{ // top\n  "a": 1\n}'):
        new, where, previous = jsonc.set_member(text, ["provider", "openai", "baseURL"], "u")
        assert where == ["provider"] and previous is None
        assert jsonc.loads(new)["provider"] == {"openai": {"baseURL": "u"}}
        assert jsonc.delete_member(new, where) == text
    new, where, previous = jsonc.set_member('{"a": {"b": 1, "c": 2}}', ["a", "c"], [3])
    assert (new, where, previous) == ('{"a": {"b": 1, "c": [\n  3\n]}}', ["a", "c"], "2")
    assert jsonc.replace_value(new, where, "2") == '{"a": {"b": 1, "c": 2}}'


def test_apply_records_steps_that_revert_in_reverse() -> None:
    text, edit = opencode.apply_setup(PLAIN.decode(), GATEWAY)
    assert [s.path for s in edit.steps] == [("provider", "anthropic", "options"),
                                           ("provider", "openai")]
    restored = opencode.ConfigEdit.from_json(json.loads(json.dumps(edit.to_json())))
    assert opencode.revert_setup(text, restored) == PLAIN.decode()
    assert opencode.points_at_gateway(text, GATEWAY)
    assert not opencode.points_at_gateway(PLAIN.decode(), GATEWAY)
    with pytest.raises(SetupConflict, match="no longer what lore wrote"):
        opencode.revert_setup(text.replace(BASE_URL, "http://other/v1"), restored)


def test_run_env_merges_into_the_users_inline_config() -> None:
    user = {"OPENCODE_CONFIG_CONTENT": '{"model": "openai/gpt-5", // mine\n'
                                       ' "provider": {"openai": {"options": {"timeout": 5}}}}'}
    added = opencode.run_env(GATEWAY, "/srv/shop", user, "lore_k_key")
    config = json.loads(added["OPENCODE_CONFIG_CONTENT"])
    assert config["model"] == "openai/gpt-5"
    assert config["provider"]["openai"]["options"] == {
        "timeout": 5, "baseURL": BASE_URL,
        "headers": {"X-Lore-Project": "/srv/shop", "X-Lore-Key": "lore_k_key"}}
    assert config["provider"]["anthropic"]["options"]["baseURL"] == BASE_URL
    assert json.loads(opencode.run_env(GATEWAY, None, {})["OPENCODE_CONFIG_CONTENT"]) == \
        opencode.provider_config(GATEWAY)
    for bad in ("{", "[1]"):
        with pytest.raises(jsonc.JsoncError, match="OPENCODE_CONFIG_CONTENT"):
            opencode.run_env(GATEWAY, None, {"OPENCODE_CONFIG_CONTENT": bad})
