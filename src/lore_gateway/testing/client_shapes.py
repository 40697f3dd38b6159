"""Request shapes of clients nobody here wrote, built as they build them (tests).

No captured request of these clients is kept in ../shared/fixtures, so each
shape is rebuilt from the client's source, which is named beside it. The texts
are short excerpts; what matters is the structure a request has and which of
its parts are the same in every conversation.

* **aider 0.86** (Aider-AI/aider, ``aider/coders/base_coder.py``
  ``format_chat_chunks`` and ``get_*_messages``, ``base_prompts.py``,
  ``editblock_prompts.py``, ``aider/prompts.py``, ``aider/history.py``): Chat
  Completions through litellm, no tools, no session header. Every request
  opens with the system prompt, an example exchange and its retraction ("I
  switched to a new code base…" / "Ok."), then priming pairs the client answers
  itself ("Ok, …"): the repository map, the files in the chat; then the
  conversation (``done``), then the newest message (``cur``), then the system
  reminder, as a system message or appended to the newest message. Its helper
  calls (commit messages, history summaries) are one system and one user
  message.
* **OpenCode 1.x** (anomalyco/opencode, ``packages/opencode/src/session/llm/
  request.ts``; ``agent/prompt/title.txt``; ``session/prompt.ts``
  ``ensureTitle``): ``X-Session-Id`` and ``x-session-affinity`` carry the
  session id (``ses_…``) on every request, its title call's too. The agent's
  system prompt holds an ``<env>`` block with the working directory; the title
  call has the title agent's prompt, no tools, and the user's first message
  after "Generate a title for this conversation:".
* **SDK agents** (OpenAI Agents SDK ``Agent(instructions=…, tools=[…])`` on
  Responses; pydantic-ai ``Agent(system_prompt=…, tools=[…])`` on Chat): a
  one-line prompt, tools, no session header.
* **Claude Code's helper calls** (claude-cli 0.2.107, a logged request in
  RavenStorm-bit/claude-code-api-logger ``full-requests-clean.md``): its title
  call asks a small model, without tools, to "Summarize this coding
  conversation in under 50 characters".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# --- aider -------------------------------------------------------------------------

AIDER_MAIN_SYSTEM = (
    "Act as an expert software developer.\nAlways use best practices when coding.\n"
    "Respect and use existing conventions, libraries, etc that are already present in the "
    "code base.\nTake requests for changes to the supplied code.\nIf the request is "
    "ambiguous, ask questions.\n\nOnce you understand the request you MUST:\n\n1. Decide if "
    "you need to propose *SEARCH/REPLACE* edits to any files that haven't been added to the "
    "chat.\n2. Think step-by-step and explain the needed changes in a few short sentences.\n"
    "3. Describe each change with a *SEARCH/REPLACE block* per the examples below.\n")
AIDER_EXAMPLE = (
    {"role": "user", "content": "Change get_factorial() to use math.factorial"},
    {"role": "assistant", "content": (
        "To make this change we need to modify `mathweb/flask/app.py` to:\n\n1. Import the "
        "math package.\n2. Remove the existing factorial() function.\n3. Update "
        "get_factorial() to call math.factorial instead.\n\nHere are the *SEARCH/REPLACE* "
        "blocks:\n\nmathweb/flask/app.py\n```python\n<<<<<<< SEARCH\nfrom flask import Flask\n"
        "=======\nimport math\nfrom flask import Flask\n>>>>>>> REPLACE\n```\n")},
)
AIDER_RETRACTION = (
    {"role": "user", "content": "I switched to a new code base. Please don't consider the "
                                "above files or try to edit them any longer."},
    {"role": "assistant", "content": "Ok."},
)
AIDER_REMINDER = (
    "# *SEARCH/REPLACE block* Rules:\n\nEvery *SEARCH/REPLACE block* must use this format:\n"
    "1. The *FULL* file path alone on a line, verbatim.\n2. The opening fence and code "
    "language, eg: ```python\n3. The start of search block: <<<<<<< SEARCH\n\nONLY EVER "
    "RETURN CODE IN A *SEARCH/REPLACE BLOCK*!\n")
AIDER_NO_FILES = (
    {"role": "user", "content": (
        "Don't try and edit any existing code without asking me to add the files to the "
        "chat!\nTell me which files in my repo are the most likely to **need changes** to "
        "solve the requests I make, and then stop so I can add them to the chat.\n")},
    {"role": "assistant", "content": (
        "Ok, based on your requests I will suggest which files need to be edited and then "
        "stop and wait for your approval.")},
)
AIDER_COMMIT_SYSTEM = (
    "You are an expert software engineer that generates concise, one-line Git commit "
    "messages based on the provided diffs.\nReview the provided context and diffs which are "
    "about to be committed to a git repo.\nReply only with the one-line commit message, "
    "without any additional text, explanations, or line breaks.\n")
AIDER_SUMMARIZE = (
    "*Briefly* summarize this partial conversation about programming.\nInclude less detail "
    "about older parts and more detail about the most recent messages.\nStart the summary "
    "with \"I asked you...\".\n")


def aider_repo_map(files: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
    """The repository-map pair (``get_repo_messages``): it changes as files do."""
    listing = "\n".join(f"{name}:\n⋮\n│def main():" for name in files)
    return ({"role": "user", "content": "Here are summaries of some files present in my git "
                                        "repository.\nDo not propose changes to these files, "
                                        f"treat them as *read-only*.\n\n{listing}"},
            {"role": "assistant",
             "content": "Ok, I won't try and edit those files without asking first."})


@dataclass
class AiderChat:
    """One aider conversation: ``request`` is what aider sends for the user's
    newest message, ``answered`` moves the exchange into its history.

    ``examples_as_sys_msg`` puts the example into the system prompt instead of
    messages (Claude models' settings); ``reminder`` is ``"sys"`` (a system
    message at the end) or ``"user"`` (appended to the newest message, the
    default of models without settings of their own); ``use_system_prompt``
    False sends the system prompt as a user message answered "Ok."."""

    examples_as_sys_msg: bool = False
    reminder: str = "sys"
    use_system_prompt: bool = True
    files: tuple[str, ...] = ("src/app.py", "src/config.py")
    model: str = "gpt-fake"
    done: list[dict[str, str]] = field(default_factory=list)
    cur: list[dict[str, str]] = field(default_factory=list)

    def request(self, text: str, *, stream: bool = True) -> dict[str, Any]:
        self.cur = [{"role": "user", "content": text}]
        return {"model": self.model, "stream": stream, "temperature": 0,
                "messages": self.messages()}

    def answered(self, reply: str) -> None:
        self.done += [*self.cur, {"role": "assistant", "content": reply}]
        self.cur = []

    def messages(self) -> list[dict[str, str]]:
        system = AIDER_MAIN_SYSTEM
        examples: list[dict[str, str]] = []
        if self.examples_as_sys_msg:
            system += "\n# Example conversations:\n\n" + "".join(
                f"## {m['role'].upper()}: {m['content']}\n\n" for m in AIDER_EXAMPLE)
        else:
            examples = [*AIDER_EXAMPLE, *AIDER_RETRACTION]
        system += "\n" + AIDER_REMINDER
        head = ([{"role": "system", "content": system}] if self.use_system_prompt else
                [{"role": "user", "content": system}, {"role": "assistant", "content": "Ok."}])
        cur = list(self.cur)
        tail: list[dict[str, str]] = []
        if self.reminder == "sys":
            tail = [{"role": "system", "content": AIDER_REMINDER}]
        elif cur:
            cur[-1] = {**cur[-1], "content": cur[-1]["content"] + "\n\n" + AIDER_REMINDER}
        return [*head, *examples, *aider_repo_map(self.files), *self.done, *AIDER_NO_FILES,
                *cur, *tail]


def aider_commit_request(diff: str, model: str = "gpt-fake") -> dict[str, Any]:
    """aider's commit-message call (``aider/repo.py`` ``get_commit_message``)."""
    return {"model": model, "stream": False, "temperature": 0, "messages": [
        {"role": "system", "content": AIDER_COMMIT_SYSTEM},
        {"role": "user", "content": f"# Diffs:\n{diff}"}]}


