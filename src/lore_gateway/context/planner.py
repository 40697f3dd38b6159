"""The layer planner: what a session's upstream context is (sans-IO).

``plan`` takes the request (after anchor expansion), its body length, the
session's :class:`SessionState` and, when a rewrite is due, the session's
distillations, and returns a :class:`Plan`: pass the client's history through,
keep the frozen layout (``steady``), or rewrite it. ``render`` turns a state
into the upstream history. Both are pure: dict in, dict out.

The upstream history of a managed session is
``lead`` (the client's system/developer items, untouched) + the distilled
prefix (a frozen user/assistant pair) + the raw tail (``items[cut:]``, append
only). Between rewrites nothing before the newest items changes, so every
request is a byte-for-byte extension of the previous one. A rewrite happens
only when the estimate passes the budget, the cache has gone cold, the client
replaced its history, or an overflow forced a higher layer.

Layers (docs/context.md): 0 passthrough; 1 prefix + raw tail; 2 also strips old
tool outputs (the last rounds' protected); 3 protects only the last round and
keeps at most 5 distillations; 4 (emergency) keeps 2 distillations and a tail
sized to fit, truncating single huge outputs instead of stripping them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import orjson

from lore_gateway.context import history as h
from lore_gateway.context.request import turn_request
from lore_gateway.protocols.history import HistoryAdapter

# Tokens per byte of request JSON before a session is calibrated (English and
# code run 3.3-4 bytes per token; JSON escaping adds bytes): deliberately high.
DEFAULT_RATIO = 0.3
# Until the upstream reported usage once, estimates are inflated by this much.
UNCALIBRATED_SAFETY = 1.3
# Weight of the previous ratio in the per-session moving average.
CALIBRATION_KEEP = 0.7
# After a rewrite the context is sized to this share of the budget, so the raw
# tail can grow for many turns before the next rewrite.
REWRITE_TARGET = 0.45
# A recall follow-up (the planned context plus recall pairs) may fill the
# window up to the budget share plus this much before it is re-planned smaller.
FOLLOW_UP_HEADROOM = 0.1
FOLLOW_UP_MAX_SHARE = 0.95
# The emergency layer fills at most this share of the budget.
EMERGENCY_FILL = 0.9
EMERGENCY = 4
# Characters of the user's request repeated in the prefix after a mid-turn cut.
REQUEST_KEEP_CHARS = 4_000
# Repeated after a mid-turn cut when no user text precedes it, so the tail's
# assistant round still follows a user message.
REQUEST_UNKNOWN = "(the request is in the session history above)"
# Request-size marks kept per session (when each history length was first
# seen), thinned by half when full: enough to date a cut anywhere.
MAX_MARKS = 256
BYTES_PER_TOKEN_TEXT = 4  # for sizing distillation text (prose)

Action = Literal["pass", "steady", "rewrite", "load"]


@dataclass(frozen=True, slots=True)
class LayerRule:
    strip: bool  # strip old tool outputs
    protect_rounds: int  # rounds at the end whose outputs are never stripped
    max_rows: int | None  # distillations kept (None: as many as fit)
    distilled_share: float  # of the budget, for the prefix


LAYERS: dict[int, LayerRule] = {
    1: LayerRule(False, 0, None, 0.25),
    2: LayerRule(True, 4, None, 0.25),
    3: LayerRule(True, 1, 5, 0.15),
    EMERGENCY: LayerRule(False, 0, 2, 0.10),
}


@dataclass(frozen=True, slots=True)
class Distilled:
    """One distillation as the prefix uses it."""

    id: int
    text: str
    generation: int
    last_at: float  # when its newest source message was stored


class SessionState(msgspec.Struct, frozen=True):
    """Everything the planner keeps per session (persisted by ``store``).

    A msgspec Struct, not a frozen dataclass: every request replaces it at least
    twice, and ``dataclasses.replace`` on 24 frozen fields cost ~20 µs a call
    (``msgspec.structs.replace`` ~0.6 µs)."""

    layer: int = 0
    force_min: int = 0
    lead: int = 0
    cut: int = 0
    strip_end: int = 0
    truncate_to: int = 0
    fingerprint: str = ""
    prefix: str = ""
    prefix_ids: tuple[int, ...] = ()
    request: str = ""  # the user's request of the turn the tail starts inside
    breakpoint: bool = False
    # Client history indices (before the cut) of system messages kept after the
    # prefix's user message, where they are valid on every protocol.
    system_kept: tuple[int, ...] = ()
    # A context-length error at the top layer: the next request re-plans (with
    # the ratio the error implied) instead of resending the same bytes.
    overflowed: bool = False
    # Tokens the next rewrite leaves free (a recall follow-up's pairs), then 0.
    reserve: int = 0
    dropped_bytes: int = 0  # client bytes not sent, net of the prefix added
    ratio: float = DEFAULT_RATIO
    samples: int = 0
    last_at: float = 0.0
    marks: tuple[tuple[int, float], ...] = ()
    rewrites: int = 0
    window_cap: int = 0  # the window an overflow error reported (0: none)
    input_tokens: int = 0
    cache_read: int = 0

    @property
    def cache_read_share(self) -> float | None:
        return self.cache_read / self.input_tokens if self.input_tokens else None


@dataclass(frozen=True, slots=True)
class Plan:
    state: SessionState
    action: Action
    reason: str = ""
    estimate: int = 0  # estimated upstream input tokens
    rendered: bool = False  # a rewrite that re-rendered the distilled prefix


@dataclass(frozen=True, slots=True)
class Limits:
    window: int
    share: float

    @property
    def budget(self) -> int:
        return int(self.window * self.share)


def plan(history: HistoryAdapter, payload: dict[str, Any], body_len: int, state: SessionState,
         limits: Limits, now: float, distilled: list[Distilled] | None = None) -> Plan:
    """What this request's upstream history is. ``action == "load"``: a rewrite
    is due and needs ``distilled``; call again with them."""
    items = payload.get(history.items_key)
    if not isinstance(items, list):
        return Plan(state, "pass")
    ratio = state.ratio * (UNCALIBRATED_SAFETY if state.samples == 0 else 1.0)
    if state.window_cap:
        limits = Limits(min(limits.window, state.window_cap), limits.share)
    budget = limits.budget
    cold = state.last_at > 0 and now - state.last_at > history.cache_ttl(payload)
    st = msgspec.structs.replace(state, last_at=now, marks=_mark(state.marks, len(items), now))
    if st.layer == 0 and st.force_min == 0 and not st.reserve:
        estimate = int(body_len * ratio)
        if estimate <= budget:
            return Plan(st, "pass", estimate=estimate)
        reason = "budget"
    elif st.layer > 0 and not _anchored(items, st):
        estimate = int(body_len * ratio)
        if estimate <= budget and st.force_min == 0:
            # The client replaced its history (its own compaction) and it fits.
            return Plan(_reset(st), "pass", "client_changed", estimate)
        reason = "client_changed"
    elif st.force_min > st.layer or st.overflowed:
        reason = "overflow"
    elif cold and st.layer > 0:
        reason = "cold"
    elif st.reserve:
        reason = "budget"
    else:
        estimate = int((body_len - st.dropped_bytes) * ratio)
        if st.layer > 0 and estimate <= budget:
            return Plan(st, "steady", estimate=estimate)
        reason = "budget"
    if distilled is None:
        return Plan(st, "load", reason)
    return _rewrite(history, payload, items, body_len, st, limits, ratio, reason, distilled)


def calibrate(state: SessionState, sent_bytes: int, prompt_tokens: int,
              cache_read: int) -> SessionState:
    """Fold one upstream usage report (input + cache read + cache write, the
    real figures) into the session's tokens-per-byte ratio and cache tallies."""
    if sent_bytes <= 0 or prompt_tokens <= 0:
        return state
    sample = prompt_tokens / sent_bytes
    ratio = sample if state.samples == 0 else (
        CALIBRATION_KEEP * state.ratio + (1 - CALIBRATION_KEEP) * sample)
    return msgspec.structs.replace(state, ratio=ratio, samples=state.samples + 1,
                               input_tokens=state.input_tokens + prompt_tokens,
                               cache_read=state.cache_read + min(cache_read, prompt_tokens))


