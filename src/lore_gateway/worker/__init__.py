"""The background worker: model calls the gateway makes on the user's behalf.

``requests`` (sans-IO: the worker request per protocol family and its answer),
``credentials`` (the session's upstream and credential, memory only),
``jobs`` and ``ledger`` (the durable queue and the daily token budget),
``service`` (the asyncio task that runs jobs off the request path).
"""
