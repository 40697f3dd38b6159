"""The recall tool on a Gemini request: a function declaration of its own (B.8)."""

from __future__ import annotations

from typing import Any

from lore_gateway.recall.core.tool import (
    has_recall_tool,
    inject,
    injection_refusal,
)

READ = {"name": "read_file", "description": "read", "parametersJsonSchema": {"type": "object"}}


def body(**extra: Any) -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [READ]}], **extra}


def test_the_tool_is_one_more_tools_entry() -> None:
    original = body()
    injected = inject("gemini", original)
    assert injected is not None and original == body()
    assert injected["tools"][0] == {"functionDeclarations": [READ]}
    (declaration,) = injected["tools"][1]["functionDeclarations"]
    assert declaration["name"] == "recall"
    assert declaration["parametersJsonSchema"]["required"] == ["query"]
    assert "parallel_tool_calls" not in injected and "tool_choice" not in injected
    assert has_recall_tool("gemini", injected) and not has_recall_tool("gemini", original)


def test_when_it_is_not_injected() -> None:
    assert injection_refusal("gemini", {"contents": []}) == "no client tool"
    assert injection_refusal("gemini", body(tools=[{"googleSearch": {}}])) \
        == "no callable client tool"
    own = body(tools=[{"functionDeclarations": [READ, {"name": "recall"}]}])
    assert injection_refusal("gemini", own) == "the client has its own recall tool"
    several = body(generationConfig={"candidateCount": 2})
    assert injection_refusal("gemini", several) == "the client asked for several candidates"
    assert injection_refusal("gemini", body(generationConfig={"candidateCount": 1})) is None


def test_a_gemini_array_stream_gets_no_tool() -> None:
    """The live path reads SSE (``alt=sse``); an array stream goes on without recall."""
    from lore_gateway.memory.store.records import Identity
    from lore_gateway.pipeline import transforms
    from lore_gateway.routing import Protocol, match

    def route(query: str) -> Any:
        found = match("POST", "/v1beta/models/gemini-fake:streamGenerateContent", query,
                      anthropic_version=False, upgrade=False)
        assert found is not None
        return found

    assert transforms.array_stream(route("key=k"))
    assert not transforms.array_stream(route("alt=sse"))
    identity = Identity(tenant="t", project="/p", session="s")
    original = body()
    ctx = transforms.request_context(Protocol.GEMINI, {}, identity,
                                     array_stream=transforms.array_stream(route("")))
    assert transforms.inject_tool(original, ctx) is original
    sse = transforms.request_context(Protocol.GEMINI, {}, identity)
    assert has_recall_tool("gemini", transforms.inject_tool(original, sse))
