"""The four model-callable history tools over :mod:`ctxkernel.recall.history`, for any strategy.

``history_list_windows``, ``history_list_items``, ``history_read_item`` and
``history_search_contents`` page, read and search the session's own immutable log with the seed's
hard limits. A strategy that takes things off the surface offers them with
``history_tools(STRATEGY)`` in its ``register_tools``; the built-in ``history`` strategy offers
them alone, so any profile can add recall by listing ``history`` (the shipped ``basic`` and
``decay`` profiles do). Every tool answers JSON; a refusal is an error result naming what was
wrong, and nothing is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

import orjson
from pydantic import BaseModel, Field

from ..tools import MAX_INT_ARG, CompactTool, Tool, ToolArgs
from .history import ITEM_CHARS_MAX, LIST_MAX, QUERY_MAX_CHARS, READ_CHARS_MAX, History

if TYPE_CHECKING:
    from ..context import Context

#: history ids (item_<seq>, win_<n>_summary, todo_<seq>_<i>, goal, checklist), cursors, window ids
ID_ARG_CHARS = 128

HISTORY_TOOL_NAMES = (
    "history_list_windows",
    "history_list_items",
    "history_read_item",
    "history_search_contents",
)

#: the system prompt section of a strategy whose history tools are the model's way back
SYSTEM_SECTION = (
    "Nothing in this session is ever deleted: messages compacted out of the context stay in its log. "
    "history_search_contents finds any earlier message by words you saw (summaries quote them); "
    "history_list_items pages through all of them in order (item_<seq> ids, seq_from/seq_to, next_cursor); "
    "history_read_item reads one in full."
)


class _Historian(Protocol):
    """What ``history_tools`` needs of a :class:`ctxkernel.Strategy`: its tools and its handle."""

    def tool(
        self, name: str, description: str, parameters: type[BaseModel], handler: Any, *, cls: type[Tool] = ...
    ) -> Tool: ...

    def on(self, ctx: Context) -> _HistoryHandle: ...


class _HistoryHandle(Protocol):
    def history(self) -> History: ...


class ListWindowsArgs(ToolArgs):
    limit: int | None = Field(default=None, ge=1, le=LIST_MAX, description="20 default, 50 max")
    cursor: str | None = Field(default=None, max_length=ID_ARG_CHARS)


class _Filters(ToolArgs):
    window: Annotated[int, Field(ge=1, le=MAX_INT_ARG)] | Annotated[str, Field(max_length=ID_ARG_CHARS)] | None = Field(
        default=None, description="number, win_<n> or window id"
    )
    role: str | None = Field(
        default=None,
        max_length=ID_ARG_CHARS,
        description="user,plugin,assistant,tool,summary,event (comma-separated; default all but event)",
    )
    seq_from: int | None = Field(default=None, ge=0, le=MAX_INT_ARG, description="first seq")
    seq_to: int | None = Field(default=None, ge=0, le=MAX_INT_ARG, description="last seq")
    limit: int | None = Field(default=None, ge=1, le=LIST_MAX, description="20 default, 50 max")
    max_chars: int | None = Field(default=None, ge=1, le=ITEM_CHARS_MAX, description="per item, 400 default, 1000 max")
    cursor: str | None = Field(default=None, max_length=ID_ARG_CHARS, description="next_cursor; keep filters and order")
    order: Literal["asc", "desc"] = "asc"


class ListItemsArgs(_Filters):
    pass


class SearchArgs(_Filters):
    query: str = Field(min_length=1, max_length=QUERY_MAX_CHARS, description="substring")
    case_sensitive: bool = Field(default=True)


class ReadItemArgs(ToolArgs):
    id: str = Field(
        max_length=ID_ARG_CHARS, description="item_<seq>, win_<n>, win_<n>_summary, goal, checklist, todo_<seq>_<i>"
    )
    format: Literal["text", "json"] = Field(default="text", description="json: the complete raw event")
    offset_chars: int = Field(default=0, ge=0, le=MAX_INT_ARG, description="next_offset_chars")
    max_chars: int | None = Field(default=None, ge=1, le=READ_CHARS_MAX, description="8000 default, 20000 max")


# the brief arguments carry no docstring: pydantic would send it to the model with every request
# as the schema's description
class BriefSearchArgs(ToolArgs):
    # history_search_contents without the window, role and seq filters (brief=True)
    query: str = Field(min_length=1, max_length=QUERY_MAX_CHARS, description="substring")
    case_sensitive: bool = Field(default=True)
    limit: int | None = Field(default=None, ge=1, le=LIST_MAX)
    max_chars: int | None = Field(default=None, ge=1, le=ITEM_CHARS_MAX)
    cursor: str | None = Field(default=None, max_length=ID_ARG_CHARS, description="next_cursor")
    order: Literal["asc", "desc"] = "asc"


class BriefReadItemArgs(ToolArgs):
    # history_read_item for item_<seq> ids, as text (brief=True)
    id: str = Field(max_length=ID_ARG_CHARS, description="item_<seq>")
    offset_chars: int = Field(default=0, ge=0, le=MAX_INT_ARG, description="next_offset_chars")
    max_chars: int | None = Field(default=None, ge=1, le=READ_CHARS_MAX)


def _json(data: Any) -> str:
    return orjson.dumps(data).decode()


def _filters(args: _Filters | BriefSearchArgs) -> dict[str, Any]:
    role = getattr(args, "role", None)  # a brief search has no window, role or seq filters
    return {
        "window": getattr(args, "window", None),
        "role": [r.strip() for r in role.split(",")] if role else None,
        "seq_from": getattr(args, "seq_from", None),
        "seq_to": getattr(args, "seq_to", None),
        "limit": args.limit,
        "max_chars": args.max_chars,
        "cursor": args.cursor,
        "order": args.order,
    }


def history_tools(strategy: _Historian, *, brief: bool = False) -> list[Tool]:
    """The four history tools, owned by ``strategy`` (a :class:`ctxkernel.Strategy`). ``brief``
    gives search and read smaller schemas (every request pays for them): no window, role or seq
    filters, and ``item_<seq>`` ids read as text; a strategy with no windows of its own loses
    nothing by it."""
    search_args: type[ToolArgs] = BriefSearchArgs if brief else SearchArgs
    read_args: type[ToolArgs] = BriefReadItemArgs if brief else ReadItemArgs

    def tool(name: str, description: str, params: type[ToolArgs], handler: Any) -> Tool:
        return strategy.tool(name, description, params, handler, cls=CompactTool)

    def history_windows(ctx: Context, args: ListWindowsArgs) -> str:
        return _json(strategy.on(ctx).history().list_windows(limit=args.limit, cursor=args.cursor))

    def history_items(ctx: Context, args: ListItemsArgs) -> str:
        return _json(strategy.on(ctx).history().list_items(**_filters(args)))

    def history_search(ctx: Context, args: SearchArgs | BriefSearchArgs) -> str:
        history = strategy.on(ctx).history()
        return _json(history.search(args.query, case_sensitive=args.case_sensitive, **_filters(args)))

    def history_read(ctx: Context, args: ReadItemArgs | BriefReadItemArgs) -> str:
        form = getattr(args, "format", "text")
        return _json(
            strategy.on(ctx)
            .history()
            .read_item(args.id, format=form, offset_chars=args.offset_chars, max_chars=args.max_chars)
        )

    return [
        tool("history_list_windows", "List this session's context windows.", ListWindowsArgs, history_windows),
        tool(
            "history_list_items",
            "List items (item_<seq>) of this session's full raw history with previews.",
            ListItemsArgs,
            history_items,
        ),
        tool(
            "history_read_item",
            "Read a history item in full."
            if brief
            else "Read a history item in full, or a win_<n>, win_<n>_summary, goal, checklist or todo id from a handoff.",
            read_args,
            history_read,
        ),
        tool(
            "history_search_contents",
            "Search this session's full raw history for a substring (case-sensitive by default).",
            search_args,
            history_search,
        ),
    ]


__all__ = [
    "HISTORY_TOOL_NAMES",
    "BriefReadItemArgs",
    "BriefSearchArgs",
    "ID_ARG_CHARS",
    "SYSTEM_SECTION",
    "ListItemsArgs",
    "ListWindowsArgs",
    "ReadItemArgs",
    "SearchArgs",
    "history_tools",
]
