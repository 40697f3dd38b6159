"""The gateway-owned ``recall`` tool: its definition per wire protocol, argument
validation, and the rule for when it is injected (lore-spec B.1, B.2, B.5, B.8).

Everything here is pure: a request body goes in, a new body comes out. The body
the client sent is never mutated, because the proxy still needs the original for
storage and for deciding what the client should see.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from lore_gateway.routing import Family

RECALL_TOOL_NAME = "recall"

Scope = Literal["all", "session", "project", "knowledge"]
SCOPES: tuple[Scope, ...] = ("all", "session", "project", "knowledge")

# B.5: limits of the core recall implementation.
MAX_QUERY_CHARS = 512
MAX_IDS = 8
MAX_ID_CHARS = 256
DEFAULT_DETAIL_LIMIT = 12_000
MAX_DETAIL_LIMIT = 16_000

DESCRIPTION = (
    "Search the user's persistent memory of this project. The conversation you can "
    "see has been trimmed, so earlier parts of it, previous sessions, decisions, "
    "preferences, file paths, earlier approaches, and the people, services and tools "
    "involved may only exist in memory. Recall before assuming. When the user names a "
    "project, repository, person, service or tool you cannot see, recall it before "
    "searching the filesystem. Memory holds long-term knowledge, distilled history and "
    "the raw archive of past turns; distilled summaries are lossy, so verify specifics "
    "by recalling them. For facts about a repository, memory is a pointer: recall to "
    "learn where to look, then read the file or the git history.\n\n"
    "Results carry references such as (t:123) or (d:abc). Pass one to `id`, or several "
    "to `ids`, to fetch the full text; `id` and `ids` exclude each other and ignore "
    "`query`. Detail output is bounded: when a result says it was truncated, call again "
    "with `detailOffset` to read the next range. Items marked [lossy] are summaries.\n\n"
    'Never write recall status lines such as "📚 Searching…" or "📚 Fetching…" '
    "yourself; the gateway shows them."
)

_PROPERTIES: dict[str, dict[str, Any]] = {
    "query": {
        "type": "string",
        "description": "What to search for — be specific. Include keywords, file names, or "
        "concepts.",
    },
    "scope": {
        "type": "string",
        "enum": list(SCOPES),
        "description": "Where to search: 'all' (default) searches everything, 'session' only "
        "this session, 'project' every session of this project, 'knowledge' only long-term "
        "knowledge.",
    },
    "id": {
        "type": "string",
        "description": "Fetch the full content of one result by its reference, e.g. 't:123' "
        "or 'd:abc'.",
    },
    "ids": {
        "type": "array",
        "items": {"type": "string"},
        "description": "Fetch up to 8 known references, in the order given. Excludes `id`; "
        "`query` is ignored.",
    },
    "detailOffset": {
        "type": "integer",
        "description": "Single `id` only: the character offset a truncated earlier result "
        "reported. Starts at 0.",
    },
    "detailLimit": {
        "type": "integer",
        "description": "Single `id` only: the most characters to return. Keep the default "
        "unless a smaller range is enough.",
    },
}


def _plain_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": copy.deepcopy(_PROPERTIES),
        "required": ["query"],
        "additionalProperties": False,
    }


def _strict_parameters() -> dict[str, Any]:
    """OpenAI strict mode: every property listed in ``required`` and made nullable;
    the model sends ``null`` for the ones it does not use."""
    properties: dict[str, Any] = {}
    for name, schema in _PROPERTIES.items():
        nullable = copy.deepcopy(schema)
        nullable["type"] = [schema["type"], "null"]
        if "enum" in nullable:
            nullable["enum"] = [*nullable["enum"], None]
        properties[name] = nullable
    return {
        "type": "object",
        "properties": properties,
        "required": list(_PROPERTIES),
        "additionalProperties": False,
    }


def responses_tool() -> dict[str, Any]:
    """The tool as a Responses API ``function`` tool (strict schema)."""
    return {
        "type": "function",
        "name": RECALL_TOOL_NAME,
        "description": DESCRIPTION,
        "strict": True,
        "parameters": _strict_parameters(),
    }


def chat_tool() -> dict[str, Any]:
    """The tool as a Chat Completions ``function`` tool."""
    return {
        "type": "function",
        "function": {
            "name": RECALL_TOOL_NAME,
            "description": DESCRIPTION,
            "parameters": _plain_parameters(),
        },
    }


def anthropic_tool() -> dict[str, Any]:
    """The tool as an Anthropic Messages client tool."""
    return {
        "name": RECALL_TOOL_NAME,
        "description": DESCRIPTION,
        "input_schema": _plain_parameters(),
    }


def gemini_tool() -> dict[str, Any]:
    """The tool as a Gemini ``tools`` entry: one function declaration, its schema
    as JSON Schema (``parametersJsonSchema``, as Gemini CLI declares its own)."""
    return {"functionDeclarations": [{
        "name": RECALL_TOOL_NAME,
        "description": DESCRIPTION,
        "parametersJsonSchema": _plain_parameters(),
    }]}


# --- arguments ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecallArgs:
    """Validated recall arguments. ``None`` means "not given"."""

    query: str | None = None
    scope: Scope = "all"
    id: str | None = None
    ids: tuple[str, ...] | None = None
    detail_offset: int | None = None
    detail_limit: int | None = None

    @property
    def kind(self) -> Literal["search", "detail", "batch"]:
        if self.ids is not None:
            return "batch"
        if self.id is not None:
            return "detail"
        return "search"

    def as_input(self) -> dict[str, Any]:
        """The arguments as the model would send them, without the unused ones."""
        out: dict[str, Any] = {}
        if self.query is not None:
            out["query"] = self.query
        if self.scope != "all":
            out["scope"] = self.scope
        if self.id is not None:
            out["id"] = self.id
        if self.ids is not None:
            out["ids"] = list(self.ids)
        if self.detail_offset is not None:
            out["detailOffset"] = self.detail_offset
        if self.detail_limit is not None:
            out["detailLimit"] = self.detail_limit
        return out


class RecallArgumentError(ValueError):
    """The model called recall with arguments we cannot run.

    ``issue`` is the stable code logged in diagnostics (B.5); the message is safe to
    show the model and never quotes the arguments.
    """

    def __init__(self, issue: str, message: str) -> None:
        super().__init__(message)
        self.issue = issue

    def tool_result(self) -> str:
        """What the model receives as the tool result for the invalid call."""
        return (
            f"Invalid recall arguments ({self.issue}). Call recall again with a non-empty "
            "query, one valid id, or a non-empty ids list. Set unused arguments to null."
        )


class RecallFrameError(ValueError):
    """The arguments were not a JSON object string at all: a broken frame, not a
    model mistake (B.5, streaming Responses path)."""


def decode_arguments(arguments: Any) -> Any:
    """Decode a function call's ``arguments`` string into JSON."""
    if not isinstance(arguments, str):
        raise RecallFrameError("invalid recall function arguments: expected JSON string")
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise RecallFrameError("invalid recall function arguments: malformed JSON") from None


