"""The fake's Gemini API: its strict rules, answers and scenarios (pure)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from lore_gateway.protocols.gemini_stream import GeminiAccumulator
from lore_gateway.testing import fake_gemini
from lore_gateway.testing.fake_scenarios import Scenario

USER = {"role": "user", "parts": [{"text": "hi"}]}
MODEL_TEXT = {"role": "model", "parts": [{"text": "hello"}]}
CALL = {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}}]}
TWO_CALLS = {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}},
                                        {"functionCall": {"name": "cat", "args": {}}}]}
ANSWER = {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {}}}]}


@pytest.mark.parametrize(("contents", "rule"), [
    ([], "gemini.contents"),
    ([{"role": "assistant", "parts": [{"text": "x"}]}], "gemini.role"),
    ([{"role": "user", "parts": []}], "gemini.parts"),
    ([CALL], "gemini.call_position"),
    ([USER, MODEL_TEXT, CALL], "gemini.call_position"),
    ([USER, ANSWER], "gemini.response_position"),
    ([USER, TWO_CALLS, ANSWER], "gemini.response_count"),
    ([USER, CALL, USER], "gemini.response_count"),
])
def test_what_the_api_refuses(contents: list[Any], rule: str) -> None:
    refusal = fake_gemini.check({"contents": contents})
    assert refusal is not None and refusal.rule == rule
    error = orjson.loads(refusal.body)["error"]
    assert (refusal.status, error["code"], error["status"]) == (400, 400, "INVALID_ARGUMENT")
    assert error["message"] == refusal.message


@pytest.mark.parametrize("contents", [
    [USER],
    [{"parts": [{"text": "no role is a user"}]}],
    [USER, MODEL_TEXT, USER, USER],
    [USER, CALL, ANSWER, MODEL_TEXT],
    [USER, CALL, ANSWER, CALL, ANSWER],
    [USER, {"role": "model", "parts": [{"function_call": {"name": "ls"}}]},
     {"role": "user", "parts": [{"function_response": {"name": "ls", "response": {}}}]}],
])
def test_what_the_api_accepts(contents: list[Any]) -> None:
    assert fake_gemini.check({"contents": contents}) is None


def test_the_window() -> None:
    assert fake_gemini.check_window(b"x" * 400, 100) is None
    refusal = fake_gemini.check_window(b"x" * 404, 100)
    assert refusal is not None and "(101) exceeds the maximum number of tokens allowed (100)" \
        in refusal.message


def _accumulated(answer: fake_gemini.GeminiAnswer) -> GeminiAccumulator:
    acc = GeminiAccumulator()
    for record in answer.records:
        acc.apply(record)
    acc.close()
    return acc


@pytest.mark.parametrize("spec", ["text", "text:two words", "minimal", "incomplete",
                                  "recall:the port", 'tool:ls {"dir": "."}', "blank"])
def test_the_stream_and_the_body_are_one_answer(spec: str) -> None:
    answer = fake_gemini.answer(Scenario.parse(spec), {"contents": [USER]}, "gemini-x",
                                "Hi from the fake", None)
    assert _accumulated(answer).response_body() == answer.body


def test_recall_calls_then_quotes_its_output() -> None:
    scenario = Scenario.parse("recall:the port")
    call = fake_gemini.answer(scenario, {"contents": [USER]}, "m", "t", None)
    part = call.body["candidates"][0]["content"]["parts"][0]
    assert part == {"functionCall": {"name": "recall", "args": {"query": "the port"}}}
    output = {"role": "user", "parts": [{"functionResponse": {
        "name": "recall", "response": {"output": "- (user, 1d) port 3207 (t:1)"}}}]}
    after = fake_gemini.answer(scenario, {"contents": [USER, call.body["candidates"][0][
        "content"], output]}, "m", "t", None)
    assert after.body["candidates"][0]["content"]["parts"] == [
        {"text": "According to memory: - (user, 1d) port 3207 (t:1)"}]
    again = fake_gemini.answer(Scenario.parse("call-recall"), {"contents": [USER, output]},
                               "m", "t", None)
    assert "functionCall" in again.body["candidates"][0]["content"]["parts"][0]


def test_paths_and_usage() -> None:
    assert fake_gemini.gemini_method("POST", "/v1beta/models/g-1:streamGenerateContent") == (
        "g-1", "streamGenerateContent")
    assert fake_gemini.gemini_method("GET", "/v1beta/models/g-1:generateContent") is None
    assert fake_gemini.model_path("GET", "/v1beta/models") == (True, None)
    answer = fake_gemini.answer(Scenario.parse("text"), {}, "m", "a b", None,
                                {"promptTokenCount": 50, "cachedContentTokenCount": 40})
    assert answer.body["usageMetadata"] == {"promptTokenCount": 50, "candidatesTokenCount": 2,
                                            "totalTokenCount": 52,
                                            "cachedContentTokenCount": 40}
