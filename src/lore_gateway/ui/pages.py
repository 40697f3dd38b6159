"""The pages of the memory browser: one method per page, each a template and its data.

Every read takes the viewer's tenant (``queries`` filters on it), so a page asked
for by URL shows only that tenant's rows, or "not found". Database work runs on
a thread; searches go through ``Memory.search``, the very search ``recall`` runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

import jinja2
import orjson
from markupsafe import Markup, escape

from lore_gateway import __version__
from lore_gateway.config import Settings
from lore_gateway.memory.data.amnesia import AmnesiaSwitch
from lore_gateway.memory.store.records import Identity
from lore_gateway.obs import status as status_doc
from lore_gateway.storage.base import Connection, in_tenant
from lore_gateway.ui import amnesia_view, queries, samples
from lore_gateway.ui.auth import Access, Viewer
from lore_gateway.ui.http import NotFound, Request
from lore_gateway.ui.search_view import Explained, explain

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

T = TypeVar("T")

NAV = (("overview", "/ui", "Overview"), ("projects", "/ui/projects", "Projects"),
       ("search", "/ui/search", "Search"), ("recalls", "/ui/recalls", "Recall log"),
       ("knowledge", "/ui/knowledge", "Knowledge"), ("status", "/ui/status", "Status"))
SEARCH_LIMIT = 20
# Status fields a signed-in (team) viewer does not see: paths and every tenant's totals.
_PRIVATE_STATUS = ("data_dir", "database", "storage", "upstreams", "settings_problems",
                   "amnesia")


def _ago(ts: float | None) -> str:
    if not ts:
        return "never"
    seconds = max(0.0, time.time() - ts)
    if seconds < 60:
        return "just now"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


def _when(ts: float | None) -> str:
    if not ts:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _number(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def _link_refs(text: str) -> Markup:
    """Text with every ``t:<id>`` turned into a link to that message."""
    out, last = [], 0
    for found in queries.REF.finditer(text):
        out.append(escape(text[last:found.start()]))
        out.append(Markup('<a href="/ui/message?id={0}">t:{0}</a>').format(found.group(1)))
        last = found.end()
    out.append(escape(text[last:]))
    return Markup("").join(out)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("lore_gateway.ui", "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(ago=_ago, when=_when, number=_number, link_refs=_link_refs,
                       short=lambda s, n=12: s if len(s) <= n else s[:n] + "…",
                       query=lambda d: urlencode({k: v for k, v in d.items() if v}))
    env.globals.update(nav=NAV, version=__version__)
    return env


class Pages:
    def __init__(self, settings: Settings, memory: Memory | None, live: status_doc.Live | None,
                 sampler: samples.Sampler | None, access: Access,
                 amnesia: AmnesiaSwitch | None = None) -> None:
        self.settings = settings
        self.memory = memory
        # The running gateway's amnesia switch: a change here applies at once.
        self.amnesia = amnesia
        self.live = live
        self.sampler = sampler
        self.access = access
        self.env = environment()

    # --- plumbing ---------------------------------------------------------------------

    def render(self, template: str, viewer: Viewer | None, **values: Any) -> bytes:
        page = self.env.get_template(template)
        return page.render(viewer=viewer, team=self.access.team,
                           csrf=self.access.form_token(viewer) if viewer else "",
                           **values).encode()

    def _memory(self) -> Memory:
        """The memory every page but the status page reads (``get`` and ``post``
        answer a gateway without one before they reach a page)."""
        if self.memory is None:
            raise NotFound("Memory is off on this gateway", "Set LORE_STORE=true.")
        return self.memory

    async def _read(self, viewer: Viewer, query: Callable[[Connection], T]) -> T:
        """``query`` on the memory's reader; in team mode inside the viewer's tenant
        scope (on Postgres, row-level security: the viewer's rows only)."""
        return await asyncio.to_thread(
            self._memory().read, in_tenant(viewer.tenant, query) if self.access.team else query)

    def error_page(self, status: int, title: str, hint: str = "",
                   viewer: Viewer | None = None) -> bytes:
        return self.render("error.html", viewer, active="", status=status, title=title,
                           hint=hint)

    def sign_in_page(self, problem: str, team: bool) -> bytes:
        return self.render("sign_in.html", None, active="", problem=problem, team_mode=team)

    async def get(self, request: Request, viewer: Viewer) -> tuple[int, bytes, str]:
        path = request.path.rstrip("/") or "/ui"
        if path == "/ui/status":
            return 200, await self.status(request, viewer), "text/html"
        if self.memory is None:
            return 200, self.render("no_memory.html", viewer, active=""), "text/html"
        handler = {
            "/ui": self.overview, "/ui/projects": self.projects, "/ui/sessions": self.sessions,
            "/ui/session": self.session, "/ui/message": self.message, "/ui/search": self.search,
            "/ui/recalls": self.recalls, "/ui/recall": self.recall,
            "/ui/knowledge": self.knowledge, "/ui/knowledge/edit": self.knowledge_edit,
        }.get(path)
        if path == "/ui/series":
            window = samples.WINDOWS.get(request.arg("window"), samples.WINDOWS["1h"])
            tenant = self.chart_tenant(viewer)
            data = await self._read(viewer, lambda c: samples.series_for(c, tenant, window))
            return 200, orjson.dumps(data), "application/json"
        if handler is None:
            raise NotFound(f"There is no page {request.path}", "The menu lists every page.")
        return 200, await handler(request, viewer), "text/html"

    async def post(self, request: Request, viewer: Viewer, form: dict[str, str]) -> str:
        """Run a form and return where the browser goes next."""
        from lore_gateway.ui import knowledge_view

        if self.memory is None:
            raise NotFound("Memory is off on this gateway", "Set LORE_STORE=true.")
        if request.path == "/ui/knowledge/save":
            return await asyncio.to_thread(knowledge_view.save, self.memory, self.settings,
                                           viewer.tenant, form)
        if request.path == "/ui/knowledge/delete":
            return await asyncio.to_thread(knowledge_view.delete, self.memory, self.settings,
                                           viewer.tenant, form.get("id", ""))
        if request.path == "/ui/amnesia":
            return await asyncio.to_thread(amnesia_view.toggle, self.memory, self.amnesia,
                                           viewer, self.access.team, form)
        raise NotFound(f"There is no form {request.path}")

    def chart_tenant(self, viewer: Viewer) -> str | None:
        """Whose traffic the charts show: in team mode a member's own (from their
        memory), else the gateway's counters (all of it is the one user's)."""
        return viewer.tenant if self.access.team else None

    # --- pages ------------------------------------------------------------------------

    async def overview(self, request: Request, viewer: Viewer) -> bytes:
        window = request.arg("window", "1h")
        if window not in samples.WINDOWS:
            window = "1h"
        seconds = samples.WINDOWS[window]
        tenant = self.chart_tenant(viewer)
        data, counts = await self._read(viewer, lambda c: (samples.series_for(c, tenant, seconds),
                                                   queries.counts(c, viewer.tenant)))
        return self.render("overview.html", viewer, active="overview", window=window,
                           windows=list(samples.WINDOWS), series=data,
                           series_json=orjson.dumps(data).decode(), counts=counts,
                           interval=self.settings.ui_sample_seconds)

    async def projects(self, request: Request, viewer: Viewer) -> bytes:
        rows = await self._read(viewer, lambda c: queries.projects(c, viewer.tenant))
        return self.render("projects.html", viewer, active="projects", projects=rows)

    async def sessions(self, request: Request, viewer: Viewer) -> bytes:
        project = request.arg("project") or None
        page = request.int_arg("page")
        rows = await self._read(viewer, lambda c: queries.sessions(
            c, viewer.tenant, project, offset=page * queries.PAGE_SIZE))
        return self.render("sessions.html", viewer, active="projects", project=project,
                           sessions=rows, page=page, more=len(rows) == queries.PAGE_SIZE)

    async def session(self, request: Request, viewer: Viewer) -> bytes:
        session = request.arg("id")
        page = request.int_arg("page")

        def read(conn: Connection) -> tuple[queries.SessionRow | None, list[queries.Turn],
                                            amnesia_view.AmnesiaState]:
            return (queries.session_info(conn, viewer.tenant, session),
                    queries.session_turns(conn, viewer.tenant, session,
                                          offset=page * queries.TURNS_PER_PAGE),
                    amnesia_view.state(conn, viewer, self.access.team, session))

        info, turns, forgetting = await self._read(viewer, read)
        if info is None:
            raise NotFound(f"No session {session!r} in your memory",
                           "Projects lists the sessions stored for you.")
        template = "_turns.html" if request.arg("part") == "turns" else "session.html"
        return self.render(template, viewer, active="projects", info=info, turns=turns,
                           page=page, more=len(turns) == queries.TURNS_PER_PAGE,
                           first=page * queries.TURNS_PER_PAGE, amnesia=forgetting)

    async def message(self, request: Request, viewer: Viewer) -> bytes:
        raw = request.arg("id").removeprefix("t:")
        found = await self._read(viewer, lambda c: queries.message(c, viewer.tenant, int(raw))
                                 if raw.isdigit() else None)
        if found is None:
            raise NotFound(f"No message t:{raw} in your memory")
        session, shown, created = found
        return self.render("message.html", viewer, active="search", session=session,
                           message=shown, created=created)

    async def search(self, request: Request, viewer: Viewer) -> bytes:
        q = request.arg("q").strip()[:500]
        scope = request.arg("scope", "all")
        scope = scope if scope in ("all", "project") else "all"
        project = request.arg("project")
        projects = await self._read(viewer, lambda c: queries.projects(c, viewer.tenant))
        results: list[Explained] = []
        total = 0
        if q:
            if scope == "project" and not project:
                scope = "all"
            ident = Identity(viewer.tenant, project or "", "")
            found = await self._memory().search(q, identity=ident, scope=scope, limit=SEARCH_LIMIT)
            total = found.total
            results = await self._read(viewer, lambda c: [explain(c, viewer.tenant, q, hit)
                                                  for hit in found.hits])
        template = "_results.html" if request.wants_fragment else "search.html"
        return self.render(template, viewer, active="search", q=q, scope=scope,
                           project=project, projects=projects, results=results, total=total)

    async def recalls(self, request: Request, viewer: Viewer) -> bytes:
        page = request.int_arg("page")
        rows = await self._read(viewer, lambda c: queries.recalls(
            c, viewer.tenant, offset=page * queries.PAGE_SIZE))
        return self.render("recalls.html", viewer, active="recalls", recalls=rows, page=page,
                           more=len(rows) == queries.PAGE_SIZE)

    async def recall(self, request: Request, viewer: Viewer) -> bytes:
        anchor = request.arg("id")

        def read(conn: Connection) -> tuple[queries.Recall | None, int]:
            item = queries.recall(conn, viewer.tenant, anchor)
            offset = (queries.turn_offset(conn, viewer.tenant, item.session, item.turn_id)
                      if item is not None and item.turn_id is not None else 0)
            return item, offset // queries.TURNS_PER_PAGE

        item, page = await self._read(viewer, read)
        if item is None:
            raise NotFound(f"No recall {anchor!r} in your memory",
                           "The recall log lists every recall of yours.")
        return self.render("recall.html", viewer, active="recalls", recall=item,
                           session_page=page)

    async def knowledge(self, request: Request, viewer: Viewer) -> bytes:
        from lore_gateway.ui import knowledge_view

        project = request.arg("project") or None
        data = await self._read(viewer, lambda c: knowledge_view.listing(c, viewer.tenant, project))
        return self.render("knowledge.html", viewer, active="knowledge", project=project,
                           saved=request.arg("saved"), **data)

    async def knowledge_edit(self, request: Request, viewer: Viewer) -> bytes:
        from lore_gateway.ui import knowledge_view

        entry_id = request.arg("id")
        entry = None
        changes: list[dict[str, Any]] = []
        if entry_id:
            entry = await self._read(viewer, lambda c: knowledge_view.entry(
                c, viewer.tenant, entry_id))
            if entry is None:
                raise NotFound(f"No knowledge entry {entry_id!r} in your memory")
            changes = await self._read(viewer, lambda c: knowledge_view.changes(
                c, viewer.tenant, entry.id))
        return self.render("knowledge_edit.html", viewer, active="knowledge", entry=entry,
                           changes=changes, max_versions=knowledge_view.MAX_VERSIONS,
                           project=request.arg("project"), problem=request.arg("problem"),
                           categories=knowledge_view.categories())

    async def status(self, request: Request, viewer: Viewer) -> bytes:
        server = request.scope.get("server")
        if server and self.live is not None and not self.live.listen:
            host = f"[{server[0]}]" if ":" in str(server[0]) else server[0]
            self.live.listen = f"http://{host}:{server[1]}"
        document = await asyncio.to_thread(status_doc.snapshot, self.settings, self.live)
        forgetting = None
        if self.memory is not None:
            forgetting = await self._read(viewer, lambda c: amnesia_view.state(
                c, viewer, self.access.team))
        if viewer.signed_in:
            document = {k: v for k, v in document.items() if k not in _PRIVATE_STATUS}
            if self.memory is not None:
                document["your memory"] = await self._read(viewer,
                    lambda c: queries.counts(c, viewer.tenant))
        return self.render("status.html", viewer, active="status", document=document,
                           amnesia=forgetting,
                           document_json=orjson.dumps(document, option=orjson.OPT_INDENT_2)
                           .decode())

