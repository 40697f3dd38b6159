"""``/ui``: the memory browser, served by the gateway on its own port.

``UiApp`` is what ``app.GatewayApp`` hands every ``/ui`` request to. It checks who
is asking (``auth.Access``), then runs one page of ``pages.Pages`` or one live
stream of ``live.Streams``; static files (our CSS and JS, vendored htmx and
uPlot) come from the package, so the browser needs nothing but the gateway.

Pages only read the database (on a thread, never on the event loop) and write
through the memory writer, so every page works with no agent running and while
traffic flows.
"""

from __future__ import annotations

import asyncio
import logging
import re
from importlib import resources
from typing import TYPE_CHECKING, Any

from lore_gateway.channel import Receive, Send
from lore_gateway.config import Settings
from lore_gateway.ui import http
from lore_gateway.ui.auth import COOKIE, SESSION_SECONDS, Access, Viewer
from lore_gateway.ui.http import NotFound
from lore_gateway.ui.live import Streams
from lore_gateway.ui.samples import Sampler

if TYPE_CHECKING:
    from lore_gateway.memory.data.amnesia import AmnesiaSwitch
    from lore_gateway.memory.service import Memory
    from lore_gateway.obs.status import Live
    from lore_gateway.ui.pages import Pages

log = logging.getLogger("lore.ui")

_STATIC = re.compile(r"^/ui/static/([A-Za-z0-9_.-]+)$")
_TYPES = {".js": "text/javascript", ".css": "text/css", ".md": "text/plain"}


class UiApp:
    def __init__(self, settings: Settings, memory: Memory | None, live: Live | None,
                 amnesia: AmnesiaSwitch | None = None) -> None:
        self.settings = settings
        self.memory = memory
        self.amnesia = amnesia
        self.access = Access(settings, memory)
        self.sampler: Sampler | None = None
        if memory is not None:
            self.sampler = Sampler(memory.write_job, settings.ui_sample_seconds)
        self._live = live
        self._pages: Pages | None = None
        self.streams = Streams(memory, self.sampler, team=self.access.team)
        self._static: dict[str, bytes] = {}

    @property
    def pages(self) -> Pages:
        """The pages, built when the first one is asked for: they import jinja2
        (1.8 MiB of RSS a gateway whose /ui nobody opens need not hold)."""
        if self._pages is None:
            from lore_gateway.ui.pages import Pages

            self._pages = Pages(self.settings, self.memory, self._live, self.sampler,
                                self.access, self.amnesia)
        return self._pages

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        request = http.Request.from_scope(scope)
        path = request.path.rstrip("/") or "/"
        static = _STATIC.match(path)
        if static:
            await self._serve_static(send, static.group(1))
            return
        if path == "/ui/sign-in":
            await self._sign_in(request, receive, send)
            return
        viewer = self.access.viewer(scope)
        if viewer is None:
            if self.access.needs_sign_in:
                await http.redirect(send, "/ui/sign-in")
            else:
                await http.respond(send, 403, self.pages.error_page(
                    403, "The memory browser answers this machine only",
                    "Open it on the gateway's machine (http://127.0.0.1:"
                    f"{scope.get('server', ('', self.settings.port))[1]}/ui), or run the "
                    "gateway in team mode and sign in with a gateway key."))
            return
        try:
            if request.method == "POST":
                await self._post(request, viewer, receive, send)
            elif path.startswith("/ui/events/"):
                await self.streams.serve(request, viewer, receive, send)
            elif request.method in ("GET", "HEAD"):
                status, body, kind = await self.pages.get(request, viewer)
                await http.respond(send, status, body, kind)
            else:
                await http.respond(send, 405, b"method not allowed", "text/plain")
        except NotFound as exc:
            await http.respond(send, 404, self.pages.error_page(404, str(exc), exc.hint,
                                                                viewer))
        except http.FormTooLarge:
            await http.respond(send, 413, self.pages.error_page(
                413, "That form is too large", "Entries are a few KiB at most.", viewer))

    async def _post(self, request: http.Request, viewer: Viewer, receive: Receive,
                    send: Send) -> None:
        form = await http.read_form(receive)
        if not self.access.form_token_ok(viewer, form.get("csrf", "")):
            await http.respond(send, 403, self.pages.error_page(
                403, "This form has expired", "Reload the page and try again.", viewer))
            return
        if request.path == "/ui/sign-out":
            await http.redirect(send, "/ui/sign-in", [_clear_cookie()])
            return
        location = await self.pages.post(request, viewer, form)
        await http.redirect(send, location)

    async def _sign_in(self, request: http.Request, receive: Receive, send: Send) -> None:
        if not self.access.needs_sign_in:
            await http.redirect(send, "/ui")
            return
        problem = ""
        if request.method == "POST":
            form = await http.read_form(receive)
            tenant = await asyncio.to_thread(self.access.sign_in, form.get("key", ""))
            if tenant is not None:
                cookie = (f"{COOKIE}={self.access.cookie_value(tenant)}; Path=/ui; HttpOnly; "
                          f"SameSite=Strict; Max-Age={SESSION_SECONDS}")
                await http.redirect(send, "/ui", [(b"set-cookie", cookie.encode())])
                return
            problem = ("That is not a live gateway key. Ask the gateway's owner for one "
                       "(`lore keys create <name>`).")
        status = 401 if problem else 200
        await http.respond(send, status, self.pages.sign_in_page(problem, self.access.team))

    async def _serve_static(self, send: Send, name: str) -> None:
        body = self._static.get(name)
        if body is None:
            try:
                body = resources.files("lore_gateway.ui").joinpath("static", name).read_bytes()
            except (FileNotFoundError, IsADirectoryError):
                await http.respond(send, 404, b"not found", "text/plain")
                return
            self._static[name] = body
        suffix = name[name.rfind("."):]
        await http.respond(send, 200, body, _TYPES.get(suffix, "application/octet-stream"),
                           cache=True)

    def stopping(self) -> None:
        """The gateway is shutting down: end the live streams so it can."""
        self.streams.stop()

    def close(self) -> None:
        """Store the last metrics sample (before the memory closes). Blocking."""
        self.streams.stop()
        if self.sampler is not None:
            self.sampler.close()


def _clear_cookie() -> tuple[bytes, bytes]:
    return (b"set-cookie", f"{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0".encode())
