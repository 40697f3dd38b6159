"""The recall tool definition, argument validation and injection rule (lore-spec B)."""

from __future__ import annotations

import orjson
import pytest

from lore_gateway.recall.core import tool
from lore_gateway.recall.core.tool import RecallArgumentError, RecallFrameError


def test_responses_tool_is_strict_with_every_property_required_and_nullable() -> None:
    spec = tool.responses_tool()
    assert spec["type"] == "function" and spec["name"] == "recall" and spec["strict"] is True
    params = spec["parameters"]
    assert params["additionalProperties"] is False
    assert sorted(params["required"]) == sorted(params["properties"])
    for name, prop in params["properties"].items():
        assert "null" in prop["type"], name
    assert None in params["properties"]["scope"]["enum"]


def test_chat_and_anthropic_tools_require_only_query() -> None:
    chat = tool.chat_tool()
    assert chat["function"]["name"] == "recall"
    assert chat["function"]["parameters"]["required"] == ["query"]
    anthropic = tool.anthropic_tool()
    assert anthropic["input_schema"]["required"] == ["query"]
    assert "📚 Searching" in anthropic["description"]  # the anti-imitation paragraph


def test_null_optional_arguments_mean_omitted() -> None:
    args = tool.parse_arguments(
        {
            "query": "deploy",
            "scope": None,
            "id": None,
            "ids": None,
            "detailOffset": None,
            "detailLimit": None,
        }
    )
    assert args.query == "deploy" and args.scope == "all" and args.kind == "search"
    assert args.as_input() == {"query": "deploy"}


@pytest.mark.parametrize(
    ("raw", "issue"),
    [
        ([], "expected_object"),
        ({"query": "x", "extra": 1}, "unknown_property"),
        ({"query": 5}, "query_type"),
        ({"query": "x" * 513}, "query_length"),
        ({"query": "x", "scope": 3}, "scope_type"),
        ({"query": "x", "scope": "everything"}, "unsupported_scope"),
        ({"id": ""}, "id_type"),
        ({"ids": []}, "ids_type"),
        ({"ids": ["a"] * 9}, "ids_type"),
        ({"id": "t:1", "ids": ["t:2"]}, "id_conflict"),
        ({"id": "t:1", "detailOffset": -1}, "detail_offset"),
        ({"id": "t:1", "detailLimit": 16_001}, "detail_limit"),
        ({"query": "x", "detailOffset": 5}, "detail_without_id"),
        ({"query": "   "}, "missing_selector"),
        ({}, "missing_selector"),
    ],
)
def test_invalid_arguments_name_their_issue(raw: object, issue: str) -> None:
    with pytest.raises(RecallArgumentError) as info:
        tool.parse_arguments(raw)
    assert info.value.issue == issue
    result = info.value.tool_result()
    assert result.startswith(f"Invalid recall arguments ({issue}).")
    assert "Set unused arguments to null." in result


def test_detail_and_batch_arguments() -> None:
    detail = tool.parse_arguments({"id": "t:7", "detailOffset": 100, "detailLimit": 50})
    assert detail.kind == "detail" and detail.detail_offset == 100
    batch = tool.parse_arguments({"ids": ["t:1", "t:2"], "query": "ignored"})
    assert batch.kind == "batch" and batch.ids == ("t:1", "t:2")


def test_arguments_must_be_a_json_string() -> None:
    with pytest.raises(RecallFrameError, match="expected JSON string"):
        tool.decode_arguments({"query": "x"})
    with pytest.raises(RecallFrameError, match="malformed JSON"):
        tool.decode_arguments('{"query": ')
    assert tool.decode_arguments('{"query":"x"}') == {"query": "x"}


def _responses_body(**extra: object) -> dict[str, object]:
    return {
        "model": "m",
        "input": "hi",
        "tools": [{"type": "function", "name": "exec", "parameters": {}}],
        **extra,
    }


def test_inject_adds_recall_and_disables_parallel_calls_without_mutating_input() -> None:
    body = _responses_body()
    before = orjson.dumps(body)
    out = tool.inject("responses", body)
    assert out is not None
    assert [t["name"] for t in out["tools"]] == ["exec", "recall"]
    assert out["parallel_tool_calls"] is False
    assert orjson.dumps(body) == before


def test_no_injection_without_tools_or_with_a_client_recall_tool() -> None:
    assert tool.inject("responses", {"model": "m", "input": "hi"}) is None
    assert tool.inject("responses", {"model": "m", "tools": [{"type": "web_search"}]}) is None
    own = _responses_body()
    own["tools"] = [{"type": "function", "name": "recall", "parameters": {}}]
    assert tool.inject("responses", own) is None


def test_explicit_parallel_tool_calls_blocks_injection_except_for_codex() -> None:
    body = _responses_body(parallel_tool_calls=True)
    assert tool.inject("responses", body) is None
    codex = tool.inject("responses", body, codex_client=True)
    assert codex is not None and codex["parallel_tool_calls"] is False


def test_anthropic_injection_disables_parallel_tool_use() -> None:
    body = {"model": "c", "messages": [], "tools": [{"name": "Read", "input_schema": {}}]}
    out = tool.inject("anthropic", body)
    assert out is not None
    assert out["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert out["tools"][-1]["name"] == "recall"
    chat = tool.inject(
        "chat",
        {"model": "g", "messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]},
    )
    assert chat is not None and chat["parallel_tool_calls"] is False
    assert chat["tools"][-1]["function"]["name"] == "recall"
