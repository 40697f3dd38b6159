"""The request pipeline: everything the gateway does to a model request before it
goes upstream, in one place and one order.

``transforms`` holds the pure half (the frozen request context, the named slots,
the upstream's own rules); ``request`` the asyncio shell the proxy calls
(``RequestPipeline``: the features' IO halves, then the slots; context
management's part after the answer). docs/architecture.md, "The path of one
request".
"""
