"""Events as token-dense chapter prose: ``**User:**``, ``**Assistant:**``, compact tool lines.

Rendering is a pure function of the log; results above the defer floor and tool-call arguments
longer than :data:`ARGS_INLINE_CHARS` are itemised as artifacts through a callback (the planner
passes one that only hashes, the writer one that stores).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import orjson

from ctxkernel import Event, Message
from ctxkernel.text import clip

#: tool-call arguments (as JSON) longer than this become an artifact, like a result above the floor
ARGS_INLINE_CHARS = 2_000
PREVIEW_CHARS = 200

Defer = Callable[[str], str]  # content -> artifact handle
Count = Callable[[str], int]


def hash_only(root: str) -> Defer:
    from .artifacts import handle_for

    return lambda content: handle_for(root, hashlib.sha256(content.encode("utf-8")).hexdigest())


def _one_line(text: str, limit: int) -> str:
    return clip(text, limit, single_line=True)


def render_event(
    event: Event,
    *,
    count: Count,
    floor_tokens: int,
    defer: Defer,
    toc_marker: str,
    keep: frozenset[int] = frozenset(),
    force_defer: frozenset[int] = frozenset(),
) -> tuple[str, int]:
    """The prose for one event (may be empty) and how many artifacts it itemised. A tool result
    in ``keep`` stays inline and one in ``force_defer`` becomes an artifact whatever its size (the
    model's keep/defer decision, seed 003); the others follow the size floor."""
    t = event.type
    if t == "turn/start":
        return f"### Turn {event.data.get('turn')}\n", 0
    if t not in ("user/message", "assistant/message", "tool/result"):
        return "", 0
    op = (event.surface or {}).get("op")
    message = Message.from_dict(event.data["message"])
    if op == "replace":
        if t == "tool/result":
            return "", 0  # a shrunk copy of a result rendered in full at its own seq
        cites = (event.surface or {}).get("cites") or []
        by = message.source.plugin or "?"
        span = f"{cites[0]}–{cites[-1]}" if cites else "?"
        return (
            f"*(#{event.seq}: checkpoint by {by} replacing seqs {span}; the replaced events are rendered at their own seqs)*\n",
            0,
        )
    if t == "user/message":
        src = message.source
        if src.kind == "user":
            return f"**User** #{event.seq}: {message.text.strip()}\n", 0
        if toc_marker in message.text:
            return f"**Table of contents** #{event.seq} ({src.plugin}):\n{message.text.strip()}\n", 0
        return f"**Notice** #{event.seq} ({src.plugin}/{src.form}): {message.text.strip()}\n", 0
    if t == "assistant/message":
        parts = []
        deferred = 0
        text = message.text.strip()
        if text:
            parts.append(f"**Assistant** #{event.seq}: {text}")
        elif not message.tool_calls:
            parts.append(f"**Assistant** #{event.seq}: (no text)")
        for call in message.tool_calls:
            args = orjson.dumps(call.arguments).decode()
            if len(args) > ARGS_INLINE_CHARS:
                # long arguments (a whole file written) get a large result's treatment: kept
                # verbatim as an artifact the line names, so the chapter never clips them
                args = f"[artifact `{defer(args)}`, {len(args)} chars] {_one_line(args, PREVIEW_CHARS)}"
                deferred += 1
            prefix = "" if text or len(parts) else f"**Assistant** #{event.seq}: "
            parts.append(f"{prefix}→ `{call.name}` {args}")
        return "\n".join(parts) + "\n", deferred
    result = message.tool_result
    assert result is not None
    label = f"**Result** #{event.seq} ({result.name or result.call_id}{', error' if result.is_error else ''})"
    content = result.content
    # counted, not judged by its characters: one character may be several tokens (a rare CJK
    # character is 3-4), and the planning view prices a result over the floor by its tokens
    small = count(content) <= floor_tokens
    if event.seq in keep or (small and event.seq not in force_defer):
        return f"{label}: {content.strip()}\n", 0
    handle = defer(content)
    preview = _one_line(content, PREVIEW_CHARS)
    return f"{label}: [artifact `{handle}`, {len(content)} chars] {preview}\n", 1


def render_range(events: Sequence[Event], start: int, end: int, **kw: object) -> tuple[str, int]:
    """Prose for events ``start..end`` (inclusive) and the number of artifacts it itemised."""
    parts = []
    artifacts = 0
    for event in events[start : end + 1]:
        text, n = render_event(event, **kw)  # type: ignore[arg-type]
        if text:
            parts.append(text)
        artifacts += n
    return "\n".join(parts), artifacts
