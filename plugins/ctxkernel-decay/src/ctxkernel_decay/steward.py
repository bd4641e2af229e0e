"""The deterministic steward: what a model would do with a decay reminder.

``ctxkernel simulate`` replays recorded turns that never call ``compress``. When a decay
reminder is visible in the request, the steward compresses the oldest compressible balanced
span(s) with an extractive summary, enough to bring pressure down to ``steward_target_ratio``
(and at least half of ``growth_tokens`` for a growth reminder). It goes through the very tool a
model would call, so every check applies.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ctxkernel.text import clip, failed, first_line, keep_newest

from .anchors import fmt, strip_anchors
from .state import NOTICE_FORM
from .strategy import STRATEGY, current_state, settings_of
from .tools import protected_start

if TYPE_CHECKING:
    from ctxkernel import Message, Request, Session

    from .state import DecayState
    from .strategy import DecaySettings

_ERROR = re.compile(r"\b(Error|Exception|Traceback|FAILED|error:)")
_ARG_KEYS = ("path", "file_path", "file", "filename", "command", "cmd", "pattern", "query", "url")


def _clip(text: str, limit: int) -> str:
    return clip(strip_anchors(text), limit, single_line=True)


def extractive_summary(messages: list[Message], state_summaries: list[str], max_chars: int) -> str:
    """What happened in a span, from the messages alone: requests, calls, errors, conclusions.

    Lines of earlier blocks are carried over as they are, so a merged block keeps what its
    parts kept. The user's requests are written out (up to 600 characters, as the basic
    checkpoint does) and are the last lines given up when the summary must shrink: the oldest
    other lines go first (``ctxkernel.text.keep_newest``).
    """
    lines: list[str] = []
    for earlier in state_summaries:
        lines.extend(line for line in earlier.splitlines() if line.strip())
    for m in messages:
        src = m.source
        if m.role == "user":
            if STRATEGY.owns(src):
                continue  # our reminders carry nothing worth keeping; blocks come in state_summaries
            lines.append(
                f"{'user' if src.kind == 'user' else src.plugin or 'note'}: {_clip(m.text, 600 if src.kind == 'user' else 240)}"
            )
        elif m.role == "assistant":
            if m.text.strip():
                lines.append(f"assistant: {_clip(m.text, 200)}")
            for call in m.tool_calls:
                arg = next((str(call.arguments[k]) for k in _ARG_KEYS if k in call.arguments), "")
                lines.append(f"called {call.name}" + (f"({_clip(arg, 100)})" if arg else ""))
        else:
            result = m.tool_result
            if result is None:
                continue
            if failed(result, _ERROR):
                lines.append(f"error in {result.name or 'tool'}: {_clip(first_line(result.content, '(empty)'), 160)}")
    lines = keep_newest(list(dict.fromkeys(lines)), max_chars, spare=lambda line: line.startswith("user: "))
    # one line longer than the whole budget
    return clip("\n".join(lines), max_chars) or "(nothing worth keeping)"


def plan_spans(
    session: Session,
    state: DecayState,
    settings: DecaySettings,
    need_tokens: int,
    shown: dict[int, Message] | None = None,
) -> list[dict[str, Any]]:
    """One span from the oldest compressible node, long enough to save ``need_tokens``; never
    into the current turn (its instruction and every step since stay, seed §7). ``shown``: the
    messages as the request showed them (by seq), which the summary is written from."""
    limit = protected_start(session, planning=not session.surface.pending_calls)
    return _plan_span(session, state, settings, need_tokens, limit, shown or {})


def _plan_span(
    session: Session,
    state: DecayState,
    settings: DecaySettings,
    need_tokens: int,
    limit: int,
    shown: dict[int, Message],
) -> list[dict[str, Any]]:
    """One span within surface positions ``0..limit-1``."""
    nodes = session.surface.nodes
    surface = session.surface
    meter = session.meter
    start = next((i for i in range(limit) if nodes[i].seq in state.anchor_of and surface.is_balanced_cut(i)), None)
    if start is None:
        return []
    total = 0
    best = None
    for end in range(start, limit):
        total += meter.node_tokens(nodes[end])
        if not surface.is_balanced_cut(end + 1):
            continue
        best = end
        # a summary costs roughly a fifth of what it replaces; stop once that saves enough
        if total * 0.8 >= need_tokens:
            break
    if best is None:
        return []
    rng = nodes[start : best + 1]
    last_anchor = next((state.anchor_of[n.seq] for n in reversed(rng) if n.seq in state.anchor_of), None)
    to = (
        state.blocks[rng[-1].seq].right
        if rng[-1].seq in state.blocks and state.blocks[rng[-1].seq].right
        else last_anchor
    )
    if to is None:
        return []  # nothing in the span carries an anchor the call could name
    tokens = sum(meter.node_tokens(n) for n in rng)
    # ~4 characters a token: at most a quarter of the span, and at most a tenth of the room the
    # request header leaves in the window, so merged blocks stay small when the window is tight
    # (the summary is paid twice: in the call's arguments and in the block)
    pressure = session.pressure()
    header = pressure.tokens - meter.surface_tokens()
    room = max(0, pressure.effective_window - header)
    max_chars = max(80, min(settings.summary_max_chars, tokens, int(4 * 0.1 * room)))
    summaries = [state.blocks[n.seq].summary for n in rng if n.seq in state.blocks]
    # what the model saw of each message (decayed as the request showed it), not the log's original
    seen = [shown.get(n.seq, n.message) for n in rng if n.seq not in state.blocks]
    summary = extractive_summary(seen, summaries, max_chars)
    if meter.count_text(summary) + 24 >= tokens:
        return []
    return [
        {
            "from": fmt(state.anchor_of[rng[0].seq]),
            "to": fmt(to),
            "summary": summary,
            "topic": "steward",
        }
    ]


def actions(session: Session, request: Request) -> list[dict[str, Any]] | None:

    state = current_state(session)
    holder = STRATEGY.on(session).state
    newest = None
    for seq, message in zip(request.seqs, request.messages, strict=True):
        src = message.source
        if STRATEGY.owns(src, NOTICE_FORM):
            newest = seq
    if newest is None or newest <= holder.get("steward_seen", -1) or newest < state.last_compaction_seq:
        return None
    holder["steward_seen"] = newest
    settings = settings_of(session)
    pressure = request.pressure
    need = max(
        pressure.tokens - int(settings.steward_target_ratio * pressure.effective_window), settings.growth_tokens // 2
    )
    shown = dict(zip(request.seqs, request.messages, strict=True))
    spans = plan_spans(session, state, settings, need, shown)
    if not spans:
        return None
    return [{"name": "compress", "arguments": {"spans": spans}}]