def reserve(state: SessionState, extra_bytes: int) -> SessionState:
    """A recall follow-up needs ``extra_bytes`` more than the planned context:
    the next plan rewrites (at this layer if it can) leaving that room."""
    ratio = state.ratio * (UNCALIBRATED_SAFETY if state.samples == 0 else 1.0)
    return msgspec.structs.replace(state, reserve=int(extra_bytes * ratio) + 1)


def follow_up_ceiling(share: float) -> float:
    """The share of the window a recall follow-up may fill (0.8 by default)."""
    return min(FOLLOW_UP_MAX_SHARE, share + FOLLOW_UP_HEADROOM)


def force_layer(state: SessionState, overflow_ratio: float | None,
                limit: int | None = None, sent_bytes: int = 0) -> SessionState:
    """After a context-length error: at least one layer up, 3 on a large
    overflow; the window the error reported caps the session's budget.

    The error's own token count (``overflow_ratio`` × ``limit``) for the bytes
    that were sent is the truest calibration there is: the ratio never stays
    below it. At the top layer the next request re-plans with it (a smaller
    tail) instead of resending what was refused."""
    floor = 3 if (overflow_ratio or 1.3) >= 1.2 else 2
    cap = min(limit, state.window_cap or limit) if limit else state.window_cap
    ratio, samples = state.ratio, state.samples
    if overflow_ratio and limit and sent_bytes > 0:
        ratio, samples = max(ratio, overflow_ratio * limit / sent_bytes), max(1, samples)
    return msgspec.structs.replace(state, force_min=min(EMERGENCY, max(floor, state.layer + 1)),
                               window_cap=cap, ratio=ratio, samples=samples, overflowed=True)


