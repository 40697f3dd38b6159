"""The ``google-genai`` SDK gets through the gateway exactly what it gets directly.

As tests/e2e/test_sdk_parity.py does for the openai and anthropic SDKs: every
test makes the same call against the fake upstream and through the gateway and
compares the SDK-level results (``model_dump()`` of the responses and of every
streamed chunk; the HTTP envelope, whose ``date`` and framing headers are a
hop's, left out), then checks that the upstream saw the same path, headers
(the API key included) and body both times.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.genai import errors, types

from lore_gateway.testing import FakeUpstream

from .kit import GEMINI_KEY, MODEL

PROMPT = "say hi"
HOP_HEADERS = {"connection", "host", "content-length", "accept-encoding", "transfer-encoding",
               "keep-alive", "te", "trailer", "upgrade", "proxy-connection"}
READ_FILE = types.Tool(function_declarations=[types.FunctionDeclaration(
    name="read_file", description="Read a file",
    parameters=types.Schema(type=types.Type.OBJECT,
                            properties={"path": types.Schema(type=types.Type.STRING)}))])


def _dump(value: Any) -> Any:
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value.model_dump(mode="json", exclude={"sdk_http_response"})


def both(direct: Any, via: Any, call: Callable[[Any], Any]) -> tuple[Any, Any]:
    return _dump(call(direct)), _dump(call(via))


def assert_forwarded_faithfully(fake: FakeUpstream, calls: int = 1) -> None:
    """The last ``calls`` requests through the gateway went upstream as the ones
    before them went directly: path, end-to-end headers, body (but the tool
    list, where the gateway adds its hidden recall tool)."""
    requests = fake.model_requests[-2 * calls:]
    for direct, via in zip(requests[:calls], requests[calls:], strict=True):
        assert via.path == direct.path
        assert via.headers["x-goog-api-key"] == GEMINI_KEY
        end_to_end = {k: v for k, v in direct.headers.items() if k not in HOP_HEADERS}
        assert {k: v for k, v in via.headers.items() if k not in HOP_HEADERS} == end_to_end
        if "tools" not in direct.json:
            assert via.body == direct.body
        assert {k: v for k, v in via.json.items() if k != "tools"} == {
            k: v for k, v in direct.json.items() if k != "tools"}


def test_generate_content(gemini_direct: Any, gemini_client: Any,
                          fake_upstream: FakeUpstream) -> None:
    direct, via = both(gemini_direct, gemini_client, lambda c: c.models.generate_content(
        model=MODEL, contents=PROMPT))
    assert via == direct
    assert via["candidates"][0]["content"]["parts"][0]["text"] == fake_upstream.text
    assert via["usage_metadata"]["prompt_token_count"] > 0
    assert_forwarded_faithfully(fake_upstream)


def test_generate_content_stream(gemini_direct: Any, gemini_client: Any,
                                 fake_upstream: FakeUpstream) -> None:
    def call(client: Any) -> list[Any]:
        return list(client.models.generate_content_stream(
            model=MODEL, contents=PROMPT,
            config=types.GenerateContentConfig(system_instruction="be brief")))

    direct, via = both(gemini_direct, gemini_client, call)
    assert via == direct and len(via) > 1
    assert via[-1]["candidates"][0]["finish_reason"] == "STOP"
    text = "".join(c["candidates"][0]["content"]["parts"][0]["text"] for c in via)
    assert text == fake_upstream.text
    assert fake_upstream.model_requests[-1].path.endswith(":streamGenerateContent?alt=sse")
    assert_forwarded_faithfully(fake_upstream)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_function_call_and_its_response(gemini_direct: Any, gemini_client: Any,
                                          fake_upstream: FakeUpstream, stream: bool) -> None:
    """The model calls the client's tool; the client answers it in the next turn,
    which the strict fake accepts only with the pair in place."""
    def call(client: Any) -> list[Any]:
        config = types.GenerateContentConfig(tools=[READ_FILE])
        fake_upstream.script(['tool:read_file {"path": "README.md"}', "text:done"])
        first = client.models.generate_content(model=MODEL, contents=PROMPT, config=config)
        (fc,) = first.function_calls
        history = [types.Content(role="user", parts=[types.Part(text=PROMPT)]),
                   first.candidates[0].content,
                   types.Content(role="user", parts=[types.Part.from_function_response(
                       name=fc.name, response={"output": "# readme"})])]
        if stream:
            return [first, *client.models.generate_content_stream(
                model=MODEL, contents=history, config=config)]
        return [first, client.models.generate_content(model=MODEL, contents=history,
                                                      config=config)]

    direct, via = both(gemini_direct, gemini_client, call)
    assert via == direct
    call = via[0]["candidates"][0]["content"]["parts"][0]["function_call"]
    assert (call["name"], call["args"]) == ("read_file", {"path": "README.md"})
    assert not fake_upstream.refusals
    assert_forwarded_faithfully(fake_upstream, calls=2)


def test_a_chat_session(gemini_direct: Any, gemini_client: Any,
                        fake_upstream: FakeUpstream) -> None:
    def call(client: Any) -> list[Any]:
        chat = client.chats.create(model=MODEL)
        return [chat.send_message("first"), *chat.send_message_stream("second")]

    direct, via = both(gemini_direct, gemini_client, call)
    assert via == direct
    assert len(fake_upstream.model_requests[-1].json["contents"]) == 3
    assert_forwarded_faithfully(fake_upstream, calls=2)


def test_a_refusal_is_the_same_error(gemini_direct: Any, gemini_client: Any,
                                     fake_upstream: FakeUpstream) -> None:
    """A function response with no call before it: the API's 400, relayed unchanged."""
    orphan = [types.Content(role="user", parts=[types.Part.from_function_response(
        name="read_file", response={"output": "x"})])]
    caught = []
    for client in (gemini_direct, gemini_client):
        with pytest.raises(errors.ClientError) as error:
            client.models.generate_content(model=MODEL, contents=orphan)
        caught.append((error.value.code, error.value.status, error.value.message))
    assert caught[0] == caught[1]
    assert caught[0][:2] == (400, "INVALID_ARGUMENT")
    assert "function response turn comes immediately after" in caught[0][2]
    assert [r.rule for _, r in fake_upstream.refusals] == ["gemini.response_position"] * 2


def test_count_tokens_and_models(gemini_direct: Any, gemini_client: Any) -> None:
    direct, via = both(gemini_direct, gemini_client, lambda c: c.models.count_tokens(
        model=MODEL, contents=PROMPT))
    assert via == direct and via["total_tokens"] > 0
    direct, via = both(gemini_direct, gemini_client,
                       lambda c: [c.models.get(model=MODEL), *c.models.list()])
    assert via == direct and via[1]["name"] == "models/gemini-fake"
