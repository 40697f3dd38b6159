"""Who the memory browser lets in (ui/auth.py), without a browser."""

from __future__ import annotations

from pathlib import Path

from lore_gateway.config import Settings
from lore_gateway.memory.tenancy.identity import PERSONAL
from lore_gateway.ui.auth import COOKIE, Access


def _scope(client: str, host: str, cookie: str = "") -> dict[str, object]:
    headers = [(b"host", host.encode())]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return {"client": (client, 50000), "headers": headers}


def test_personal_loopback_answers_this_machine_only(tmp_path: Path) -> None:
    access = Access(Settings(data_dir=tmp_path), None)
    assert not access.needs_sign_in
    assert access.viewer(_scope("127.0.0.1", "127.0.0.1:3207")) is not None
    assert access.viewer(_scope("127.0.0.1", "localhost:3207")).tenant == PERSONAL  # type: ignore[union-attr]
    # A page elsewhere that rebinds its own name to 127.0.0.1 sends its own Host.
    assert access.viewer(_scope("127.0.0.1", "evil.example:3207")) is None
    assert access.viewer(_scope("10.0.0.7", "127.0.0.1:3207")) is None


def test_a_non_loopback_bind_or_team_mode_needs_a_signed_cookie(tmp_path: Path) -> None:
    wide = Access(Settings(data_dir=tmp_path, host="0.0.0.0"), None)
    team = Access(Settings(data_dir=tmp_path, tenancy="keys"), None)
    for access in (wide, team):
        assert access.needs_sign_in
        assert access.viewer(_scope("127.0.0.1", "127.0.0.1:3207")) is None
        cookie = f"{COOKIE}={access.cookie_value('alice')}"
        viewer = access.viewer(_scope("10.0.0.7", "gw:3207", cookie))
        assert viewer is not None and viewer.tenant == "alice" and viewer.signed_in
        forged = cookie.replace("YWxpY2U", "Ym9i")  # base64 of "alice" -> "bob"
        assert access.viewer(_scope("10.0.0.7", "gw:3207", forged)) is None
        expired = f"{COOKIE}={access.cookie_value('alice', now=0)}"
        assert access.viewer(_scope("10.0.0.7", "gw:3207", expired)) is None
    # Another gateway's cookie (another secret) opens nothing here.
    assert team.viewer(_scope("10.0.0.7", "gw:3207",
                              f"{COOKIE}={wide.cookie_value('alice')}")) is None
    assert wide.sign_in("") is None
