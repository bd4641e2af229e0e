"""The model's tools: notes, ``new_context``, ``context_remaining`` and scoped history lookup.

Every refusal is an error result that leaves the log byte-identical: arguments are validated
first, and each tool writes at most one event, after all its checks passed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import Field

from ctxkernel import MAX_INT_ARG, CompactTool, Tool, ToolArgs, ToolOutcome
from ctxkernel.events import random_hex
from ctxkernel.recall.history import ITEM_CHARS_MAX, LIST_MAX, QUERY_MAX_CHARS
from ctxkernel.recall.notes import MAX_PATH_CHARS, Note, NoteNotFoundError, NotesLimits, render_note

from .state import state_of
from .strategy import STRATEGY
from .switch import ensure_window, notes_of, remember_note, settings_of

if TYPE_CHECKING:
    from ctxkernel import Context

NEW_CONTEXT_ANSWER = "A new context window will start without summarizing conversation history."
READ_CHARS_MAX = 20_000
#: longest note content argument: the notes store's default per-note limit (bytes >= characters)
CONTENT_ARG_CHARS = NotesLimits.max_note_bytes
#: history ids (item_<seq>), cursors and window ids
ID_ARG_CHARS = 128


def _trust(from_tool_output: bool) -> str:
    # the model cannot claim the user's authority; it can (and should) mark copied tool text
    return "tool-output" if from_tool_output else "model-authored"


def _resolve(ctx: Context, ref: str) -> Note:
    notes = notes_of(ctx)
    if ref.startswith("n_"):
        try:
            return notes.get(ref)
        except NoteNotFoundError:
            pass
    return notes.read(ref)


def _brief(note: Note) -> str:
    return (
        f"{note.path} (id {note.id}, trust {note.trust}, window {note.window or '-'}, "
        f"version {note.version}, {note.size} bytes)"
    )


class NoteCreateArgs(ToolArgs):
    path: str = Field(max_length=MAX_PATH_CHARS, description="e.g. 'goal' or 'plan/next'")
    content: str = Field(max_length=CONTENT_ARG_CHARS)
    from_tool_output: bool = Field(default=False, description="true if copied from tool output")


def _checked_then_window(ctx: Context, path: str, text: str, trust: str, *, append: bool = False) -> None:
    """Record the first window (the stamp of the write to come) only once the write of ``text``
    at ``path`` passes every check of the notes (path, trust mark, limits): staged, not written,
    so a refused write leaves the log as it was, the window event included."""
    if state_of(ctx).current is None:
        staged = notes_of(ctx).staged()
        (staged.append if append else staged.write)(path, text, trust=trust)
    ensure_window(ctx)


def note_create(ctx: Context, args: NoteCreateArgs) -> ToolOutcome:
    notes, trust = notes_of(ctx), _trust(args.from_tool_output)
    if notes.exists(args.path):  # refused by create itself, before it writes anything
        notes.create(args.path, args.content, trust=trust)
    _checked_then_window(ctx, args.path, args.content, trust)
    note = notes_of(ctx).create(args.path, args.content, trust=trust)
    remember_note(ctx, note)
    return ToolOutcome(f"created note {_brief(note)}")


class NoteUpdateArgs(ToolArgs):
    note: str = Field(max_length=MAX_PATH_CHARS, description="the note's id (n_...) or path")
    content: str = Field(max_length=CONTENT_ARG_CHARS)
    from_tool_output: bool = False


def note_update(ctx: Context, args: NoteUpdateArgs) -> ToolOutcome:
    note = _resolve(ctx, args.note)
    if note.archived:
        return ToolOutcome(
            f"note_update refused: note {note.id} ({note.path!r}) is archived; create a new note", is_error=True
        )
    trust = _trust(args.from_tool_output)
    _checked_then_window(ctx, note.path, args.content, trust)
    note = notes_of(ctx).update(note.id, args.content, trust=trust)
    remember_note(ctx, note)
    return ToolOutcome(f"updated note {_brief(note)}; earlier versions stay retrievable with note_get(version=...)")


class NoteAppendArgs(ToolArgs):
    path: str = Field(max_length=MAX_PATH_CHARS)
    text: str = Field(max_length=CONTENT_ARG_CHARS)
    from_tool_output: bool = False


def note_append(ctx: Context, args: NoteAppendArgs) -> ToolOutcome:
    trust = _trust(args.from_tool_output)
    _checked_then_window(ctx, args.path, args.text, trust, append=True)
    note = notes_of(ctx).append(args.path, args.text, trust=trust)
    remember_note(ctx, note)
    return ToolOutcome(f"appended to note {_brief(note)}")


class NoteGetArgs(ToolArgs):
    note: str = Field(max_length=MAX_PATH_CHARS, description="the note's id (n_...) or path")
    version: int | None = Field(default=None, ge=1, le=MAX_INT_ARG, description="default: latest")
    offset_chars: int = Field(default=0, ge=0, le=MAX_INT_ARG)
    max_chars: int = Field(default=8_000, ge=1, le=READ_CHARS_MAX)


def note_get(ctx: Context, args: NoteGetArgs) -> ToolOutcome:
    note = _resolve(ctx, args.note)
    if args.version is not None:
        versions = notes_of(ctx).versions(note.id)
        if args.version > len(versions):
            return ToolOutcome(f"note_get refused: note {note.id} has versions 1..{len(versions)}", is_error=True)
        note = versions[args.version - 1]
    if args.offset_chars > len(note.content):
        return ToolOutcome(
            f"note_get refused: offset_chars {args.offset_chars} is past the end of note {note.id} "
            f"({len(note.content)} characters). Nothing was changed.",
            is_error=True,
        )
    body = note.content[args.offset_chars : args.offset_chars + args.max_chars]
    end = args.offset_chars + len(body)
    shown = Note(**{**note.__dict__, "content": body})
    tail = (
        f"\n(characters {args.offset_chars}..{end} of {len(note.content)}; continue with offset_chars={end})"
        if end < len(note.content)
        else ""
    )
    status = " [archived]" if note.archived else ""
    return ToolOutcome(render_note(shown) + status + tail)


class NoteDeleteArgs(ToolArgs):
    note: str = Field(max_length=MAX_PATH_CHARS, description="the note's id (n_...) or path")


def note_delete(ctx: Context, args: NoteDeleteArgs) -> ToolOutcome:
    note = _resolve(ctx, args.note)  # refused (not found) before the first window is recorded
    if note.archived:  # refused by delete itself, before it writes anything
        notes_of(ctx).delete(note.id)
    ensure_window(ctx)
    archived = notes_of(ctx).delete(note.id)
    return ToolOutcome(f"archived note {_brief(archived)}; its versions stay readable with note_get('{archived.id}')")


class NoteListArgs(ToolArgs):
    prefix: str = Field(default="", max_length=MAX_PATH_CHARS)
    limit: int = Field(default=20, ge=1, le=50)
    cursor: str | None = Field(default=None, max_length=MAX_PATH_CHARS)


def note_list(ctx: Context, args: NoteListArgs) -> ToolOutcome:
    page = notes_of(ctx).list(args.prefix, limit=args.limit, cursor=args.cursor)
    lines = [f"{page.total} note(s) under {args.prefix!r}:" if args.prefix else f"{page.total} note(s):"]
    for note in page.items:
        first = note.content.strip().splitlines()[0][:100] if note.content.strip() else ""
        lines.append(f"- {_brief(note)}: {first}")
    if page.next_cursor:
        lines.append(f"more: note_list(cursor={page.next_cursor!r})")
    return ToolOutcome("\n".join(lines))


class NoteSearchArgs(ToolArgs):
    query: str = Field(min_length=1, max_length=1_000)
    case_sensitive: bool = True
    prefix: str = Field(default="", max_length=MAX_PATH_CHARS)


def note_search(ctx: Context, args: NoteSearchArgs) -> ToolOutcome:
    result = notes_of(ctx).search(
        args.query,
        prefix=args.prefix,
        case_sensitive=args.case_sensitive,
        max_files=20,
        max_lines_per_file=5,
        max_line_chars=200,
    )
    if not result.hits:
        return ToolOutcome(f"no note line contains {args.query!r}")
    lines = [f"[{h.trust}] {h.path}:{h.line}: {h.text}" for h in result.hits]
    if result.truncated:
        lines.append("(more matches: narrow the query or the prefix)")
    return ToolOutcome("\n".join(lines))


class NewContextArgs(ToolArgs):
    next_goal: str | None = Field(default=None, max_length=8_000)


def new_context(ctx: Context, args: NewContextArgs) -> ToolOutcome:
    """Record the intent only (§3.5): the switch happens at the next pre-step, after the batch."""
    state = state_of(ctx)
    if state.pending is not None:
        return ToolOutcome(
            f"new_context refused: a new context window is already pending (requested at item_{state.pending['seq']}); "
            "it starts after this batch. Nothing was changed.",
            is_error=True,
        )
    current = ensure_window(ctx)  # after the check: a refusal leaves the log as it was
    STRATEGY.on(ctx).emit("intent", {"intent_id": random_hex(32), "next_goal": args.next_goal, "window_id": current})
    return ToolOutcome(NEW_CONTEXT_ANSWER, conclude_turn=True)


class NoArgs(ToolArgs):
    pass


def context_remaining(ctx: Context, args: NoArgs) -> ToolOutcome:
    current = ensure_window(ctx)
    state = state_of(ctx)
    settings = settings_of(ctx)
    p = ctx.pressure()
    return ToolOutcome(
        f"{p.remaining} tokens remain of the {p.effective_window}-token window ({p.tokens} used, {p.ratio:.0%}). "
        f"Window {current} (number {state.number}). A reminder comes at {settings.reminder_ratio:.0%}; a new window "
        f"starts automatically at {settings.rollover_ratio:.0%} with your notes as its seed."
        + (" A new window is already pending." if state.pending else "")
    )


class HistoryLookupArgs(ToolArgs):
    window: str | None = Field(default=None, max_length=ID_ARG_CHARS, description="window id, win_<n> or number")
    seq_from: int | None = Field(default=None, ge=0, le=MAX_INT_ARG)
    seq_to: int | None = Field(default=None, ge=0, le=MAX_INT_ARG)
    role: Literal["user", "plugin", "assistant", "tool", "summary", "event"] | None = None
    query: str | None = Field(default=None, min_length=1, max_length=QUERY_MAX_CHARS)
    case_sensitive: bool = True
    limit: int = Field(default=20, ge=1, le=LIST_MAX)
    max_chars: int = Field(default=400, ge=1, le=ITEM_CHARS_MAX, description="preview per item")
    cursor: str | None = Field(default=None, max_length=ID_ARG_CHARS)


def _window_ref(ctx: Context, ref: str | None) -> str | int | None:
    # the first window has no switch to carry its id: map it to window 1 for the history index
    if ref is not None and ref == state_of(ctx).first:
        return 1
    return ref


def history_lookup(ctx: Context, args: HistoryLookupArgs) -> ToolOutcome:
    history = STRATEGY.on(ctx).history()
    common: dict[str, Any] = {
        "window": _window_ref(ctx, args.window),
        "role": args.role,
        "seq_from": args.seq_from,
        "seq_to": args.seq_to,
        "limit": args.limit,
        "max_chars": args.max_chars,
        "cursor": args.cursor,
    }
    if args.query:
        out = history.search(args.query, case_sensitive=args.case_sensitive, **common)
    else:
        out = history.list_items(**common)
    # attribute every item to its window id (the first window's id is ours: no switch carries it)
    ids = {w.number: w.id for w in history.windows if w.id}
    first = state_of(ctx).first
    if first is not None:
        ids.setdefault(1, first)
    for item in out.get("items", ()):
        item["window_id"] = ids.get(item.get("window"))
    return ToolOutcome(orjson.dumps(out).decode())


class HistoryReadArgs(ToolArgs):
    item: str = Field(max_length=ID_ARG_CHARS, description="e.g. item_42")
    offset_chars: int = Field(default=0, ge=0, le=MAX_INT_ARG)
    max_chars: int = Field(default=8_000, ge=1, le=READ_CHARS_MAX)


def history_read(ctx: Context, args: HistoryReadArgs) -> ToolOutcome:
    out = STRATEGY.on(ctx).history().read_item(args.item, offset_chars=args.offset_chars, max_chars=args.max_chars)
    return ToolOutcome(orjson.dumps(out).decode())


TOOLS: tuple[tuple[str, str, type[ToolArgs], object], ...] = (
    (
        "note_create",
        "Create a note; notes open every new context window. Keep goal, decisions, state, next steps.",
        NoteCreateArgs,
        note_create,
    ),
    ("note_update", "Replace a note's content (id or path); old versions stay readable.", NoteUpdateArgs, note_update),
    ("note_append", "Append text to a note (created when missing).", NoteAppendArgs, note_append),
    ("note_get", "Read a note or an earlier version, in pages.", NoteGetArgs, note_get),
    ("note_delete", "Archive a note (versions stay readable).", NoteDeleteArgs, note_delete),
    ("note_list", "List notes by path prefix.", NoteListArgs, note_list),
    ("note_search", "Search notes for plain text.", NoteSearchArgs, note_search),
    (
        "new_context",
        "Start a new context window after this batch, without summarising: it opens with your notes, next_goal and pending user input. Save notes first.",
        NewContextArgs,
        new_context,
    ),
    ("context_remaining", "Tokens left in this context window.", NoArgs, context_remaining),
)
#: offered once a switch hides something (``[tools] offer``): before it the window holds it all
RECALL_TOOLS: tuple[tuple[str, str, type[ToolArgs], object], ...] = (
    (
        "history_lookup",
        "List or search this session's raw history (all windows) by window id, seq range, role or text; bounded pages.",
        HistoryLookupArgs,
        history_lookup,
    ),
    ("history_read", "Read a history item (item_<seq>) in pages.", HistoryReadArgs, history_read),
)


def build_tools(tools: tuple[tuple[str, str, type[ToolArgs], object], ...] = TOOLS) -> list[Tool]:
    return [
        STRATEGY.tool(name, description, params, handler, cls=CompactTool)
        for name, description, params, handler in tools
    ]
