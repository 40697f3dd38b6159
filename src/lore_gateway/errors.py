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
    """An error answered to the client as ``status`` with the standard envelope.

    ``retry=False`` adds ``x-should-retry: false``, which the openai and anthropic
    SDKs (and Claude Code) honour: an error that the same request cannot escape,
    such as a missing gateway key, is reported at once instead of after minutes
    of back-off.
    """

    def __init__(self, status: int, error_type: str, message: str, *,
                 retry: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.retry = retry

    def body(self) -> bytes:
        return error_body(self.error_type, self.message)

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", b"application/json")]
        if not self.retry:
            headers.append((b"x-should-retry", b"false"))
        return headers


def invalid_request(message: str) -> GatewayError:
    return GatewayError(400, "invalid_request_error", message)
