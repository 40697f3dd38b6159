"""The two agents ``lore bench context`` replays a long session as (pure).

The coding sessions become one neutral list of turns: what the client appends
before a request (the task, a harness nudge, a tool output) and the recorded
reply the model answers it with (its text, and the shell call it makes when
the data shows one ran). Each agent renders them in its own protocol, the way
the real client builds its requests:

* **Claude Code style** (Anthropic Messages): system blocks and the last
  message carry ``cache_control`` markers, 5 minutes first and 1 hour from
  the middle on (Claude Code switches as quotas change); thinking is off for
  the first third, ``adaptive`` for the second (every third reply opens with
  a signed thinking block) and ``enabled`` for the last (every reply does).
* **Codex style** (OpenAI Responses): instructions, a developer message,
  ``shell`` calls and their outputs, and a reasoning item with sealed
  ``encrypted_content`` before every call, ``store: false``.

Some turns ask something the session said long before (a question of an
earlier session of the set): the fake model then calls the hidden ``recall``
tool first, and answers with the recorded reply once it has the result, so the
client sees only that reply and keeps the gateway's recall anchor in it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from lore_gateway.testing.strict import seal_reasoning, sign_thinking

Style = Literal["claude", "codex"]
STYLES: tuple[Style, ...] = ("claude", "codex")
CLAUDE_MODEL = "claude-sonnet-4-5"
CODEX_MODEL = "gpt-5.1-codex"
SYSTEM = ("You are a coding agent working in a git repository through a bash tool. Read "
          "files before editing them, run the tests after every change, keep diffs small, "
          "and explain what you changed and why. ") * 4
DONE = "Done with that task."
# Replies between two hidden recalls, drawn per style: about 60 recalls over the
# 30 sessions' 1,800 replies in Claude Code style, about 30 in Codex style.
RECALL_EVERY: dict[Style, tuple[int, int]] = {"claude": (15, 40), "codex": (40, 80)}
SEED = 31  # the recall schedule is the same on every run


@dataclass(frozen=True, slots=True)
class Reply:
    text: str
    call: str | None  # the call id of the shell command it runs (None: no call)
    command: str


@dataclass(frozen=True, slots=True)
class Turn:
    """What the client appends, then sends; and the model's recorded answer."""

    inputs: tuple[tuple[str, str, str], ...]  # ("user", text, "") | ("output", text, call)
    reply: Reply | None
    recall: str | None = None  # a question the model recalls before answering


def turns(sessions: list[dict[str, Any]], questions: list[dict[str, Any]],
          style: Style) -> list[Turn]:
    """The sessions as one agent session's turns, with the style's recalls.

    A reply makes a shell call only when the data shows its output (a reply
    the harness answered with a nudge made none); a task after a tool output
    means the agent ended its turn first ("Done with that task.")."""
    out: list[Turn] = []
    starts: dict[int, str] = {}  # turn number -> the session whose task it sends
    inputs: list[tuple[str, str, str]] = []
    pending: str | None = None  # the call the last reply made, awaiting its output
    calls = 0
    for session in sessions:
        messages = session["messages"]
        for index, message in enumerate(messages):
            role, text = message["role"], str(message["content"])
            if role == "assistant":
                has_call = index + 1 < len(messages) and messages[index + 1]["role"] == "tool"
                if has_call:
                    calls += 1
                if not inputs:  # two replies in a row: the harness asked for more
                    inputs.append(("user", "Continue.", ""))
                pending = f"call_{calls:06d}" if has_call else None
                out.append(Turn(tuple(inputs), Reply(text, pending, _command(text))))
                inputs = []
            elif role == "tool" and pending is not None:
                inputs.append(("output", text, pending))
                pending = None
            elif role == "user":
                if inputs and inputs[-1][0] == "output":  # the agent ended its turn
                    out.append(Turn(tuple(inputs), Reply(DONE, None, "")))
                    inputs = []
                if index == 0:
                    starts[len(out)] = session["session_id"]
                inputs.append(("user", text, ""))
        if pending is not None:
            inputs.append(("output", "(no output)", pending))
            pending = None
    if inputs:
        out.append(Turn(tuple(inputs), None))
    return _with_recalls(out, starts, questions, style)


