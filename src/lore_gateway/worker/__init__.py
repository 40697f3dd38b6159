"""The background worker: model calls the gateway makes on the user's behalf.

``requests`` (sans-IO: the worker request per protocol family and its answer),
``client`` (one request within the budget), ``status`` (facts for status and doctor),
``credentials`` (the session's upstream and credential, memory only),
``jobs`` (the durable queue and the daily token ledger), ``service`` (the
asyncio task that runs jobs off the request path), ``wiring`` (into a gateway).
"""
