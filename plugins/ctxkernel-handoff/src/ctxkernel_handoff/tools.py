"""The ten model-callable tools: ``new_context``, five ``notes_*`` and the kernel's four ``history_*``
(:mod:`ctxkernel.recall.history_tools`, shared with the built-in ``history`` strategy).

Notes are the session's own (``self/notes/<path>``, kept as events of its log by
:mod:`ctxkernel.recall.notes`): no tool can name another session's notes. History reads the
session's own immutable log through :mod:`ctxkernel.recall.history`. Every tool answers JSON; a
refusal is an error result that says what was wrong and how to fix it, and writes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from pydantic import Field

from ctxkernel import MAX_INT_ARG, CompactTool, Tool, ToolArgs, ToolError, ToolOutcome
from ctxkernel.recall.history_tools import history_tools
from ctxkernel.recall.notes import MAX_PATH_CHARS, NotePathError, NotesLimits

from .engine import notes_of, request_new_context
from .handoff import NOTES_PREFIX
from .strategy import STRATEGY

if TYPE_CHECKING:
    from ctxkernel import Context

NOTE_READ_DEFAULT = 8_000
NOTE_READ_MAX = 20_000
NOTE_LIST_DEFAULT = 20
NOTE_LIST_MAX = 50
NOTE_SEARCH_FILES = 10
NOTE_SEARCH_LINES = 5
NOTE_SEARCH_LINE_CHARS = 400
#: longest note path argument: the prefix plus the notes store's own limit
PATH_ARG_CHARS = len(NOTES_PREFIX) + MAX_PATH_CHARS
#: longest note content argument: the notes store's default per-note limit (bytes >= characters)
CONTENT_ARG_CHARS = NotesLimits.max_note_bytes

TOOL_NAMES = (
    "new_context",
    "notes_write_file",
    "notes_append_to_file",
    "notes_read_file",
    "notes_list_files_by_prefix",
    "notes_search_contents",
    "history_list_windows",
    "history_list_items",
    "history_read_item",
    "history_search_contents",
)


def _json(data: Any) -> str:
    return orjson.dumps(data).decode()


def note_path(path: str) -> str:
    """``self/notes/<path>`` or a bare ``<path>`` as the notes store's relative path."""
    if not isinstance(path, str):
        msg = f"a note path must be a string, got {type(path).__name__}"
        raise NotePathError(msg)
    text = path.strip()
    if text.startswith(NOTES_PREFIX):
        text = text[len(NOTES_PREFIX) :]
    elif text.startswith("self/") or text == "self":
        msg = (
            f"note path {path!r}: this session's notes live under {NOTES_PREFIX!r}; write e.g. '{NOTES_PREFIX}plan.md'"
        )
        raise NotePathError(msg)
    return text


def _prefix(prefix: str) -> str:
    text = prefix.strip()
    if NOTES_PREFIX.startswith(text):  # "", "self", "self/notes", "self/notes/"
        return ""
    if text.startswith(NOTES_PREFIX):
        return text[len(NOTES_PREFIX) :]
    if text.startswith("/") or ".." in text.split("/"):
        msg = f"prefix {prefix!r} is not a note path prefix: use a relative prefix such as '{NOTES_PREFIX}plan/'"
        raise NotePathError(msg)
    return text


def _shown(path: str) -> str:
    return NOTES_PREFIX + path


# -- argument models ---------------------------------------------------------------------------------------
class NewContextArgs(ToolArgs):
    reason: str = Field(default="", max_length=500)


class NoteWriteArgs(ToolArgs):
    path: str = Field(max_length=PATH_ARG_CHARS, description="e.g. self/notes/plan.md")
    content: str = Field(max_length=CONTENT_ARG_CHARS)


class NoteAppendArgs(ToolArgs):
    path: str = Field(max_length=PATH_ARG_CHARS, description="e.g. self/notes/log.md")
    content: str = Field(max_length=CONTENT_ARG_CHARS)


class NoteReadArgs(ToolArgs):
    path: str = Field(max_length=PATH_ARG_CHARS)
    offset_chars: int = Field(default=0, ge=0, le=MAX_INT_ARG, description="next_offset_chars")
    max_chars: int = Field(default=NOTE_READ_DEFAULT, ge=1, le=NOTE_READ_MAX)


class NoteListArgs(ToolArgs):
    prefix: str = Field(default="", max_length=PATH_ARG_CHARS, description="e.g. self/notes/plan/")
    limit: int = Field(default=NOTE_LIST_DEFAULT, ge=1, le=NOTE_LIST_MAX)
    cursor: str | None = Field(default=None, max_length=PATH_ARG_CHARS)


