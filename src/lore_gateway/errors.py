"""Errors the gateway itself answers with, in one envelope shape.

``{"type": "error", "error": {"type": ..., "message": ...}}`` is what Anthropic
returns and what OpenAI SDKs surface as ``APIError``; both families of clients
show the message to the user, so messages say what went wrong and what to do.
"""

from __future__ import annotations

import orjson


def error_body(error_type: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})


class GatewayError(Exception):
    """An error answered to the client as ``status`` with the standard envelope."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message

    def body(self) -> bytes:
        return error_body(self.error_type, self.message)


def invalid_request(message: str) -> GatewayError:
    return GatewayError(400, "invalid_request_error", message)