def _with_recalls(out: list[Turn], starts: dict[int, str], questions: list[dict[str, Any]],
                  style: Style) -> list[Turn]:
    """Every ``RECALL_EVERY`` replies, a turn recalls a question of a session
    that started before the current one (the client's request is unchanged)."""
    rng = random.Random(f"{SEED}-{style}")
    low, high = RECALL_EVERY[style]
    earlier: set[str] = set()
    current = ""
    due = rng.randint(low, high)
    result: list[Turn] = []
    for number, turn in enumerate(out):
        if number in starts:
            if current:
                earlier.add(current)
            current = starts[number]
        asked = [q for q in questions if q["session_id"] in earlier]
        if number >= due and asked and turn.reply is not None:
            question = asked[rng.randrange(len(asked))]["question"]
            turn = Turn(turn.inputs, turn.reply, " ".join(str(question).split()))
            due = number + rng.randint(low, high)
        result.append(turn)
    return result


def _command(text: str) -> str:
    start = text.find("```bash")
    if start < 0:
        return "true"
    end = text.find("```", start + 7)
    return text[start + 7:end].strip() if end > 0 else text[start + 7:].strip()


# --- Claude Code style ------------------------------------------------------------


class ClaudeClient:
    """Builds Claude Code-shaped requests and keeps the transcript it gets back."""

    path = "/v1/messages"
    key = "messages"

    def __init__(self, total: int) -> None:
        self.total = total
        self.history: list[dict[str, Any]] = []
        self.turn_start = 0  # the number of the request that began the current turn

    def thinking(self, number: int) -> dict[str, Any] | None:
        """The thinking setting, changed only when a user turn begins (a client
        does not switch it inside a tool loop; the API would refuse that)."""
        start = min(number, self.turn_start)
        if start < self.total // 3:
            return None
        if start < 2 * self.total // 3:
            return {"type": "adaptive"}
        return {"type": "enabled", "budget_tokens": 4096}

    def ttl(self, number: int) -> str | None:
        return None if number < self.total // 2 else "1h"

    def request(self, number: int, turn: Turn) -> dict[str, Any]:
        if any(kind == "user" for kind, _, _ in turn.inputs):
            self.turn_start = number
        for kind, text, call in turn.inputs:
            if kind == "user":
                self._append("user", [{"type": "text", "text": text}])
            else:
                self._append("user", [{"type": "tool_result", "tool_use_id": call,
                                       "content": text}])
        marker = {"type": "ephemeral", **({"ttl": ttl} if (ttl := self.ttl(number)) else {})}
        messages = [*self.history[:-1], _marked(self.history[-1], marker)]
        body: dict[str, Any] = {
            "model": CLAUDE_MODEL, "max_tokens": 32_000,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=bench"},
                       {"type": "text", "text": SYSTEM, "cache_control": marker}],
            "tools": [{"name": "bash", "description": "Run one bash command in the repository.",
                       "input_schema": {"type": "object",
                                        "properties": {"command": {"type": "string"}},
                                        "required": ["command"]}}],
            "messages": messages}
        if (thinking := self.thinking(number)) is not None:
            body["thinking"] = thinking
        return body

    def scenarios(self, number: int, turn: Turn) -> list[str]:
        reply = turn.reply.text if turn.reply is not None else DONE
        if turn.recall is None:
            return [f"text:{reply}"]
        first = "thinking-call-recall" if self.thinks(number) else "call-recall"
        return [f"{first}:{turn.recall}", f"text:{reply}"]

    def thinks(self, number: int) -> bool:
        config = self.thinking(number)
        return config is not None and (config["type"] == "enabled" or number % 3 == 0)

    def received(self, number: int, turn: Turn, answer: dict[str, Any]) -> None:
        blocks = [b for b in answer.get("content") or [] if isinstance(b, dict)]
        if self.thinks(number) and not (blocks and blocks[0].get("type") == "thinking"):
            thought = f"Reply {number}: deciding the next command."
            blocks.insert(0, {"type": "thinking", "thinking": thought,
                              "signature": sign_thinking(thought)})
        reply = turn.reply
        if reply is not None and reply.call is not None:
            blocks.append({"type": "tool_use", "id": reply.call, "name": "bash",
                           "input": {"command": reply.command}})
        self._append("assistant", blocks or [{"type": "text", "text": DONE}])

    def _append(self, role: str, blocks: list[dict[str, Any]]) -> None:
        if self.history and self.history[-1]["role"] == role:
            self.history.append({"role": "assistant" if role == "user" else "user",
                                 "content": [{"type": "text", "text": DONE}]})
        self.history.append({"role": role, "content": blocks})


