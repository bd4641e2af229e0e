"""The incremental index of a session's own immutable log: windows, instructions, the goal and
the todo lists, and each event's searchable text. :mod:`ctxkernel.recall.history` pages, reads
and searches it (``History``); this module folds it.

The index is built incrementally: :meth:`HistoryIndex.for_session` keeps one index per session
object (in ``session.state``) with a cursor over ``session.events``, so each query folds only the
events appended since the last one and an unchanged session scans 0 events (the ``scanned``
counter proves it in tests and benchmarks). Event bodies are never copied: the log is the store,
the index holds seqs.

Windows are delimited by committed window switches (a ``compaction/summary`` event with
``kind == "window"``) and by native summary checkpoints (``kind`` ``summary`` or ``checkpoint``:
basic's, handoff's native mode, decay's manual ``/compact``), which replace the surface head the
same way. Events belong to the window that was current when they were appended, so
old messages kept verbatim in a retained tail still belong to the window that produced them. The
summary event closes the outgoing window; the handoff message right after it opens the next one.
A switch may carry a window id in its data (``window_id``, e.g. rollover's UUIDv7).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Self

import orjson

from ..errors import ToolError
from ..events import ASSISTANT_MESSAGE, COMPACTION_SUMMARY, SESSION_TASK, TOOL_RESULT, USER_MESSAGE, Event
from ..logging import get_logger
from ..snapshot import folded_cursor
from ..task import substantive
from ..text import safe_cut

if TYPE_CHECKING:
    from ..session import Session

# -- limits (the seed's table; every one has a test at and just past the bound) ---------------------
LIST_DEFAULT = 20
LIST_MAX = 50
ITEM_CHARS_DEFAULT = 400
ITEM_CHARS_MAX = 1_000
SCAN_EVENTS_PER_PAGE = 2_000
SCAN_CHARS_PER_PAGE = 2_000_000
PREVIEW_CHARS_PER_PAGE = 12_000
READ_CHARS_DEFAULT = 8_000
READ_CHARS_MAX = 20_000
#: longest search query accepted (a query longer than any preview could not be shown anyway)
QUERY_MAX_CHARS = 1_000

#: item roles a listing or search can filter on
ROLES = ("user", "plugin", "assistant", "tool", "summary", "event")
#: roles listed when no role filter is given: what was said and done, not the bookkeeping
DEFAULT_ROLES = ("user", "plugin", "assistant", "tool", "summary")
WINDOW_KIND = "window"
#: compaction kinds that open a new window: switches, and the native summary checkpoints (basic's,
#: handoff's native mode, decay's manual ``/compact``) that replace the surface head the same way
WINDOW_KINDS = {WINDOW_KIND: "switch", "summary": "checkpoint", "checkpoint": "checkpoint"}
STATE_KEY = "ctxkernel.recall.history"
#: the format of :meth:`History.folded` in session snapshots (bump it when that shape changes)
FOLDED_VERSION = 1
#: user-written messages searched for the goal (an opener is short: the goal is among the first few)
GOAL_SCAN = 50
#: the reader's role of each event type but user messages (``"user"`` or ``"plugin"`` by their
#: source); any other type is an ``"event"``
ROLE_OF_TYPE = {ASSISTANT_MESSAGE: "assistant", TOOL_RESULT: "tool", COMPACTION_SUMMARY: "summary"}

log = get_logger("ctxkernel.recall")

#: tool names whose arguments are the model's todo list, and the argument holding it
TODO_TOOLS: dict[str, tuple[str, ...]] = {
    "TodoWrite": ("todos",),
    "todo_write": ("todos",),
    "todowrite": ("todos",),
    "update_plan": ("plan",),
    "update_todos": ("todos",),
    "set_todos": ("todos",),
}
_DONE = frozenset({"completed", "complete", "done", "cancelled", "canceled"})

# matched whole (fullmatch: '$' would accept a trailing newline); ASCII digits, at most 18 of them, so
# that int() never sees a Unicode digit or a number past its digit limit sent by a model
_ITEM_ID = re.compile(r"item_([0-9]{1,18})")
_WIN_ID = re.compile(r"win_([0-9]{1,18})(_summary)?")
_WIN_NUMBER = re.compile(r"[0-9]{1,18}")
_TODO_ID = re.compile(r"todo_([0-9]{1,18})_([0-9]{1,18})")
_CURSOR = re.compile(r"c([0-9]{1,18})\.([0-9a-f]{8})")


class HistoryError(ToolError):
    """A history query was refused (bad id, filter, cursor or limit); nothing was read."""


@dataclass
class Window:
    """One context window: the contiguous seqs appended while it was current."""

    number: int
    start_seq: int
    id: str | None = None
    end_seq: int | None = None  # None while current
    opened_by: int | None = None  # seq of the summary event of the switch that opened it
    closed_by: int | None = None  # seq of the summary event of the switch that closed it
    reason: str | None = None  # why the switch that opened it happened
    strategy: str | None = None
    started: str = ""
    ended: str = ""
    opened_as: str | None = None  # "switch" (a window switch) or "checkpoint" (a native summary)

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.number,
            "ref": f"win_{self.number}",
            "window_id": self.id,
            "first_item": f"item_{self.start_seq}",
            "last_item": None if self.end_seq is None else f"item_{self.end_seq}",
            "current": self.end_seq is None,
            "opened_by": None if self.opened_by is None else f"item_{self.opened_by}",
            "summary_item": None if self.closed_by is None else f"item_{self.closed_by}",
            "reason": self.reason,
            "strategy": self.strategy,
            "opened_as": self.opened_as,
            "started": self.started,
            "ended": self.ended or None,
        }


@dataclass
class TodoEntry:
    ref: str
    text: str
    status: str
    seq: int

    @property
    def open(self) -> bool:
        return self.status.lower() not in _DONE


@dataclass
class HistoryIndex:
    """The incremental index of one session's log. Build it with :meth:`for_session` (as a
    :class:`ctxkernel.recall.history.History`, which adds the queries)."""

    session: Session
    cursor: int = 0  # events folded so far
    scanned: int = 0  # events folded over this object's life (0 more for an unchanged log)
    windows: list[Window] = field(default_factory=list)
    window_starts: list[int] = field(default_factory=list)
    # per-event indexes (see the properties); opened from a snapshot they start at ``_head``, and
    # the events before it are folded into them the first time one of them is read
    _tool_names: dict[str, str] = field(default_factory=dict, repr=False)  # call id -> tool name
    _call_seqs: dict[str, int] = field(default_factory=dict, repr=False)  # call id -> assistant seq
    _instructions: list[int] = field(default_factory=list, repr=False)  # seqs of user-written messages
    todo_seq: int | None = None  # assistant seq of the latest todo-list call
    todo_call: int = 0  # index of that call within the message
    goal_seq: int | None = None  # the session/task event that set the current goal
    #: the goal when no ``session/task`` sets one (see :meth:`goal`), folded with the windows so
    #: that finding it reads no event before a snapshot: the first substantive user-written
    #: message among the first GOAL_SCAN, else the first one
    goal_instruction: int | None = None
    _goal_scanned: int = field(default=0, repr=False)  # user-written messages examined (GOAL_SCAN: done)
    #: False for an index restored from a snapshot written without ``goal_instruction``
    _goal_folded: bool = field(default=True, repr=False)
    task_todos_seq: int | None = None  # the session/task event that set the harness's todo list
    # searchable text per seq, built on first use: a log never changes, so neither does this,
    # and searching again costs a scan, not a re-render (single-block messages share the string)
    _texts: dict[int, str] = field(default_factory=dict, repr=False)
    # role of every folded event by seq (search filters on it without looking at the event)
    _role_by_seq: list[str] = field(default_factory=list, repr=False)
    #: events ``0.._head-1`` are not in the per-event indexes yet (opened from a snapshot)
    _head: int = field(default=0, repr=False)

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def for_session(cls, session: Session) -> Self:
        """The session's history index, brought up to date with its log (cached per session)."""
        history = session.state.get(STATE_KEY)
        if not isinstance(history, cls) or history.session is not session:
            history = cls(session)
            folded = session.snapshot_indexes.pop(STATE_KEY, None)
            if folded is not None:
                history._restore(folded)
            session.state[STATE_KEY] = history
        history.sync()
        return history

    @property
    def events(self) -> Sequence[Event]:
        """The session's log the index covers (read-only)."""
        return self.session.events

    # -- session snapshots ------------------------------------------------------------------------------
    def folded(self) -> dict[str, Any]:
        """What a session snapshot keeps of the index: the windows and the task pointers (bounded
        by the number of windows, not by the log), folded to the end of the log first. The
        per-event indexes are rebuilt from the events before the snapshot when first read."""
        self.sync()
        return {
            "version": FOLDED_VERSION,
            "cursor": self.cursor,
            "windows": [asdict(w) for w in self.windows],
            "todo": [self.todo_seq, self.todo_call],
            "goal_seq": self.goal_seq,
            "task_todos_seq": self.task_todos_seq,
            "goal_instruction": [self.goal_instruction, self._goal_scanned],
        }

    def _restore(self, data: Any) -> None:
        """Start from :meth:`folded` output; anything malformed is set aside with a warning (the
        index is then folded from the first event, as without a snapshot)."""
        try:
            cursor = folded_cursor(data, FOLDED_VERSION, len(self.session.events))
            windows = [Window(**w) for w in data["windows"]]
            if not windows or any(type(w.number) is not int or type(w.start_seq) is not int for w in windows):
                msg = "windows must be a non-empty list of windows"
                raise ValueError(msg)
            todo_seq, todo_call = data["todo"]
            pointers = (todo_seq, data["goal_seq"], data["task_todos_seq"])
            if type(todo_call) is not int or not all(p is None or type(p) is int for p in pointers):
                msg = "the task pointers must be integers or null"
                raise ValueError(msg)
            # absent from snapshots written before it was folded: goal() then scans the instructions
            goal = data.get("goal_instruction")
            if goal is not None and not (
                isinstance(goal, list)
                and len(goal) == 2
                and (goal[0] is None or type(goal[0]) is int)
                and type(goal[1]) is int
            ):
                msg = "goal_instruction must be [seq or null, examined]"
                raise ValueError(msg)
        except Exception as exc:  # a malformed part costs a full fold, never the open
            log.warning(
                "history index snapshot set aside; folding the whole log",
                session=self.session.id,
                reason=f"{type(exc).__name__}: {exc}"[:300],
            )
            return
        self.cursor = self._head = cursor
        self.windows = windows
        self.window_starts = [w.start_seq for w in windows]
        self.todo_seq, self.todo_call = todo_seq, todo_call
        self.goal_seq, self.task_todos_seq = data["goal_seq"], data["task_todos_seq"]
        if goal is None:
            self._goal_folded = False
        else:
            self.goal_instruction, self._goal_scanned = goal

    def _fold_head(self) -> None:
        """Fold the events before the snapshot into the per-event indexes (on first read)."""
        head, self._head = self._head, 0
        if not head:
            return
        names: dict[str, str] = {}
        seqs: dict[str, int] = {}
        instructions: list[int] = []
        roles: list[str] = []
        self._scan(self.session.events[:head], names, seqs, instructions, roles, fold=False)
        self._role_by_seq[:0] = roles
        self._instructions[:0] = instructions
        self._tool_names = {**names, **self._tool_names}
        self._call_seqs = {**seqs, **self._call_seqs}

    @property
    def tool_names(self) -> dict[str, str]:
        """Call id -> tool name, for every tool call in the log."""
        self._fold_head()
        return self._tool_names

    @property
    def call_seqs(self) -> dict[str, int]:
        """Call id -> the seq of the assistant message that made the call."""
        self._fold_head()
        return self._call_seqs

    @property
    def instructions(self) -> list[int]:
        """Seqs of the user-written messages, oldest first."""
        self._fold_head()
        return self._instructions

    def sync(self) -> int:
        """Fold the events appended since the last call; returns how many were scanned."""
        events = self.session.events
        if not self.windows:
            self.windows.append(Window(1, 0, started=events[0].time if events else ""))
            self.window_starts.append(0)
        start = self.cursor
        end = len(events)
        if start == end:
            return 0
        if not self.windows[0].started:
            self.windows[0].started = events[0].time
        self._scan(
            events[start:end], self._tool_names, self._call_seqs, self._instructions, self._role_by_seq, fold=True
        )
        self.cursor = end
        self.scanned += end - start
        return end - start

    def _scan(
        self,
        events: Sequence[Event],
        names: dict[str, str],
        seqs: dict[str, int],
        instructions: list[int],
        roles: list[str],
        *,
        fold: bool,
    ) -> None:
        """One pass over ``events``: the per-event indexes (call ids, user-written instructions,
        :meth:`role_of` of each event) and, with ``fold``, the windows and task pointers (kept in
        snapshots; a snapshot's head is scanned without them). One dispatch on the type per
        event, message types first: a first build of a long log is this loop."""
        add_role, assistant, user, tool = roles.append, ASSISTANT_MESSAGE, USER_MESSAGE, TOOL_RESULT
        for event in events:
            t = event.type
            if t == assistant:
                add_role("assistant")
                blocks = event.data["message"].get("content", ())
                todo = False
                for block in blocks:
                    if block.get("type") == "tool_call":
                        call_id, name = block.get("id"), block.get("name")
                        names[call_id] = name
                        seqs[call_id] = event.seq
                        if fold and name in TODO_TOOLS:
                            todo = True
                if todo:  # rare: the loop above stays free of an enumerate per message
                    self._fold_todo(event.seq, blocks)
            elif t == user:
                message = event.data["message"]
                written = (message.get("source") or {}).get("kind", "user") == "user"  # _source_kind, inlined
                add_role("user" if written else "plugin")
                if written and (event.surface or {}).get("op") == "append":
                    instructions.append(event.seq)
                    if fold and self._goal_scanned < GOAL_SCAN:
                        self._fold_goal(event)
            elif t == tool:
                add_role("tool")
            else:
                add_role(ROLE_OF_TYPE.get(t, "event"))
                if fold:
                    self._fold(event)

    def _fold_todo(self, seq: int, blocks: Sequence[dict[str, Any]]) -> None:
        """An assistant message with a todo-list call: the last such call is the checklist."""
        for i, block in enumerate(blocks):
            if block.get("type") == "tool_call" and block.get("name") in TODO_TOOLS:
                self.todo_seq, self.todo_call = seq, i

    def _fold_goal(self, event: Event) -> None:
        """One of the first GOAL_SCAN user-written messages: the goal when it is substantive."""
        self._goal_scanned += 1
        if substantive(self.text_of(event)):
            self.goal_instruction, self._goal_scanned = event.seq, GOAL_SCAN
        elif self.goal_instruction is None:
            self.goal_instruction = event.seq

    def _fold(self, event: Event) -> None:
        """The windows' and task pointers' part of the fold for the other event types."""
        t = event.type
        if t == SESSION_TASK:
            d = event.data
            if isinstance(d.get("goal"), str):
                self.goal_seq = event.seq if d["goal"] else None
            if isinstance(d.get("todos"), list):
                self.task_todos_seq = event.seq
        elif t == COMPACTION_SUMMARY and event.data.get("kind") in WINDOW_KINDS:
            d = event.data
            outgoing = self.windows[-1]
            outgoing.end_seq = event.seq
            outgoing.closed_by = event.seq
            outgoing.ended = event.time
            window_id = d.get("window_id")
            self.windows.append(
                Window(
                    outgoing.number + 1,
                    event.seq + 1,
                    id=window_id if isinstance(window_id, str) else None,
                    opened_by=event.seq,
                    reason=d.get("reason") if isinstance(d.get("reason"), str) else None,
                    strategy=d.get("strategy"),
                    started=event.time,
                    opened_as=WINDOW_KINDS[d["kind"]],
                )
            )
            self.window_starts.append(event.seq + 1)

    # -- lookups --------------------------------------------------------------------------------------
    @property
    def current_window(self) -> Window:
        return self.windows[-1]

    def window_of(self, seq: int) -> int:
        """The number of the window that was current when event ``seq`` was appended."""
        return bisect.bisect_right(self.window_starts, seq)

    def window(self, ref: int | str) -> Window:
        """A window by number (``3``, ``"3"``, ``"win_3"``) or by the id its switch carried."""
        if isinstance(ref, bool):
            ref = str(ref)
        if isinstance(ref, str):
            text = ref.strip()
            match = _WIN_ID.fullmatch(text)
            if match and not match.group(2):
                ref = int(match.group(1))
            elif _WIN_NUMBER.fullmatch(text):
                ref = int(text)
            else:
                for window in self.windows:
                    if window.id == text:
                        return window
                known = [w.id for w in self.windows if w.id][-5:]
                msg = f"no window {text!r}: give a window number 1..{len(self.windows)}, 'win_<n>', or a window id" + (
                    f" (latest ids: {known})" if known else ""
                )
                raise HistoryError(msg)
        if not 1 <= ref <= len(self.windows):
            msg = f"no window {ref}: this session has windows 1..{len(self.windows)}"
            raise HistoryError(msg)
        return self.windows[ref - 1]

    def tool_name(self, call_id: str) -> str | None:
        return self.tool_names.get(call_id)

    def goal(self) -> Event | None:
        """The event holding the session's goal: the harness's ``session/task``, else the first
        substantive user instruction, else the first one (None before there is any)."""
        events = self.session.events
        if self.goal_seq is not None:
            return events[self.goal_seq]
        if self._goal_folded:
            return None if self.goal_instruction is None else events[self.goal_instruction]
        for seq in self.instructions[:GOAL_SCAN]:
            if substantive(self.text_of(events[seq])):
                return events[seq]
        return events[self.instructions[0]] if self.instructions else None

    def goal_text(self) -> str | None:
        """The goal's text (see :meth:`goal`)."""
        event = self.goal()
        if event is None:
            return None
        return str(event.data["goal"]) if event.type == SESSION_TASK else self.text_of(event)

    def checklist(self) -> list[TodoEntry]:
        """The latest todo list, the model's or the harness's, every entry with its
        ``todo_<seq>_<i>`` id."""
        task = self.task_todos_seq
        if task is not None and (self.todo_seq is None or task > self.todo_seq):
            todos = self.session.events[task].data["todos"]
            return [TodoEntry(f"todo_{task}_{i}", t["text"], t["status"], task) for i, t in enumerate(todos)]
        return self._model_checklist()

    def _model_checklist(self) -> list[TodoEntry]:
        if self.todo_seq is None:
            return []
        event = self.session.events[self.todo_seq]
        block = event.data["message"]["content"][self.todo_call]
        args = block.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = orjson.loads(args)
            except orjson.JSONDecodeError:
                return []
        entries = None
        for key in TODO_TOOLS.get(block.get("name"), ()):
            if isinstance(args, dict) and isinstance(args.get(key), list):
                entries = args[key]
        out = []
        for i, raw in enumerate(entries or []):
            if isinstance(raw, dict):
                text = raw.get("content") or raw.get("step") or raw.get("text") or raw.get("title") or ""
                status = raw.get("status") or "pending"
            else:
                text, status = str(raw), "pending"
            out.append(TodoEntry(f"todo_{event.seq}_{i}", str(text), str(status), event.seq))
        return out

    # -- item views ------------------------------------------------------------------------------------
    def role_of(self, event: Event) -> str:
        if event.type == USER_MESSAGE:
            return "user" if _source_kind(event.data) == "user" else "plugin"
        return ROLE_OF_TYPE.get(event.type, "event")

    def text_of(self, event: Event) -> str:
        """What a reader searches and previews: message text, reasoning, tool calls with their
        arguments, tool output, summaries; other events as their JSON data."""
        text = self._texts.get(event.seq)
        if text is None:
            text = self._texts[event.seq] = self._render(event)
        return text

    def _texts_for(self, seqs: list[int]) -> list[str]:
        """:meth:`text_of` of each seq, rendering only those never rendered."""
        cache = self._texts
        missing = [seq for seq in seqs if seq not in cache]
        if missing:
            events = self.session.events
            for seq in missing:
                cache[seq] = self._render(events[seq])
        return [cache[seq] for seq in seqs]

    def _render(self, event: Event) -> str:
        t, d = event.type, event.data
        if t in (USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT):
            parts = []
            for block in d["message"].get("content", ()):
                kind = block.get("type")
                if kind == "text":
                    parts.append(block.get("text", ""))
                elif kind == "reasoning":
                    parts.append("[reasoning] " + block.get("text", ""))
                elif kind == "tool_call":
                    args = block.get("arguments")
                    rendered = args if isinstance(args, str) else orjson.dumps(args).decode()
                    parts.append(f"[call {block.get('name')} {block.get('id')}] {rendered}")
                elif kind == "tool_result":
                    parts.append(block.get("content", ""))
            return "\n".join(parts)
        if t == COMPACTION_SUMMARY:
            summary: str = d.get("summary", "")
            return summary
        if t == SESSION_TASK:
            todos = [f"[{x['status']}] {x['text']}" for x in d.get("todos") or []]
            return "\n".join([*([f"Goal: {d['goal']}"] if d.get("goal") else []), *todos])
        return orjson.dumps(d).decode()

    def meta(self, event: Event) -> dict[str, Any]:
        """Item metadata: id, seq, type, role, window, time, and the tool a result answers."""
        out: dict[str, Any] = {
            "id": f"item_{event.seq}",
            "seq": event.seq,
            "type": event.type,
            "role": self.role_of(event),
            "window": self.window_of(event.seq),
            "time": event.time,
        }
        if event.type == TOOL_RESULT:
            block = event.data["message"]["content"][0]
            call_id = block.get("call_id")
            out["call_id"] = call_id
            out["tool"] = self.tool_names.get(call_id) or block.get("name")
            out["call_item"] = f"item_{self.call_seqs[call_id]}" if call_id in self.call_seqs else None
            if block.get("is_error"):
                out["is_error"] = True
        elif event.type == ASSISTANT_MESSAGE:
            calls = [b.get("name") for b in event.data["message"].get("content", ()) if b.get("type") == "tool_call"]
            if calls:
                out["tools"] = calls
        elif event.type == USER_MESSAGE:
            source = event.data["message"].get("source") or {}
            if source.get("kind") == "plugin":
                out["source"] = f"{source.get('plugin')}/{source.get('form')}"
            if (event.surface or {}).get("op") == "replace":
                out["replaces"] = len(event.surface["cites"])  # type: ignore[index]
        elif event.type == COMPACTION_SUMMARY:
            out["kind"] = event.data.get("kind")
            out["strategy"] = event.data.get("strategy")
        return out


# -- helpers ---------------------------------------------------------------------------------------------
def _source_kind(data: dict[str, Any]) -> str:
    source = data["message"].get("source") or {}
    kind: str = source.get("kind", "user")
    return kind


def _head(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return _clip_chars(text, max(0, limit - 1)) + "…", True


def _render(data: Any, fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
    if isinstance(data, dict):
        return "\n".join(f"{k}: {v}" for k, v in data.items())
    return str(data)


def _clip_chars(text: str, limit: int) -> str:
    """At most ``limit`` characters, never splitting a grapheme (nor a surrogate pair)."""
    return text if len(text) <= limit else text[: safe_cut(text, limit)]