def render(history: HistoryAdapter, payload: dict[str, Any],
           state: SessionState) -> dict[str, Any]:
    """The upstream payload for a managed session (the payload itself at layer 0)."""
    key = history.items_key
    items = payload.get(key)
    if state.layer == 0 or not isinstance(items, list) or len(items) <= state.cut:
        return payload
    tail = items[state.cut:]
    if state.strip_end > state.cut or state.truncate_to:
        limit = state.truncate_to or None
        tail = [h.strip_output(history, item, limit)
                if limit is not None or state.cut + i < state.strip_end else item
                for i, item in enumerate(tail)]
    tail = h.repair_boundary(history, tail)
    marker = history.cache_marker(payload, tail) if state.breakpoint else None
    prefix = h.prefix_items(history, state.prefix, request=state.request,
                            cache_control=marker, system=_kept(items, state))
    new_items = [*items[:state.lead], *prefix, *tail]
    out = dict(payload)
    out[key] = history.fit_breakpoints(payload, new_items, state.lead + len(prefix))
    return out


def prefix_length(state: SessionState) -> int:
    """History items the prefix adds (0 when the session is not managed)."""
    if state.layer == 0:
        return 0
    return 2 + len(state.system_kept) + (1 if state.request else 0)


def remap(state: SessionState, position: int) -> int:
    """Where client history index ``position`` is in the rendered history; an
    index inside the replaced part maps to the start of the raw tail."""
    if state.layer == 0 or position < state.lead:
        return position
    start = state.lead + prefix_length(state)
    return start + max(0, position - state.cut)


# --- rewriting ------------------------------------------------------------------


