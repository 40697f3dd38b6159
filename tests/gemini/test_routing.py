"""Gemini's routes: the model and method in the path, the stream flag from it."""

from __future__ import annotations

import pytest

from lore_gateway.routing import Family, Kind, Protocol, Upstream, family_of, match


@pytest.mark.parametrize("version", ["v1beta", "v1"])
@pytest.mark.parametrize(("method", "query", "stream"), [
    ("generateContent", "", False),
    ("streamGenerateContent", "alt=sse", True),
    ("streamGenerateContent", "", True),
])
def test_model_methods(version: str, method: str, query: str, stream: bool) -> None:
    path = f"/{version}/models/gemini-2.5-flash:{method}"
    route = match("POST", path, query, anthropic_version=False, upgrade=False)
    assert route is not None
    assert (route.kind, route.upstream, route.protocol) == (Kind.MODEL, Upstream.GEMINI,
                                                            Protocol.GEMINI)
    assert route.upstream_path == path + (f"?{query}" if query else "")
    assert route.model == "gemini-2.5-flash"
    assert route.streams({}) is stream
    assert route.streams({"stream": not stream}) is stream  # the path decides
    assert family_of(Protocol.GEMINI) is Family.GEMINI


def test_count_tokens_and_model_listing_pass_through() -> None:
    route = match("POST", "/v1beta/models/gemini-2.5-pro:countTokens", "key=k",
                  anthropic_version=False, upgrade=False)
    assert route is not None
    assert (route.kind, route.upstream, route.upstream_path) == (
        Kind.JSON, Upstream.GEMINI, "/v1beta/models/gemini-2.5-pro:countTokens?key=k")
    listing = match("GET", "/v1beta/models", "pageSize=5", anthropic_version=False,
                    upgrade=False)
    assert listing is not None and (listing.kind, listing.upstream) == (Kind.PASSTHROUGH,
                                                                        Upstream.GEMINI)
    one = match("GET", "/v1beta/models/gemini-2.5-pro", "", anthropic_version=False,
                upgrade=False)
    assert one is not None and one.upstream is Upstream.GEMINI


def test_generic_v1_goes_to_gemini_only_with_a_google_credential() -> None:
    assert match("GET", "/v1/models", "", anthropic_version=False,
                 upgrade=False).upstream is Upstream.OPENAI  # type: ignore[union-attr]
    for route in (match("GET", "/v1/models", "", anthropic_version=False, upgrade=False,
                        google_key=True),
                  match("GET", "/v1/models", "key=abc", anthropic_version=False, upgrade=False),
                  match("POST", "/v1/models/text-embedding-004:embedContent", "",
                        anthropic_version=False, upgrade=False)):
        assert route is not None and route.upstream is Upstream.GEMINI


def test_the_body_stream_flag_still_decides_elsewhere() -> None:
    route = match("POST", "/v1/messages", "", anthropic_version=True, upgrade=False)
    assert route is not None and route.stream is None
    assert route.streams({"stream": True}) and not route.streams({})


def test_a_model_name_that_is_not_one_is_not_a_model_route() -> None:
    route = match("POST", "/v1beta/models/a/b:generateContent", "", anthropic_version=False,
                  upgrade=False)
    assert route is not None and route.kind is Kind.PASSTHROUGH
