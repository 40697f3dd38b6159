"""Memory: the durable store of every turn, identity of its session and project, and search.

The :class:`~lore_gateway.memory.service.Memory` facade is the entry point; see
docs/memory.md for the schema, the write path and the isolation rules.
"""