def _marked(message: dict[str, Any], marker: dict[str, Any]) -> dict[str, Any]:
    """The message with Claude Code's one message-level marker on its last block."""
    blocks = list(message["content"])
    blocks[-1] = {**blocks[-1], "cache_control": marker}
    return {**message, "content": blocks}


# --- Codex style ------------------------------------------------------------------


class CodexClient:
    """Builds Codex-shaped Responses requests and keeps the items it gets back."""

    path = "/v1/responses"
    key = "input"

    def __init__(self, total: int) -> None:
        self.total = total
        permissions = "<permissions>workspace-write</permissions>"
        self.history: list[dict[str, Any]] = [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": permissions}]}]

    def request(self, number: int, turn: Turn) -> dict[str, Any]:
        for kind, text, call in turn.inputs:
            if kind == "user":
                self.history.append({"type": "message", "role": "user",
                                     "content": [{"type": "input_text", "text": text}]})
            else:
                self.history.append({"type": "function_call_output", "call_id": call,
                                     "output": text})
        return {"model": CODEX_MODEL, "instructions": SYSTEM, "input": list(self.history),
                "tools": [{"type": "function", "name": "shell", "description": "Run a command.",
                           "parameters": {"type": "object",
                                          "properties": {"command": {"type": "string"}}}}],
                "tool_choice": "auto", "parallel_tool_calls": False,
                "reasoning": {"effort": "medium", "summary": "auto"}, "store": False,
                "include": ["reasoning.encrypted_content"], "prompt_cache_key": "bench-codex"}

    def scenarios(self, number: int, turn: Turn) -> list[str]:
        reply = turn.reply.text if turn.reply is not None else DONE
        if turn.recall is None:
            return [f"text:{reply}"]
        return [f"call-recall:{turn.recall}", f"text:{reply}"]

    def received(self, number: int, turn: Turn, answer: dict[str, Any]) -> None:
        reply = turn.reply
        items = [{k: v for k, v in item.items() if k != "id"}
                 for item in answer.get("output") or []
                 if isinstance(item, dict) and item.get("type") == "message"]
        self.history.extend(items)
        if reply is not None and reply.call is not None:
            # The reasoning behind the call, after what the model said (the fake
            # answered with text alone): a recall anchor in that text expands
            # where the follow-up had the recall, so the next request extends it.
            rs_id = f"rs_{number:06d}"
            self.history.append({"type": "reasoning", "id": rs_id, "summary": [],
                                 "encrypted_content": seal_reasoning(rs_id, "")})
            self.history.append({"type": "function_call", "call_id": reply.call,
                                 "name": "shell",
                                 "arguments": orjson.dumps({"command": reply.command}).decode()})


Client = ClaudeClient | CodexClient


def client_for(style: Style, total: int) -> Client:
    return ClaudeClient(total) if style == "claude" else CodexClient(total)


def history_items(body: Any, key: str) -> Iterator[Any]:
    items = body.get(key) if isinstance(body, dict) else None
    yield from items if isinstance(items, list) else ()