_KNOWN_KEYS = frozenset(_PROPERTIES)


def parse_arguments(raw: Any) -> RecallArgs:
    """Validate decoded arguments (a dict) per lore-spec B.5; raise
    :class:`RecallArgumentError` with the issue code on the first problem."""
    if not isinstance(raw, dict):
        raise RecallArgumentError("expected_object", "recall arguments must be an object")
    present = {k: v for k, v in raw.items() if v is not None}
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise RecallArgumentError("unknown_property", "recall arguments have an unknown property")

    query = present.get("query")
    if query is not None and not isinstance(query, str):
        raise RecallArgumentError("query_type", "query must be a string")
    if isinstance(query, str) and len(query) > MAX_QUERY_CHARS:
        raise RecallArgumentError(
            "query_length", f"query must be no longer than {MAX_QUERY_CHARS} characters"
        )
    if isinstance(query, str) and not query.strip():
        query = None

    scope = present.get("scope", "all")
    if not isinstance(scope, str):
        raise RecallArgumentError("scope_type", "scope must be a string")
    if scope not in SCOPES:
        raise RecallArgumentError("unsupported_scope", "scope is not supported")

    ref = present.get("id")
    if ref is not None and (not isinstance(ref, str) or not ref.strip() or len(ref) > MAX_ID_CHARS):
        raise RecallArgumentError("id_type", "id must be a non-empty string")

    ids_raw = present.get("ids")
    ids: tuple[str, ...] | None = None
    if ids_raw is not None:
        if (
            not isinstance(ids_raw, list)
            or not 1 <= len(ids_raw) <= MAX_IDS
            or not all(isinstance(i, str) and i.strip() and len(i) <= MAX_ID_CHARS for i in ids_raw)
        ):
            raise RecallArgumentError(
                "ids_type", f"ids must contain 1-{MAX_IDS} strings no longer than 256 characters"
            )
        ids = tuple(ids_raw)
    if ref is not None and ids is not None:
        raise RecallArgumentError("id_conflict", "id and ids conflict")

    offset = present.get("detailOffset")
    if offset is not None and (type(offset) is not int or offset < 0):
        raise RecallArgumentError("detail_offset", "detailOffset must be non-negative")
    limit = present.get("detailLimit")
    if limit is not None and (type(limit) is not int or not 1 <= limit <= MAX_DETAIL_LIMIT):
        raise RecallArgumentError("detail_limit", f"detailLimit must be 1-{MAX_DETAIL_LIMIT}")
    if (offset is not None or limit is not None) and ref is None:
        raise RecallArgumentError("detail_without_id", "detail ranges require one id")

    if query is None and ref is None and ids is None:
        raise RecallArgumentError("missing_selector", "query, id, or ids is required")
    return RecallArgs(
        query=query,
        scope=scope,
        id=ref,
        ids=ids,
        detail_offset=offset,
        detail_limit=limit,
    )