def aider_summarize_request(history: str, model: str = "gpt-fake") -> dict[str, Any]:
    """aider's history summary (``aider/history.py`` ``summarize_all``)."""
    return {"model": model, "stream": False, "messages": [
        {"role": "system", "content": AIDER_SUMMARIZE},
        {"role": "user", "content": history}]}


# --- OpenCode ----------------------------------------------------------------------

OPENCODE_SYSTEM = (
    "You are opencode, an interactive CLI tool that helps users with software engineering "
    "tasks. Use the instructions below and the tools available to you to assist the user.\n")
OPENCODE_TITLE_SYSTEM = (
    "You are a title generator. You output ONLY a thread title. Nothing else.\n\n<task>\n"
    "Generate a brief title that would help the user find this conversation later.\n\n"
    "Follow all rules in <rules>\nYour output must be:\n- A single line\n- ≤50 characters\n"
    "- No explanations\n</task>\n")
OPENCODE_TOOLS = [{"name": name, "description": f"The {name} tool.",
                   "input_schema": {"type": "object", "properties": {}}}
                  for name in ("bash", "read", "edit", "glob", "grep")]


def opencode_headers(session: str) -> dict[str, str]:
    """What OpenCode adds to a request to any provider but its own."""
    return {"x-session-affinity": session, "x-session-id": session,
            "user-agent": "opencode/1.18.3"}