def _rewrite(history: HistoryAdapter, payload: dict[str, Any], items: list[Any], body_len: int,
             st: SessionState, limits: Limits, ratio: float, reason: str,
             distilled: list[Distilled]) -> Plan:
    sizes = [len(orjson.dumps(item)) + 1 for item in items]
    overhead = max(0, body_len - sum(sizes))
    lead = history.lead_count(items)
    cands = h.cut_points(history, items, lead, thinking=history.thinking_mode(payload))
    if not cands:
        return Plan(st, "steady" if st.layer else "pass", reason)
    budget = limits.budget
    start = max(1, st.force_min) if reason in ("cold", "client_changed") else max(
        1, st.layer, st.force_min)
    fixed = overhead + sum(sizes[:lead])
    for layer in range(start, EMERGENCY + 1):
        rule = LAYERS[layer]
        fill = EMERGENCY_FILL if layer == EMERGENCY else REWRITE_TARGET
        target = budget * fill - st.reserve
        truncate = h.EMERGENCY_OUTPUT_CHARS if layer == EMERGENCY else 0
        # Outputs from the protect_rounds-th last round on are never stripped.
        protect = cands[max(0, len(cands) - rule.protect_rounds)] if rule.strip else 0
        eff = _effective_sizes(history, items, sizes, strip_before=protect if rule.strip else 0,
                               truncate=truncate)
        suffix = _suffix(eff)
        keep = reason == "budget" and layer == st.layer and bool(st.prefix)
        if keep:
            prefix_tokens = len(st.prefix) // BYTES_PER_TOKEN_TEXT + 100
        else:
            rows = _select(distilled, rule, int(budget * rule.distilled_share))
            prefix_tokens = sum(len(d.text) for d in rows) // BYTES_PER_TOKEN_TEXT + 100
        cut = next((c for c in cands if (fixed + suffix[c]) * ratio + prefix_tokens <= target),
                   None)
        if cut is None:
            if layer < EMERGENCY:
                continue
            cut = cands[-1]
            reason = "emergency"
        return Plan(*_layout(history, payload, items, sizes, eff, st, layer, lead, cut,
                             protect if rule.strip else 0, truncate, distilled, rule, budget,
                             reason, ratio, fixed, keep))
    raise AssertionError("unreachable: the emergency layer always returns")


def _layout(history: HistoryAdapter, payload: dict[str, Any], items: list[Any], sizes: list[int],
            eff: list[int], st: SessionState, layer: int, lead: int, cut: int, strip_end: int,
            truncate: int, distilled: list[Distilled], rule: LayerRule, budget: int,
            reason: str, ratio: float, fixed: int,
            keep_prefix: bool) -> tuple[SessionState, Action, str, int, bool]:
    tail = items[cut:]
    if keep_prefix:
        # Warm: the frozen prefix keeps its bytes (and its cache); only the
        # boundary of the raw tail moves.
        text, ids = st.prefix, st.prefix_ids
    else:
        cut_at = _cut_time(st.marks, cut)
        # First-level logs of messages still in the raw tail would repeat it;
        # merged logs (generation 1+) hold the oldest history and always qualify.
        rows = _select([d for d in distilled if d.generation > 0 or d.last_at < cut_at], rule,
                       int(budget * rule.distilled_share))
        text, ids = render_prefix(rows), tuple(d.id for d in rows)
    request = "" if history.is_user_text(items[cut]) else (
        turn_request(history, items, lead, cut)[:REQUEST_KEEP_CHARS] or REQUEST_UNKNOWN)
    system_kept = tuple(i for i in range(lead, cut) if history.is_system(items[i]))
    marker = history.cache_marker(payload, tail)
    prefix = h.prefix_items(history, text, request=request, cache_control=marker,
                            system=[items[i] for i in system_kept])
    prefix_bytes = sum(len(orjson.dumps(p)) + 1 for p in prefix)
    kept = sum(eff[cut:])
    dropped = sum(sizes[lead:]) - kept - prefix_bytes
    state = msgspec.structs.replace(
        st, layer=layer, force_min=0, lead=lead, cut=cut, strip_end=max(strip_end, 0),
        truncate_to=truncate, fingerprint=_fingerprint(items, cut), prefix=text,
        prefix_ids=ids, request=request, system_kept=system_kept, overflowed=False, reserve=0,
        breakpoint=marker is not None, dropped_bytes=dropped,
        rewrites=st.rewrites + 1)
    estimate = int((fixed + kept + prefix_bytes) * ratio)
    return state, "rewrite", reason, estimate, not keep_prefix


