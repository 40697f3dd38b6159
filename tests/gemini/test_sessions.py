"""A Gemini conversation without a session id is named by its first user text,
as the other protocols' are (memory/fingerprint.py, issue 35): before, every
Gemini conversation of a project was one session."""

from __future__ import annotations

from lore_gateway.memory.fingerprint import fingerprint_session, first_user_text, has_answer


def conversation(*texts: str) -> dict[str, object]:
    roles = ("user", "model")
    return {"contents": [{"role": roles[i % 2], "parts": [{"text": t}]}
                         for i, t in enumerate(texts)]}


def test_each_conversation_is_its_own_session_for_its_whole_life() -> None:
    first = conversation("Why does the loader fail?")
    later = conversation("Why does the loader fail?", "Paths.", "Fix it.")
    other = conversation("Add a --verbose flag.")
    assert first_user_text(later) == "Why does the loader fail?"
    assert fingerprint_session(first, "/p") == fingerprint_session(later, "/p")
    assert fingerprint_session(first, "/p") != fingerprint_session(other, "/p")


def test_a_model_content_is_an_answer() -> None:
    assert not has_answer(conversation("hi")["contents"])
    assert has_answer(conversation("hi", "hello", "more")["contents"])
