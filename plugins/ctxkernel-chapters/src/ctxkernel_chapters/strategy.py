"""The ``chapters`` strategy's declaration and the per-session pieces its hooks and tools share:
settings, the state folded from the log, the archive bounds and the table-of-contents predicate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ctxkernel

from . import toc
from .registry import Registry
from .settings import ChaptersSettings

if TYPE_CHECKING:
    from ctxkernel import Context

NAME = "chapters"
SUGGEST_MARK = "[chapters: continuation available]"
STRATEGY = ctxkernel.Strategy(
    NAME,
    ChaptersSettings,
    capabilities={"pressure", "overflow", "archive", "tools", "recall"},
    description="archive the conversation as Markdown chapters; continue from a table of contents",
)


def settings_of(ctx: Context) -> ChaptersSettings:
    return STRATEGY.on(ctx).settings


# -- state, rebuilt from the log -----------------------------------------------------------------
#: the format of the state in session snapshots (:func:`snapshot_state`): bump it whenever the
#: shape changes, so a snapshot written by an older plugin is folded from the start of the log
STATE_VERSION = (
    2  # 2: plans hold the seq of their commit event, not its data (a snapshot no longer grows by a plan per compaction)
)


def state(ctx: Context) -> dict[str, Any]:
    """The handle's state, brought up to date with the events appended since last time (opened
    from a session snapshot holding it: from there, so an open folds only the tail)."""
    handle = STRATEGY.on(ctx)
    st = handle.state
    if "cursor" not in st:  # the handle keeps its own keys here too (offer_tools)
        st.update(
            {
                "cursor": 0,
                "artifact_done": set(),  # tool result seqs already moved to the artifact store
                "candidates": [],  # tool result seqs not yet checked for the artifact band
                "suggested": False,
                "overflow_streak": 0,
                "compactions": 0,
                "continued_in": None,
                # in-place compactions whose chapters are committed in the log (their plan is in
                # the commit event) but not yet written as files and records: settle.py
                "unsettled": [],
                "committed_through": -1,  # the last seq covered by a committed plan
                "plans": {},  # compaction id -> its committed plan (to render a lost file again)
            }
        )
        restored = handle.restored(version=STATE_VERSION, load=lambda data: _from_snapshot(data, len(ctx.events)))
        if restored is not None:
            st.update(restored)
    events = ctx.events
    for event in events[st["cursor"] :]:
        t = event.type
        if t == "tool/result" and (event.surface or {}).get("op") == "append":
            st["candidates"].append(event.seq)
        elif t == "step/start":
            # pre_step checked every candidate before this step started (move_large_results), so a
            # fold of the log and the live state agree, and the list stays one step long
            st["candidates"] = []
        elif t == "compaction/prune" and event.data.get("strategy") == NAME:
            st["artifact_done"].add(event.data["target"])
        elif t == "compaction/summary" and event.data.get("strategy") == NAME:
            st["suggested"] = False
            st["compactions"] += 1
            through = (event.data.get("archive") or {}).get("through")
            if isinstance(event.data.get("records"), list) and type(through) is int:
                st["unsettled"].append(event.data)
                st["plans"][event.data.get("compaction_id")] = event.seq  # the commit event: its data is the plan
                st["committed_through"] = max(st["committed_through"], through)
        elif t == "user/message":
            src = event.data["message"].get("source", {})
            if src.get("plugin") == NAME and src.get("form") == "notice":
                text = "".join(b.get("text", "") for b in event.data["message"].get("content", []))
                if SUGGEST_MARK in text:
                    st["suggested"] = True
    st["cursor"] = len(events)
    return st


def snapshot_state(ctx: Context) -> ctxkernel.StrategySnapshot:
    """What the fold of the log derives (not this process's overflow streak, steward attempt or
    continuation), for the session's snapshot."""
    st = state(ctx)
    data = {
        "cursor": st["cursor"],
        "artifact_done": sorted(st["artifact_done"]),
        "candidates": list(st["candidates"]),
        "suggested": st["suggested"],
        "compactions": st["compactions"],
        "unsettled": list(st["unsettled"]),
        "committed_through": st["committed_through"],
        "plans": dict(st["plans"]),
    }
    return STRATEGY.on(ctx).snapshot(data, version=STATE_VERSION)