def opencode_env(project: str) -> str:
    """The environment block of OpenCode's system prompt (``session/system.ts``)."""
    return ("Here is some useful information about the environment you are running in:\n"
            f"<env>\n  Working directory: {project}\n  Is directory a git repo: yes\n"
            "  Platform: linux\n</env>")


def opencode_request(project: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """An OpenCode agent turn on Anthropic Messages (``@ai-sdk/anthropic``)."""
    return {"model": "claude-fake", "max_tokens": 32000, "stream": True,
            "system": [{"type": "text", "text": OPENCODE_SYSTEM},
                       {"type": "text", "text": opencode_env(project)}],
            "tools": OPENCODE_TOOLS, "messages": messages}


def opencode_title_request(first_message: str) -> dict[str, Any]:
    """OpenCode's title call: the title agent's prompt, no tools, and the
    conversation's first user message (the AI SDK merges the two user messages
    into one Anthropic message of two text parts)."""
    return {"model": "claude-fake-small", "max_tokens": 32000, "stream": True,
            "system": [{"type": "text", "text": OPENCODE_TITLE_SYSTEM}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Generate a title for this conversation:\n"},
                {"type": "text", "text": first_message}]}]}


# --- SDK agents and Claude Code's helpers -------------------------------------------

def agents_sdk_request(question: str) -> dict[str, Any]:
    """An OpenAI Agents SDK agent with one tool (Responses)."""
    return {"model": "gpt-fake", "instructions": "You are a helpful assistant.",
            "input": [{"role": "user", "content": question}], "stream": False,
            "tools": [{"type": "function", "name": "get_weather", "strict": True,
                       "parameters": {"type": "object", "properties": {
                           "city": {"type": "string"}}, "required": ["city"],
                           "additionalProperties": False}}]}


def pydantic_ai_request(question: str) -> dict[str, Any]:
    """A pydantic-ai agent with one tool (Chat Completions)."""
    return {"model": "gpt-fake", "messages": [
        {"role": "system", "content": "Be concise, reply with one sentence."},
        {"role": "user", "content": question}],
        "tools": [{"type": "function", "function": {
            "name": "roll_dice", "description": "Roll a six-sided die.",
            "parameters": {"type": "object", "properties": {}}}}]}


def claude_code_title_request(transcript: str) -> dict[str, Any]:
    """Claude Code's title call (claude-cli 0.2.107): a small model, no tools."""
    return {"model": "claude-fake-haiku", "max_tokens": 512, "stream": True, "temperature": 0,
            "system": [{"type": "text", "text": (
                "Summarize this coding conversation in under 50 characters.\nCapture the main "
                "task, key files, problems addressed, and current status.")}],
            "messages": [{"role": "user", "content": (
                f"Please write a 5-10 word title the following conversation:\n\n{transcript}\n\n"
                "Respond with the title for the conversation and nothing else.")}]}
