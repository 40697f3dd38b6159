"""Why a search result matched: the words it shares with the query, and where.

Search scores a message by its own words, by the message before it (the context
index) and by meaning (vectors); the page shows which of these found it, with
the query's words marked in a window of the text around the first of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from markupsafe import Markup, escape

from lore_gateway.memory.search.hits import Hit
from lore_gateway.memory.search.query import parse_query
from lore_gateway.storage.base import Connection
from lore_gateway.ui import queries

# Characters of a result shown around its first matching word.
SNIPPET_CHARS = 360


@dataclass(frozen=True, slots=True)
class Explained:
    hit: Hit
    message: queries.ShownMessage
    matched: str  # "message" | "context" | "meaning"
    words: tuple[str, ...]
    snippet: Markup

    @property
    def percent(self) -> int:
        return round(float(self.hit.score) * 100)

    @property
    def message_id(self) -> int:
        return int(str(self.hit.ref).removeprefix("t:"))


def _pattern(terms: tuple[str, ...]) -> re.Pattern[str] | None:
    if not terms:
        return None
    # A word matches when it starts with a term (search matches prefixes and stems).
    alternatives = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
    return re.compile(rf"\b(?:{alternatives})\w*", re.IGNORECASE)


def snippet(text: str, pattern: re.Pattern[str] | None, size: int = SNIPPET_CHARS) -> Markup:
    """``size`` characters of ``text`` around the first match, every match marked."""
    first = pattern.search(text) if pattern else None
    start = max(0, (first.start() if first else 0) - size // 3)
    end = min(len(text), start + size)
    window = text[start:end]
    out = [Markup("…") if start else Markup("")]
    last = 0
    for found in pattern.finditer(window) if pattern else ():
        out.append(escape(window[last:found.start()]))
        out.append(Markup("<mark>{}</mark>").format(found.group(0)))
        last = found.end()
    out.append(escape(window[last:]))
    if end < len(text):
        out.append(Markup("…"))
    return Markup("").join(out)


def explain(conn: Connection, tenant: str, query: str, hit: Hit) -> Explained:
    terms = parse_query(query).terms
    pattern = _pattern(terms)
    mid = int(str(hit.ref).removeprefix("t:"))
    message = queries.shown(mid, hit.role, hit.content, 0, False)
    words = tuple(dict.fromkeys(m.group(0).lower() for m in pattern.finditer(hit.content))
                  ) if pattern else ()
    matched = "message"
    if not words:
        row = conn.execute("SELECT content FROM messages WHERE tenant = ? AND session = ?"
                           " AND id < ? ORDER BY id DESC LIMIT 1",
                           (tenant, hit.session, mid)).fetchone()
        before = str(row[0]) if row else ""
        words = tuple(dict.fromkeys(m.group(0).lower() for m in pattern.finditer(before))
                      ) if pattern else ()
        matched = "context" if words else "meaning"
    return Explained(hit, message, matched, words, snippet(message.body, pattern))
