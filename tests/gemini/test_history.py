"""The Gemini history adapter and request shape check: plain dicts in, values out."""

from __future__ import annotations

import orjson
import pytest

from lore_gateway.protocols.history import adapter_for
from lore_gateway.protocols.history_common import PROMPT_CACHE_TTL_S
from lore_gateway.protocols.history_gemini import GEMINI
from lore_gateway.request_shape import BadRequestShape, check_request
from lore_gateway.routing import Family, Protocol

USER = {"role": "user", "parts": [{"text": "fix it"}]}
CALL = {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}}]}
OUTPUT = {"role": "user", "parts": [
    {"functionResponse": {"name": "ls", "response": {"output": "a.py", "exit": 0}}}]}


def test_items_and_roles() -> None:
    assert adapter_for(Family.GEMINI) is GEMINI
    assert (GEMINI.items_key, GEMINI.instructions_file) == ("contents", "GEMINI.md")
    assert GEMINI.lead_count([USER, CALL]) == 0
    assert GEMINI.is_user_text(USER) and GEMINI.is_user_text({"parts": [{"text": "no role"}]})
    assert not GEMINI.is_user_text(OUTPUT) and GEMINI.is_tool_output(OUTPUT)
    assert GEMINI.is_assistant_side(CALL) and not GEMINI.is_assistant_side(USER)
    assert not GEMINI.is_system(USER)
    assert GEMINI.user_text(USER) == "fix it" and GEMINI.user_text(CALL) == ""


def test_outputs_shrink_and_go() -> None:
    shrunk = GEMINI.shrink_output(OUTPUT, str.upper)
    assert shrunk["parts"][0]["functionResponse"]["response"] == {"output": "A.PY", "exit": 0}
    assert GEMINI.shrink_output(OUTPUT, lambda text: None) is OUTPUT
    assert GEMINI.without_tool_results(OUTPUT) is None
    mixed = {"role": "user", "parts": [*OUTPUT["parts"], {"text": "also"}]}
    assert GEMINI.without_tool_results(mixed) == {"role": "user", "parts": [{"text": "also"}]}


def test_messages_system_text_and_cache() -> None:
    assert GEMINI.update_items("note", "ok") == [
        {"role": "user", "parts": [{"text": "note"}]},
        {"role": "model", "parts": [{"text": "ok"}]}]
    assert GEMINI.add_system_text({}, "k") == {"systemInstruction": {"parts": [{"text": "k"}]}}
    payload = {"system_instruction": {"parts": [{"text": "a"}]}}
    assert GEMINI.add_system_text(payload, "k") == {
        "system_instruction": {"parts": [{"text": "a"}, {"text": "k"}]}}
    assert payload == {"system_instruction": {"parts": [{"text": "a"}]}}  # not mutated
    assert GEMINI.cache_ttl({}) == PROMPT_CACHE_TTL_S
    assert GEMINI.cache_marker({}, []) is None and GEMINI.compaction_flow({}, {}) is None
    assert GEMINI.usage_scaler().scale({"promptTokenCount": 1}, lambda _: 0.5, None) is False


@pytest.mark.parametrize(("payload", "param"), [
    ({"contents": 5}, "contents"),
    ({"contents": [{"role": 1, "parts": []}]}, "contents[0].role"),
    ({"contents": [{"parts": "hi"}]}, "contents[0].parts"),
    ({"contents": [{"parts": [3]}]}, "contents[0].parts[0]"),
    ({"systemInstruction": [1]}, "systemInstruction"),
])
def test_shape_errors_in_the_apis_shape(payload: dict[str, object], param: str) -> None:
    with pytest.raises(BadRequestShape) as caught:
        check_request(Protocol.GEMINI, payload)
    assert caught.value.param == param
    error = orjson.loads(caught.value.body())["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")


def test_a_well_formed_request_passes() -> None:
    check_request(Protocol.GEMINI, {"contents": [USER, CALL, OUTPUT],
                                    "systemInstruction": {"parts": {"text": "x"}},
                                    "tools": [{"functionDeclarations": [{"name": "ls"}]}]})


def test_the_apis_context_length_error_is_an_overflow() -> None:
    from lore_gateway.context.overflow import detect
    from lore_gateway.context.windows import window_for

    body = orjson.dumps({"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": (
        "The input token count (1200293) exceeds the maximum number of tokens allowed "
        "(1048576).")}})
    found = detect(400, body)
    assert found is not None and found.limit == 1_048_576
    assert found.ratio == pytest.approx(1200293 / 1048576)
    assert window_for("gemini-2.5-pro") == 1_048_576
