"""The route table and header rules, as pure functions."""

from __future__ import annotations

import pytest

from lore_gateway.headers import client_response_headers, upstream_request_headers
from lore_gateway.routing import Kind, Protocol, Upstream, match


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("POST", "/v1/responses", "", (Kind.MODEL, Upstream.OPENAI, "/v1/responses",
                                       Protocol.RESPONSES)),
        ("POST", "/backend-api/codex/responses", "", (Kind.MODEL, Upstream.CHATGPT,
                                                      "/codex/responses", Protocol.CODEX)),
        ("POST", "/v1/codex/responses", "", (Kind.MODEL, Upstream.CHATGPT, "/codex/responses",
                                             Protocol.CODEX)),
        ("POST", "/v1/chat/completions", "", (Kind.MODEL, Upstream.OPENAI,
                                              "/v1/chat/completions", Protocol.CHAT)),
        ("POST", "/chat/completions", "", (Kind.MODEL, Upstream.OPENAI, "/v1/chat/completions",
                                           Protocol.CHAT)),
        ("POST", "/v1/messages", "beta=true", (Kind.MODEL, Upstream.ANTHROPIC,
                                               "/v1/messages?beta=true", Protocol.ANTHROPIC)),
        ("POST", "/v1/messages/count_tokens", "beta=true",
         (Kind.JSON, Upstream.ANTHROPIC, "/v1/messages/count_tokens?beta=true", None)),
        ("GET", "/v1/models", "limit=5", (Kind.PASSTHROUGH, Upstream.OPENAI, "/v1/models?limit=5",
                                          None)),
    ],
)
def test_model_and_passthrough_routes(method: str, path: str, query: str,
                                      expected: tuple[object, ...]) -> None:
    route = match(method, path, query, anthropic_version=False, upgrade=False)
    assert route is not None
    assert (route.kind, route.upstream, route.upstream_path, route.protocol) == expected


def test_generic_v1_goes_to_anthropic_when_the_request_says_so() -> None:
    route = match("GET", "/v1/models", "", anthropic_version=True, upgrade=False)
    assert route is not None and route.upstream is Upstream.ANTHROPIC


def test_health_websocket_and_unknown() -> None:
    assert match("HEAD", "/", "", anthropic_version=False, upgrade=False).kind is Kind.HEALTH  # type: ignore[union-attr]
    assert match("GET", "/health", "", anthropic_version=False, upgrade=False).kind is Kind.HEALTH  # type: ignore[union-attr]
    for path in ("/v1/responses", "/backend-api/codex/responses", "/v1/codex/responses"):
        route = match("GET", path, "", anthropic_version=False, upgrade=True)
        assert route is not None and route.kind is Kind.WEBSOCKET_REFUSED
    assert match("GET", "/", "", anthropic_version=False, upgrade=False) is None
    assert match("POST", "/v2/other", "", anthropic_version=False, upgrade=False) is None


def test_request_headers_keep_credentials_and_unknowns_drop_hop_and_encoding() -> None:
    headers = [(b"Authorization", b"Bearer sk-1"), (b"Host", b"127.0.0.1:3207"),
               (b"Content-Length", b"10"), (b"Content-Encoding", b"zstd"),
               (b"Connection", b"keep-alive"), (b"X-Lore-Project", b"/p"),
               (b"session-id", b"abc"), (b"Accept-Encoding", b"zstd"),
               (b"anthropic-beta", b"x")]
    assert upstream_request_headers(headers) == [
        ("Authorization", "Bearer sk-1"), ("session-id", "abc"), ("anthropic-beta", "x")]


def test_response_headers_relay_rate_limits_drop_framing() -> None:
    headers = [(b"x-codex-primary-used-percent", b"7"), (b"retry-after", b"3"),
               (b"content-length", b"5"), (b"transfer-encoding", b"chunked"),
               (b"content-encoding", b"gzip"), (b"x-request-id", b"req_1")]
    assert client_response_headers(headers) == [
        (b"x-codex-primary-used-percent", b"7"), (b"retry-after", b"3"),
        (b"x-request-id", b"req_1")]