# --- injection (B.8) ------------------------------------------------------------------

Protocol = Family  # the tool is defined per wire-format family (routing.Family)

# Anthropic server tools carry a versioned ``type`` (web_search_20250305, ...); a
# client tool has no type or type "custom".
_ANTHROPIC_CLIENT_TOOL_TYPES = (None, "custom")


def _tool_names(protocol: Protocol, tool: dict[str, Any]) -> list[str]:
    """The function names a tool entry declares (a Gemini entry declares several)."""
    if protocol == "gemini":
        declared = tool.get("functionDeclarations", tool.get("function_declarations"))
        if not isinstance(declared, list):
            return []
        return [d["name"] for d in declared
                if isinstance(d, dict) and isinstance(d.get("name"), str)]
    name = _tool_name(protocol, tool)
    return [] if name is None else [name]


def _declares_recall(protocol: Protocol, tool: dict[str, Any]) -> bool:
    """Whether a tool entry declares a function named ``recall`` (a list of
    names built only for Gemini's entries, which declare several)."""
    if protocol == "gemini":
        return RECALL_TOOL_NAME in _tool_names(protocol, tool)
    return _tool_name(protocol, tool) == RECALL_TOOL_NAME


def _tool_name(protocol: Protocol, tool: dict[str, Any]) -> str | None:
    if protocol == "chat":
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
    else:
        name = tool.get("name")
    return name if isinstance(name, str) else None


def _is_callable_function(protocol: Protocol, tool: dict[str, Any]) -> bool:
    if protocol == "gemini":
        return bool(_tool_names(protocol, tool))
    kind = tool.get("type")
    if protocol == "anthropic":
        return kind in _ANTHROPIC_CLIENT_TOOL_TYPES
    if protocol == "chat":
        return kind == "function"
    # Responses: ``custom`` tools (Codex's apply_patch) are client-executed too.
    return kind in ("function", "custom")


