"""Context management (issue 13): a bounded, cache-friendly upstream context.

``planner`` decides (sans-IO) what a session's upstream context is; ``history``
knows each protocol's history shape; ``service`` is the asyncio shell (state
cache, loading distillations, persistence); ``store`` the SQL. See docs/context.md.
"""