def _from_snapshot(data: dict[str, Any], log_length: int) -> dict[str, Any]:
    """The folded fields of :func:`snapshot_state`, checked (ValueError names what is wrong)."""
    cursor, done, candidates = data["cursor"], data["artifact_done"], data["candidates"]
    if type(cursor) is not int or not 0 < cursor <= log_length:
        msg = f"cursor {cursor!r} is outside the log (length {log_length})"
        raise ValueError(msg)
    if not all(type(seq) is int and 0 <= seq < cursor for seq in [*done, *candidates]):
        msg = "artifact_done and candidates must be seqs of events before the cursor"
        raise ValueError(msg)
    if type(data["suggested"]) is not bool or type(data["compactions"]) is not int:
        msg = "suggested must be a boolean and compactions an integer"
        raise ValueError(msg)
    unsettled, plans, through = data["unsettled"], data["plans"], data["committed_through"]
    if (
        not all(isinstance(p, dict) for p in unsettled)
        or not isinstance(plans, dict)
        or not all(type(seq) is int and 0 <= seq < cursor for seq in plans.values())
        or type(through) is not int
    ):
        msg = "unsettled must hold commit events' data, plans the seqs of commit events, committed_through a seq"
        raise ValueError(msg)
    return {
        "unsettled": list(unsettled),
        "plans": dict(plans),
        "committed_through": through,
        "cursor": cursor,
        "artifact_done": set(done),
        "candidates": list(candidates),
        "suggested": data["suggested"],
        "compactions": data["compactions"],
    }


def registry_of(ctx: Context) -> Registry:
    """The lineage registry, on the strategy handle's key-value table, with the chapter numbers
    this process reserved (per lineage root) for the sessions of the same store."""
    handle = STRATEGY.on(ctx)
    reserved: dict[str, int] = handle.process_memory.setdefault("reserved", {})
    return Registry(handle, reserved)


def archived_through(ctx: Context, registry: Registry | None = None, *, stored: int | None = None) -> int:
    """The last log seq covered by this session's chapters (-1 when none): final records, and
    plans committed in the log whose files are not written yet. ``stored``: the registry's own
    figure when the caller has just read the session's registry state (saves a read)."""
    if stored is None:
        stored = (registry or registry_of(ctx)).archived_through(ctx.id)
    committed: int = state(ctx)["committed_through"]
    return max(stored, committed)


def own_records(ctx: Context, registry: Registry | None = None, *, mark: int | None = None) -> list[dict[str, Any]]:
    """This session's chapter records, read again only when its ``archived_through`` moved
    (every writer of its records moves it), so a compaction does not list the namespace.
    ``mark``: that stored ``archived_through`` when the caller has just read it."""
    registry = registry or registry_of(ctx)
    if mark is None:
        mark = registry.archived_through(ctx.id)
    st = state(ctx)
    cached = st.get("records")
    if cached is None or cached[0] != mark:
        cached = st["records"] = (mark, registry.records(ctx.id))
    return list(cached[1])


def archive_ceiling(ctx: Context) -> int | None:
    """Seq of the last ``turn/end``: session creation archives at or below it, never mid-turn."""
    for event in reversed(ctx.events):
        if event.type == "turn/end":
            return event.seq
    return None


def text_bound(ctx: Context) -> toc.AtMost | None:
    """:func:`toc.byte_bound` when the session's tokenizer is a byte-level BPE (the meter bounds a
    message by its bytes then), else None: a table of contents that fits by bytes is not counted."""
    return toc.byte_bound if ctx.meter.message_at_most(ctxkernel.Message.user("")) is not None else None


def header_tokens(ctx: Context) -> int:
    """Tokens of the system prompt and tool schemas, from the last recorded request header."""
    for event in reversed(ctx.events):
        if event.type == "request/header":
            return ctx.meter.count_header(event.data["system"], event.data["tools"])
    system = STRATEGY.on(ctx).base_system_prompt
    return ctx.meter.count_header(system, ctx.tool_schemas())


def is_chapters_toc(node: Any) -> bool:
    """True for a table of contents this strategy put on the surface."""
    return node.role == "user" and STRATEGY.owns(node.message.source) and toc.is_toc(node.message.text)


def user_instructions(ctx: Context, start: int, end: int) -> list[str]:
    """The user's own messages among events ``start..end`` (not plugin notices), in order."""
    out = []
    for event in ctx.events[max(0, start) : end + 1]:
        text = instruction_of(event)
        if text is not None:
            out.append(text)
    return out


def instruction_of(event: ctxkernel.Event) -> str | None:
    """The text of a user's own message appended by ``event``, else None."""
    if event.type == "user/message" and (event.surface or {}).get("op") == "append":
        message = event.data["message"]
        if message.get("source", {}).get("kind", "user") == "user":
            return "\n".join(b.get("text", "") for b in message.get("content", []) if b.get("type") == "text")
    return None