def should_inject(protocol: Protocol, body: dict[str, Any], *, codex_client: bool = False) -> bool:
    """Whether the gateway adds its recall tool to this request (B.8); see
    :func:`injection_refusal` for the rule."""
    return injection_refusal(protocol, body, codex_client=codex_client) is None


def injection_refusal(protocol: Protocol, body: dict[str, Any], *,
                      codex_client: bool = False) -> str | None:
    """Why the recall tool is *not* added to this request, or None when it is.

    Only when the client offers at least one callable function tool (a request with
    no tools is a plain completion, often an internal title or summary call), has no
    tool of its own named ``recall`` (that one is passed through untouched and never
    intercepted), and did not explicitly ask for parallel tool calls.

    The Codex CLI sends ``parallel_tool_calls: true`` on every request as a model
    capability default, not as a choice the user made, so for it (``codex_client``)
    that flag does not block injection; the gateway turns it off like for everyone.
    """
    tools = body.get("tools")
    if not isinstance(tools, list):
        return "no client tool"
    tool_dicts = [t for t in tools if isinstance(t, dict)]
    if not any(_is_callable_function(protocol, t) for t in tool_dicts):
        return "no callable client tool"
    if any(_declares_recall(protocol, t) for t in tool_dicts):
        return "the client has its own recall tool"
    if protocol == "gemini" and _candidate_count(body) > 1:
        # The live path relays one candidate (recall/gemini/live.py).
        return "the client asked for several candidates"
    if (protocol in ("responses", "chat") and body.get("parallel_tool_calls") is True
            and not codex_client):
        return "the client asked for parallel tool calls"
    return None


def inject(
    protocol: Protocol, body: dict[str, Any], *, codex_client: bool = False
) -> dict[str, Any] | None:
    """Return a copy of ``body`` with the recall tool added and parallel tool use
    disabled, or None when :func:`should_inject` says no."""
    if not should_inject(protocol, body, codex_client=codex_client):
        return None
    return with_recall_tool(protocol, body)


# The injected definitions, built once (a strict schema is a deep copy, most of
# the cost of preparing a request). Shared by every upstream body: request
# transforms never mutate a payload (pipeline/transforms.py), so sharing is safe.
_INJECTED: dict[str, dict[str, Any]] = {
    "responses": responses_tool(),
    "chat": chat_tool(),
    "anthropic": anthropic_tool(),
    "gemini": gemini_tool(),
}


def with_recall_tool(protocol: Protocol, body: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``body`` with the recall tool added and parallel tool use disabled
    (for a body :func:`should_inject` accepted). Gemini has no switch for
    parallel calls: a second recall in one answer fails the chain
    (``parallel_recall``)."""
    out = dict(body)
    tools = [*body["tools"], _INJECTED[protocol]]
    if protocol in ("responses", "chat"):
        out["parallel_tool_calls"] = False
    elif protocol == "anthropic":
        choice = body.get("tool_choice")
        if choice is None:
            out["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
        elif isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool"):
            out["tool_choice"] = {**choice, "disable_parallel_tool_use": True}
    out["tools"] = tools
    return out


def is_recall_call(name: Any) -> bool:
    """Whether a function call with this name is the gateway's recall. Only valid to
    ask for requests the gateway injected recall into."""
    return bool(name == RECALL_TOOL_NAME)


def has_recall_tool(protocol: Protocol, body: dict[str, Any]) -> bool:
    """Whether the body's tool list has a function tool named ``recall``."""
    tools = body.get("tools")
    return isinstance(tools, list) and any(
        isinstance(t, dict) and _declares_recall(protocol, t) for t in tools)


def _candidate_count(body: dict[str, Any]) -> int:
    config = body.get("generationConfig", body.get("generation_config"))
    if not isinstance(config, dict):
        return 1
    count = config.get("candidateCount", config.get("candidate_count"))
    return count if isinstance(count, int) and not isinstance(count, bool) else 1
