"""The amnesia switch in ``/ui``: for every session on the Status page, for one
session on its page (``memory/data/amnesia.py``; the same rows as ``lore amnesia``).

"Every session" is the gateway in personal mode and the viewer's own sessions in
team mode: a member never switches anyone else's memory. A change is written
through the memory writer and applied to the running gateway at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from lore_gateway.memory.data import amnesia
from lore_gateway.memory.data.amnesia import Amnesia, AmnesiaSwitch
from lore_gateway.storage.base import Connection
from lore_gateway.ui.auth import Viewer

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory


@dataclass(frozen=True, slots=True)
class AmnesiaState:
    """What a page shows: the wide row the viewer can switch, the session's own
    row (on a session page), and the row that covers the session whatever it is."""

    wide: Amnesia | None
    own: Amnesia | None
    covering: Amnesia | None


def _wide(viewer: Viewer, team: bool) -> tuple[amnesia.Scope, str | None]:
    return ("tenant", viewer.tenant) if team else ("all", None)


def state(conn: Connection, viewer: Viewer, team: bool, session: str | None = None) -> AmnesiaState:
    rows = amnesia.entries(conn)
    scope, tenant = _wide(viewer, team)
    wide_key = amnesia.key_of(scope, tenant, None)
    wide = next((a for a in rows if a.key == wide_key), None)
    if session is None:
        return AmnesiaState(wide, None, wide)
    own_key = amnesia.key_of("session", viewer.tenant, session)
    own = next((a for a in rows if a.key == own_key), None)
    return AmnesiaState(wide, own, amnesia.covering(rows, viewer.tenant, session))


def toggle(memory: Memory, switch: AmnesiaSwitch | None, viewer: Viewer, team: bool,
           form: dict[str, str]) -> str:
    """Turn amnesia on or off from a form; where the browser goes next. Blocking."""
    on = form.get("state") == "on"
    session = form.get("session", "").strip()
    if session:
        scope: amnesia.Scope = "session"
        tenant: str | None = viewer.tenant
    else:
        scope, tenant = _wide(viewer, team)

    def change(conn: Connection) -> None:
        if on:
            amnesia.turn_on(conn, scope, tenant, session or None, by="ui")
        else:
            amnesia.turn_off(conn, scope, tenant, session or None)

    memory.write_job(change)
    if switch is not None:
        switch.reload()
    if session:
        return "/ui/session?" + urlencode({"id": session})
    return "/ui/status"
