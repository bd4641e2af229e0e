"""Segmentation as a plain function: chapter ranges and titles from a log, no agent turn needed.

:func:`propose_chapters` is what the CLI, the automatic in-place path and the simulator's steward
call. It aims at ``target_tokens`` per chapter and cuts after a ``turn/end``; only a turn larger
than twice the target is split inside, after a ``step/end``. Titles and summaries are
deterministic (from the first user message, the tools and the files of the chapter);
:func:`model_titles` optionally asks a summarizer model, reusing the session's own system prompt
and tools as the request prefix so a provider prefix cache serves it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from ctxkernel import Event, Message, Source
from ctxkernel.text import clip

from .render import Count, hash_only, render_event

if TYPE_CHECKING:
    from ctxkernel import Context

    from .settings import ChaptersSettings

_PATH_KEYS = ("path", "file", "file_path", "filename", "filepath", "notebook_path")
_PATH_KEY_SET = frozenset(_PATH_KEYS)


@dataclass(frozen=True)
class ChapterPlan:
    start_seq: int
    end_seq: int
    title: str
    summary: str
    tokens: int


def _clip(text: str, limit: int) -> str:
    return clip(text, limit, single_line=True)


MessageOf = Callable[[Event], Message]


def describe(events: Sequence[Event], start: int, end: int, message_of: MessageOf | None = None) -> tuple[str, str]:
    """A deterministic title and one-line summary for events ``start..end`` (``message_of``
    may serve the parsed messages a caller already holds, e.g. the surface's)."""
    parse = message_of or (lambda event: Message.from_dict(event.data["message"]))
    first_user = ""
    replies: list[Message] = []  # the assistant's messages: the last one with text is read at the end
    tools: dict[str, int] = {}
    files: list[str] = []
    seen: set[str] = set()  # the files listed so far
    for event in events[start : end + 1]:
        etype = event.type
        if etype == "assistant/message":
            if (event.surface or {}).get("op") != "append":
                continue
            message = parse(event)
            replies.append(message)
            for block in message.content:
                if block.type != "tool_call":
                    continue
                tools[block.name] = tools.get(block.name, 0) + 1
                arguments = block.arguments
                if not isinstance(arguments, dict) or _PATH_KEY_SET.isdisjoint(arguments):
                    continue
                for key in _PATH_KEYS:  # in this order: the first path key of a call is listed first
                    value = arguments.get(key)
                    if isinstance(value, str) and value not in seen:
                        seen.add(value)
                        files.append(value)
        elif etype == "user/message":
            if first_user or (event.surface or {}).get("op") != "append":
                continue
            message = parse(event)
            if message.source.kind == "user":
                first_user = message.text.strip()
    last_text = next((text for text in (m.text.strip() for m in reversed(replies)) if text), "")
    basis = first_user or last_text
    words = re.findall(r"[^\s]+", basis)[:8]
    title = " ".join(words).strip(" .,:;") if words else f"Events {start}–{end}"
    title = _clip(title, 80)
    parts = []
    if first_user:
        parts.append(f"asked: {_clip(first_user, 140)}")
    if tools:
        parts.append("tools: " + ", ".join(f"{k}×{v}" for k, v in list(tools.items())[:8]))
    if files:
        parts.append(
            "files: " + ", ".join(_clip(f, 60) for f in files[:6]) + (f" (+{len(files) - 6})" if len(files) > 6 else "")
        )
    if last_text and last_text != first_user:
        parts.append(f"last: {_clip(last_text, 140)}")
    return title, "; ".join(parts) or f"events {start}–{end} (no messages)"


def event_tokens(
    events: Sequence[Event], start: int, end: int, *, count: Count, floor_tokens: int, root: str = "x"
) -> list[int]:
    """Tokens each event contributes to a chapter body (artifacts counted as their handle line)."""
    defer = hash_only(root)
    out = []
    for event in events[start : end + 1]:
        text, _ = render_event(event, count=count, floor_tokens=floor_tokens, defer=defer, toc_marker="<chapters-toc>")
        out.append(count(text) if text else 0)
    return out


def propose_chapters(
    events: Sequence[Event],
    start: int,
    end: int,
    *,
    count: Count,
    target_tokens: int = 8_000,
    floor_tokens: int = 200,
    tokens: Sequence[int] | None = None,
    message_of: MessageOf | None = None,
) -> list[ChapterPlan]:
    """Chapter ranges covering exactly ``start..end`` (log seqs), in order, each with a title.

    Deterministic: the same log gives the same plan. ``tokens`` (one figure per event, e.g.
    :func:`estimated_tokens`) spares rendering and counting every event.
    """
    if end < start:
        return []
    if tokens is None:
        tokens = event_tokens(events, start, end, count=count, floor_tokens=floor_tokens)
    plans: list[tuple[int, int, int]] = []
    chunk_start = start
    acc = 0
    for offset, seq in enumerate(range(start, end + 1)):
        acc += tokens[offset]
        etype = events[seq].type
        at_turn_end = etype == "turn/end"
        at_step_end = etype == "step/end"
        if seq < end and ((at_turn_end and acc >= target_tokens) or (at_step_end and acc >= 2 * target_tokens)):
            plans.append((chunk_start, seq, acc))
            chunk_start, acc = seq + 1, 0
    plans.append((chunk_start, end, acc))
    # a small last chapter (the tail of a region) joins the previous one unless that grows too big
    if len(plans) >= 2 and plans[-1][2] < target_tokens // 4 and plans[-2][2] + plans[-1][2] <= 2 * target_tokens:
        a, b = plans[-2], plans[-1]
        plans[-2:] = [(a[0], b[1], a[2] + b[2])]
    out = []
    for s, e, t in plans:
        title, summary = describe(events, s, e, message_of)
        out.append(ChapterPlan(s, e, title, summary, t))
    return out


TITLE_DIRECTIVE = (
    "The conversation above is to be archived as chapters. For each chapter listed below (by its "
    "range of event numbers), write a short title (at most 8 words) and a one-sentence summary. "
    'Answer with JSON only: a list of {"title": ..., "summary": ...} objects, one per chapter, in order.'
)


def model_titles(
    plans: list[ChapterPlan], bodies: list[str], model: Any, *, system: str, tools: list[dict[str, Any]]
) -> tuple[list[ChapterPlan], dict[str, int] | None]:
    """Ask ``model`` for titles and summaries; the session's system prompt and tools come first
    (the cached prefix), the chapter texts and the directive last. Falls back to the
    deterministic titles for any entry the model does not answer properly."""
    messages = [
        Message.user(
            f"Chapter {i + 1} (events {p.start_seq}–{p.end_seq}):\n{b}", Source.plugin_form("chapters", "segment")
        )
        for i, (p, b) in enumerate(zip(plans, bodies, strict=True))
    ]
    messages.append(Message.user(TITLE_DIRECTIVE, Source.plugin_form("chapters", "directive")))
    reply = model.complete(messages, system=system, tools=tools)
    text = reply.message.text.strip()
    match = re.search(r"\[.*\]", text, re.DOTALL)
    try:
        answers = orjson.loads(match.group(0)) if match else []
    except orjson.JSONDecodeError:
        answers = []
    out = []
    for i, plan in enumerate(plans):
        answer = answers[i] if i < len(answers) and isinstance(answers[i], dict) else {}
        title = answer.get("title") if isinstance(answer.get("title"), str) and answer["title"].strip() else plan.title
        summary = (
            answer.get("summary")
            if isinstance(answer.get("summary"), str) and answer["summary"].strip()
            else plan.summary
        )
        out.append(replace(plan, title=_clip(str(title), 80), summary=_clip(str(summary), 400)))
    return out, reply.usage


def propose_for(ctx: Context, settings: ChaptersSettings, start: int, end: int, **view: Any) -> list[ChapterPlan]:
    """:func:`propose_chapters` over ``session``'s log with the strategy's settings; ``view`` passes
    a planning view (``tokens``, ``message_of``) or another ``target_tokens`` when the caller has one."""
    options: dict[str, Any] = {
        "target_tokens": settings.chapter_token_target,
        "floor_tokens": settings.tool_result_defer_floor_tokens,
    } | view
    return propose_chapters(ctx.events, start, end, count=ctx.meter.count_text, **options)