def _effective_sizes(history: HistoryAdapter, items: list[Any], sizes: list[int], *,
                     strip_before: int, truncate: int) -> list[int]:
    if not strip_before and not truncate:
        return sizes
    out = list(sizes)
    for index, item in enumerate(items):
        if (truncate or index < strip_before) and history.is_tool_output(item):
            new = h.strip_output(history, item, truncate or None)
            if new is not item:
                out[index] = len(orjson.dumps(new)) + 1
    return out


def _suffix(sizes: list[int]) -> list[int]:
    out = [0] * (len(sizes) + 1)
    for index in range(len(sizes) - 1, -1, -1):
        out[index] = out[index + 1] + sizes[index]
    return out


def _select(rows: list[Distilled], rule: LayerRule, budget_tokens: int) -> list[Distilled]:
    """The newest distillations that fit (at most ``rule.max_rows``), back in
    chronological order so the same choice always renders the same bytes."""
    chosen: list[Distilled] = []
    used = 0
    for row in reversed(rows):
        cost = len(row.text) // BYTES_PER_TOKEN_TEXT + 1
        if rule.max_rows is not None and len(chosen) >= rule.max_rows:
            break
        if used + cost > budget_tokens:
            continue
        chosen.append(row)
        used += cost
    return chosen[::-1]


PREFIX_HEAD = (
    "[lore-gateway: session history]\n"
    "The earlier part of this conversation is condensed below (observations in time order)."
    " Its exact messages, tool outputs and file contents are in memory: use the `recall`"
    " tool for any detail not shown here.")


def render_prefix(rows: list[Distilled]) -> str:
    return "\n\n".join([PREFIX_HEAD, *(row.text.strip() for row in rows)])


def _kept(items: list[Any], state: SessionState) -> list[Any]:
    """The client's system messages the prefix keeps (indices before the cut)."""
    return [items[i] for i in state.system_kept if i < len(items)]


def _fingerprint(items: list[Any], cut: int) -> str:
    digest = hashlib.blake2b(digest_size=12)
    for item in items[max(0, cut - 1):cut + 1]:
        digest.update(orjson.dumps(item))
    return digest.hexdigest()


def _anchored(items: list[Any], st: SessionState) -> bool:
    """Whether the client's history still holds the items the layout was cut at."""
    if len(items) <= st.cut or len(items) < st.strip_end:
        return False
    return _fingerprint(items, st.cut) == st.fingerprint


def _reset(st: SessionState) -> SessionState:
    return msgspec.structs.replace(st, layer=0, force_min=0, lead=0, cut=0, strip_end=0,
                               truncate_to=0, fingerprint="", prefix="", prefix_ids=(),
                               breakpoint=False, system_kept=(), overflowed=False,
                               dropped_bytes=0)


def _mark(marks: tuple[tuple[int, float], ...], count: int,
          now: float) -> tuple[tuple[int, float], ...]:
    if marks and marks[-1][0] >= count:
        return marks
    out = (*marks, (count, now))
    if len(out) > MAX_MARKS:
        out = (*out[:-1:2], out[-1])
    return out


def _cut_time(marks: tuple[tuple[int, float], ...], cut: int) -> float:
    """When the request that first carried history item ``cut`` arrived."""
    for count, at in marks:
        if count > cut:
            return at
    return marks[-1][1] if marks else 0.0
