"""Context management (issue 13): a bounded, cache-friendly upstream context.

``planner`` decides (sans-IO) what a session's upstream context is; ``history``
holds its rules over the items, each protocol's shapes coming from its adapter
(``protocols/history.py``); ``service`` is the asyncio shell (state
cache, loading distillations, persistence); ``store`` the SQL. See docs/context.md.
"""
