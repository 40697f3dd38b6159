"""What must never reach the store: recall markers and anchors, and credentials.

The recall markers are the gateway's own traces in a transcript (lore-spec B.6).
Storing them would make the FTS index echo "📚 Searching …" back on later searches,
so they are removed before a message is written. The patterns live here so the
recall code that emits and parses them uses the very same definitions.

Credential redaction is a second line of defence: headers are never stored, but a
user may paste a key into a prompt or a tool may print one.

``storable`` is the one boundary for text that SQLite and UTF-8 log files cannot
take: lone surrogates (a JSON ``"\\ud800"`` decoded by a lenient parser) and NUL.
Every string of a turn goes through it once, on the writer thread, and every log
field goes through it in the log processor.
"""

from __future__ import annotations

import re

# --- recall markers and anchors (lore-spec B.6) --------------------------------------

SCOPE_LABELS = {
    "all": "all archives",
    "session": "session history",
    "project": "project archives",
    "knowledge": "knowledge base",
}

_LABELS = "|".join(re.escape(label) for label in SCOPE_LABELS.values())
# 📚 Searching <label> for "<query>"…   (U+1F4DA … U+2026). Matched wherever it
# appears: a client may render the marker inline, mid-line.
SEARCH_MARKER_RE = re.compile(rf'📚 Searching (?P<label>{_LABELS}) for "(?P<query>[^\n]*?)"…')
# 📚 Fetching detail for <id>…   (ids look like t:123, k:abc, xk:…, lat:…)
DETAIL_MARKER_RE = re.compile(r"📚 Fetching detail for (?P<id>[a-z]+:[^\s…]+)…")
# The invisible anchor: <!-- lore-recall:<lower-case uuid v4> -->
_UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
ANCHOR_RE = re.compile(rf"<!-- lore-recall:(?P<uuid>{_UUID4}) -->")


def strip_recall_traces(text: str) -> str:
    """Remove marker lines and anchors, and the blank lines they leave behind."""
    if "📚" not in text and "lore-recall:" not in text:
        return text
    stripped = ANCHOR_RE.sub("", text)
    stripped = SEARCH_MARKER_RE.sub("", stripped)
    stripped = DETAIL_MARKER_RE.sub("", stripped)
    stripped = re.sub(r"[ \t]+\n", "\n", stripped)
    return re.sub(r"\n{3,}", "\n\n", stripped).strip()


# --- storable text ----------------------------------------------------------------

REPLACEMENT_CHAR = "\ufffd"
# Any surrogate code point in a Python str is a lone one (valid pairs decode to a
# single astral character), so the class needs no pairing logic.
_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with lone surrogates and NUL replaced by U+FFFD, so that it encodes
    as UTF-8 (SQLite, log files) and is not cut short at a NUL by C code."""
    if text.isascii() and "\x00" not in text:
        return text
    return _UNSTORABLE_RE.sub(REPLACEMENT_CHAR, text)


# --- credentials ---------------------------------------------------------------------

REDACTED = "[redacted]"

_CREDENTIAL_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization: Bearer <token> (also "bearer" in curl commands and logs).
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), rf"\1{REDACTED}"),
    # x-api-key: <value> / "x-api-key": "<value>" / api_key=<value>
    (
        re.compile(r"""(?i)\b((?:x-api-key|api[_-]?key)["']?\s*[:=]\s*["']?)[^\s"',;]{6,}"""),
        rf"\1{REDACTED}",
    ),
    # A Gemini API key in a URL's query (``?key=...``, ``&key=...``).
    (re.compile(r"([?&]key=)[^&\s\"'#]+"), rf"\1{REDACTED}"),
    # Google API keys: AIza and 35 more characters.
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), REDACTED),
    # Provider key shapes: sk-..., sk-ant-..., sk-proj-..., OAuth sk-ant-oat...
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), REDACTED),
    # JWTs (ChatGPT access tokens and friends): three base64url parts, header first.
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), REDACTED),
)


# One cheap scan decides whether the substitutions are needed at all; nearly
# every message has none of these substrings, and the writer cleans every message.
_MAYBE_CREDENTIAL_RE = re.compile(r"(?i)bearer|api[_-]?key|sk-|eyJ|key=|AIza")


def redact_credentials(text: str) -> str:
    if _MAYBE_CREDENTIAL_RE.search(text) is None:
        return text
    for pattern, replacement in _CREDENTIAL_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# --- size cap ------------------------------------------------------------------------


def cap_utf8(text: str, max_bytes: int) -> tuple[str, bool]:
    """Cut ``text`` to at most ``max_bytes`` of UTF-8 plus an explicit note.

    The note says how much was cut so that a reader (or the model, through recall)
    knows the stored copy is partial. The cut never splits a character.
    """
    encoded = text.encode("utf-8")
    total = len(encoded)
    if total <= max_bytes:
        return text, False
    kept = encoded[:max_bytes].decode("utf-8", errors="ignore")
    cut = total - len(kept.encode("utf-8"))
    return f"{kept}\n[lore: truncated {cut:,} of {total:,} bytes]", True


def clean_for_storage(text: str, max_bytes: int) -> tuple[str, bool]:
    """Everything a message goes through before it is written: strip, redact, cap."""
    return cap_utf8(redact_credentials(strip_recall_traces(text)), max_bytes)
