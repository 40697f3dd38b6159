"""The memory browser served at ``/ui`` (docs/ui.md): server-rendered pages over the
memory database, with vendored htmx and uPlot; no build step, nothing from a CDN."""