class NoteSearchArgs(ToolArgs):
    query: str = Field(min_length=1, max_length=1_000)
    case_sensitive: bool = True
    prefix: str = Field(default="", max_length=PATH_ARG_CHARS)


# -- handlers ------------------------------------------------------------------------------------------------
def _new_context(ctx: Context, args: NewContextArgs) -> ToolOutcome:
    return ToolOutcome(request_new_context(ctx, args.reason))


def _note_summary(note: Any, notes: Any) -> dict[str, Any]:
    return {
        "path": _shown(note.path),
        "id": note.id,
        "version": note.version,
        "bytes": note.size,
        "trust": note.trust,
        "window": note.window,
        "session_notes": len(notes),
        "session_bytes": notes.total_bytes,
    }


def _notes_write(ctx: Context, args: NoteWriteArgs) -> str:
    notes = notes_of(ctx)
    note = notes.write(note_path(args.path), args.content, trust="model-authored")
    return _json({"written": True, **_note_summary(note, notes)})


def _notes_append(ctx: Context, args: NoteAppendArgs) -> str:
    notes = notes_of(ctx)
    note = notes.append(note_path(args.path), args.content, trust="model-authored")
    return _json({"appended": len(args.content), **_note_summary(note, notes)})


def _notes_read(ctx: Context, args: NoteReadArgs) -> str:
    note = notes_of(ctx).read(note_path(args.path))
    content = note.content
    if args.offset_chars > len(content):
        msg = f"offset_chars {args.offset_chars} is past the end of {_shown(note.path)} ({len(content)} characters)"
        raise ToolError(msg)
    end = min(len(content), args.offset_chars + args.max_chars)
    out: dict[str, Any] = {
        "path": _shown(note.path),
        "id": note.id,
        "trust": note.trust,
        "version": note.version,
        "updated": note.updated,
        "total_chars": len(content),
        "offset_chars": args.offset_chars,
        "content": content[args.offset_chars : end],
    }
    if end < len(content):
        out["next_offset_chars"] = end
    return _json(out)


def _notes_list(ctx: Context, args: NoteListArgs) -> str:
    notes = notes_of(ctx)
    cursor = note_path(args.cursor) if args.cursor else None
    page = notes.list(_prefix(args.prefix), limit=args.limit, cursor=cursor)
    return _json(
        {
            "files": [
                {"path": _shown(n.path), "bytes": n.size, "updated": n.updated, "trust": n.trust, "window": n.window}
                for n in page.items
            ],
            "total": page.total,
            "has_more": page.next_cursor is not None,
            **({"next_cursor": _shown(page.next_cursor)} if page.next_cursor else {}),
        }
    )


def _notes_search(ctx: Context, args: NoteSearchArgs) -> str:
    result = notes_of(ctx).search(
        args.query,
        prefix=_prefix(args.prefix),
        case_sensitive=args.case_sensitive,
        max_files=NOTE_SEARCH_FILES,
        max_lines_per_file=NOTE_SEARCH_LINES,
        max_line_chars=NOTE_SEARCH_LINE_CHARS,
    )
    return _json(
        {
            "hits": [{"path": _shown(h.path), "line": h.line, "text": h.text, "trust": h.trust} for h in result.hits],
            "files_matched": result.files_matched,
            "truncated": result.truncated,
            "case_sensitive": args.case_sensitive,
        }
    )


def build_tools() -> list[Tool]:
    """new_context and the notes tools: offered from the first request."""

    def tool(name: str, description: str, params: type[ToolArgs], handler: Any) -> Tool:
        return STRATEGY.tool(name, description, params, handler, cls=CompactTool)

    return [
        tool(
            "new_context",
            "Ask for a fresh context window. Answers 'requested': after this step's results, the window switches and "
            "opens with a handoff (goal, todos, recent instructions, notes, summary). Save what you need in notes first.",
            NewContextArgs,
            _new_context,
        ),
        tool(
            "notes_write_file",
            "Create or replace a private note (self/notes/<path>); survives window switches.",
            NoteWriteArgs,
            _notes_write,
        ),
        tool("notes_append_to_file", "Append to a private note (created when missing).", NoteAppendArgs, _notes_append),
        tool("notes_read_file", "Read a note; continue with next_offset_chars.", NoteReadArgs, _notes_read),
        tool("notes_list_files_by_prefix", "List notes by path prefix.", NoteListArgs, _notes_list),
        tool(
            "notes_search_contents", "Search notes for a substring (10 files x 5 lines).", NoteSearchArgs, _notes_search
        ),
    ]


def build_recall_tools() -> list[Tool]:
    """The four history tools: offered once the surface hides something (``[tools] offer``)."""
    return history_tools(STRATEGY)
