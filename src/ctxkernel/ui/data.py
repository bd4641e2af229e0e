"""What the inspector shows, computed from the kernel: no figure is derived twice.

An :class:`Inspector` keeps the sessions it opened (least recently used first out) and brings an
open one up to date with :meth:`Session.refresh`, which reads only the events appended since. The
timeline and the compaction transactions are the session's :class:`ctxkernel.timeline.Timeline`,
which a session opened from a snapshot restores from it and folds on over the tail only, so the
first view of a long session costs its open, not a walk of its log. The log view never uses the
open session: it reads one page from the store with a bounded read, so paging a 100k-event log
costs a page, not the log.

Everything here returns plain JSON values. Session content (messages, notes, titles) is passed
through as data; the pages put it into the document as text, never as markup.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from .. import events as ev
from ..errors import ProfileError, SessionNotFoundError
from ..events import Event
from ..kernel import Kernel
from ..lineage import lineage
from ..meter import message_text_for_count
from ..profile import list_profiles, load_profile
from ..session import Session
from ..snapshot import LazyEvents
from ..store.base import check_session_id
from ..timeline import Timeline

#: sessions kept open (each holds its log in memory); the least recently used is closed first
CACHE_SIZE = 8
#: events per log page at most, and events a filtered page scans at most before it answers
MAX_PAGE = 500
MAX_SCAN = 5_000
#: characters of one event's JSON, and of one surface message's text, sent to the page
EVENT_CHARS = 20_000
TEXT_CHARS = 4_000
#: characters of a log row's one-line preview
PREVIEW_CHARS = 200
#: settings, by name, that are pressure thresholds (a share of the effective window): the
#: timeline draws every one the session's strategies define
THRESHOLD_SETTINGS = (
    "threshold_ratio",
    "warn_ratios",
    "reminder_ratio",
    "rollover_ratio",
    "pressure_suggestion_ratio",
    "compact_at_ratio",
)


def clip(text: str, limit: int) -> dict[str, Any]:
    """``{"text", "chars"}``: the text cut at ``limit`` characters and its full length."""
    return {"text": text[:limit], "chars": len(text)}


def log_row(event: Event) -> dict[str, Any]:
    """One row of a log page: envelope fields and a one-line preview. The data itself is sent
    when the row is opened (:func:`event_json`): a page shows its rows folded."""
    return {
        "seq": event.seq,
        "type": event.type,
        "time": event.time,
        "surface": event.surface,
        "ignorable": event.ignorable,
        "preview": _preview(event),
    }


def event_json(event: Event) -> dict[str, Any]:
    """One event: its log row and its data as (bounded) indented JSON text."""
    body = orjson.dumps(event.data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    return {**log_row(event), "data": clip(body, EVENT_CHARS)}


def _one_line(text: str) -> str:
    # whitespace runs become one space; a long text is cut first (a preview never needs more)
    return " ".join(text[: PREVIEW_CHARS * 4].split())[:PREVIEW_CHARS]


def _preview(event: Event) -> str:
    d = event.data
    message = event.message_dict
    if message is not None:
        parts = []
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") in ("text", "reasoning"):
                parts.append(str(block.get("text", ""))[: PREVIEW_CHARS * 4])
            elif block.get("type") == "tool_call":
                parts.append(f"{block.get('name')}(…)")
            else:
                parts.append(str(block.get("content", ""))[: PREVIEW_CHARS * 4])
        return _one_line(" ".join(parts))
    if event.type == ev.COMPACTION_SUMMARY:
        return f"{d.get('strategy')}/{d.get('kind')}: {d.get('tokens_before')} -> {d.get('tokens_after')} tokens"
    if event.type in (ev.TURN_START, ev.TURN_END, ev.STEP_START, ev.STEP_END):
        return " ".join(f"{k}={d[k]}" for k in ("turn", "step", "reason") if k in d)
    return _one_line(orjson.dumps(d).decode())


@dataclass
class Opened:
    session: Session
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def timeline(self) -> Timeline:
        """The session's timeline index, up to date with the events folded so far."""
        return Timeline.for_session(self.session)


class Inspector:
    """The read side of the inspector over one kernel's store."""

    def __init__(self, kernel: Kernel, *, cache_size: int = CACHE_SIZE) -> None:
        self.kernel = kernel
        self.store = kernel.store
        self.cache_size = cache_size
        self._opened: OrderedDict[str, Opened] = OrderedDict()
        self._opening: dict[str, threading.Lock] = {}  # session id -> held while it is being opened
        self._kernels: dict[str, Kernel] = {kernel.profile.name: kernel}
        self._lock = threading.RLock()
        #: counts of what the store was asked for (tests check that pages read bounded data)
        self.stats = {"opens": 0, "events_read": 0}

    # -- sessions ---------------------------------------------------------------------------------
    def kernel_for(self, recorded: str | None) -> Kernel:
        """The kernel a session is opened with: the profile it was recorded with when that
        profile is on the search path (as ``ctxkernel inspect`` does), else ours; always over
        this inspector's store."""
        if not recorded or recorded == self.kernel.profile.name or recorded not in list_profiles():
            return self.kernel
        with self._lock:
            if recorded not in self._kernels:
                try:
                    self._kernels[recorded] = Kernel(load_profile(recorded), store=self.store, home=self.kernel.home)
                except ProfileError:
                    self._kernels[recorded] = self.kernel
            return self._kernels[recorded]

    def session_ids(self) -> list[str]:
        return self.store.list_sessions()

    def row(self, session_id: str) -> dict[str, Any]:
        """A session list row from the store alone (header, size, last event): no replay."""
        header = self.store.header(session_id)
        count = self.store.next_seq(session_id)
        last = self._read(session_id, count - 1, count) if count else []
        row: dict[str, Any] = {
            "id": session_id,
            "profile": header.profile,
            "origin": header.origin,
            "parent": header.parent,
            "created": header.created,
            "events": count,
            "last_activity": last[0].time if last else header.created,
        }
        with self._lock:
            opened = self._opened.get(session_id)
        if opened is not None:
            row["summary"] = self.summary(session_id)
        return row

    def open(self, session_id: str) -> Opened:
        """The open session, brought up to date (only new events are read). Requests that find
        it not open yet wait for one open (the session page sends four requests at once)."""
        check_session_id(session_id)
        with self._lock:
            opened = self._opened.get(session_id)
            if opened is not None:
                self._opened.move_to_end(session_id)
            else:
                opening = self._opening.setdefault(session_id, threading.Lock())
        if opened is None:
            with opening:
                with self._lock:
                    opened = self._opened.get(session_id)
                if opened is None:
                    try:
                        opened = self._open(session_id)
                    finally:
                        with self._lock:
                            self._opening.pop(session_id, None)
        with opened.lock:
            self.stats["events_read"] += opened.session.refresh()
        return opened

    def _open(self, session_id: str) -> Opened:
        if not self.store.exists(session_id):
            msg = f"no session {session_id!r} in the {self.store.backend} store"
            raise SessionNotFoundError(msg)
        kernel = self.kernel_for(self.store.header(session_id).profile)
        # the inspector only reads: no crash repair, which would append closing events
        session = kernel.open_session(session_id, repair=False)
        self.stats["opens"] += 1
        self.stats["events_read"] += len(session.events)
        opened = Opened(session)
        with self._lock:
            self._opened[session_id] = opened
            while len(self._opened) > self.cache_size:
                self._opened.popitem(last=False)
        return opened

    def view(self, session_id: str) -> dict[str, Any]:
        """Exactly what ``ctxkernel inspect --json`` prints for the session."""
        opened = self.open(session_id)
        with opened.lock:
            view = opened.session.project()
            view["profile"] = opened.session.kernel.profile.name
            view.update(lineage(opened.session, view.get("strategies")))
        return view

    def summary(self, session_id: str) -> dict[str, Any]:
        """The session list's figures: pressure, windows or chapters, compactions."""
        view = self.view(session_id)
        panels = view["strategies"]
        windows = next(
            (
                p[k]
                for p in panels.values()
                if isinstance(p, dict)
                for k in ("windows", "window_number", "chapters")
                if isinstance(p.get(k), int)
            ),
            None,
        )
        return {
            "profile": view["profile"],
            "parent": view["parent"],
            "events": view["events"],
            "pressure": view["pressure"],
            "windows": windows,
            "compactions": len(view["compactions"]),
        }

    # -- the session page ---------------------------------------------------------------------------
    def timeline(self, session_id: str) -> dict[str, Any]:
        opened = self.open(session_id)
        with opened.lock:
            session = opened.session
            thresholds = []
            # a strategy disabled for this session draws no thresholds: its hooks do not run
            for name in session.enabled_strategies():
                try:
                    settings = session.settings(name).model_dump()
                except ProfileError:
                    continue
                for key in THRESHOLD_SETTINGS:
                    value = settings.get(key)
                    for ratio in value if isinstance(value, list) else [value]:
                        if isinstance(ratio, (int, float)) and not isinstance(ratio, bool):
                            thresholds.append({"strategy": name, "setting": key, "ratio": ratio})
            timeline = opened.timeline
            return {
                "events": len(session.events),
                "requests": timeline.points(),
                "request_count": timeline.requests,
                "measured": timeline.measured(),
                "width": timeline.width,
                "markers": list(timeline.markers),
                # the window alone: pressure() would count the surface for tokens not shown here
                "effective_window": session.model_settings().effective_window,
                "thresholds": thresholds,
            }

    def transactions(self, session_id: str) -> list[dict[str, Any]]:
        opened = self.open(session_id)
        with opened.lock:
            return opened.timeline.transaction_rows()

    def surface(self, session_id: str) -> dict[str, Any]:
        """The surface as the model sees it now, block by block."""
        opened = self.open(session_id)
        with opened.lock:
            session = opened.session
            decay = self._decay_marks(session)
            node_tokens = session.meter.node_tokens
            sources: dict[int, dict[str, Any]] = {}  # user, model and plugin sources are shared objects
            nodes = []
            for node in session.surface.nodes:
                message = node.message
                event = node.event
                op = event.surface or {}
                cites = op.get("cites") or []
                source = sources.get(id(message.source))
                if source is None:
                    source = sources[id(message.source)] = message.source.to_dict()
                item: dict[str, Any] = {
                    "seq": event.seq,
                    "event": event.type,
                    "role": message.role,
                    "source": source,
                    "tokens": node_tokens(node),
                    "text": clip(message_text_for_count(message), TEXT_CHARS),
                    "tool_calls": [{"id": c.id, "name": c.name} for c in message.tool_calls],
                    "tool_result": message.tool_result.call_id if message.tool_result else None,
                    # a replacement cites the log events it stands for
                    "replaces": {
                        "op": op.get("op"),
                        "count": len(cites),
                        "first": cites[0],
                        "last": cites[-1],
                        "cites": cites[:50],
                    }
                    if cites
                    else None,
                }
                if event.seq in decay:
                    item["decay"] = decay[event.seq]
                nodes.append(item)
            return {"events": len(session.events), "tokens": session.meter.surface_tokens(), "nodes": nodes}

    @staticmethod
    def _decay_marks(session: Session) -> dict[int, dict[str, Any]]:
        if not session.kernel.plugins.is_enabled("decay"):
            return {}
        panel = session.kernel.hooks.project(session).get("decay") or {}
        marks: dict[int, dict[str, Any]] = {}
        for position in panel.get("positions") or []:
            marks[position["seq"]] = {"anchor": position.get("anchor"), "kind": position.get("kind")}
        for block in panel.get("blocks") or []:
            if isinstance(block.get("seq"), int):
                marks.setdefault(block["seq"], {})["tier"] = block.get("tier")
        return marks

    # -- the log: bounded reads only -------------------------------------------------------------------
    def _read(self, session_id: str, start: int, end: int) -> list[Event]:
        """Events ``[start, end)``. Those the open session holds in memory come from it (the open
        parsed them: on the session page, the last log page is mostly or wholly the tail the
        open folded after its snapshot); only the others are read from the store, in one bounded
        read."""
        first, held = self._held(session_id, start, end)
        events = list(self.store.read(session_id, start, first)) if start < first else []
        self.stats["events_read"] += len(events)
        return events + held

    def _held(self, session_id: str, start: int, end: int) -> tuple[int, list[Event]]:
        """``(first, events)``: the events ``[first, end)`` the open session holds in memory,
        ``first`` as low as ``start`` where it holds them; ``(end, [])`` when it does not hold
        all of ``[max(start, first), end)`` (not open, or not refreshed up to ``end`` yet)."""
        with self._lock:
            opened = self._opened.get(session_id)
        if opened is None:
            return end, []
        with opened.lock:
            events = opened.session.events
            # a session opened from a snapshot holds the events from its base on (and any it
            # read back before it); asking it for others would read them from the store
            first = max(start, events.base - events.loaded if isinstance(events, LazyEvents) else 0)
            if first < end <= len(events):
                return first, list(events[first:end])
        return end, []

    def log_page(
        self, session_id: str, *, start: int | None = None, limit: int = 100, types: list[str] | None = None
    ) -> dict[str, Any]:
        """One page of the log from ``start`` (default: the last page), optionally only the
        given event types (a type ending in ``/`` matches a namespace). A filtered page scans at
        most :data:`MAX_SCAN` events and says where to continue."""
        check_session_id(session_id)
        if not self.store.exists(session_id):
            msg = f"no session {session_id!r} in the {self.store.backend} store"
            raise SessionNotFoundError(msg)
        count = self.store.next_seq(session_id)
        limit = max(1, min(limit, MAX_PAGE))
        if start is None:
            start = max(0, count - limit) if not types else 0
        start = max(0, min(start, count))
        if not types:
            rows = self._read(session_id, start, min(count, start + limit))
            end = start + len(rows)
        else:
            wanted = [t for t in types if t]

            def match(event_type: str) -> bool:
                return any(event_type == t or (t.endswith("/") and event_type.startswith(t)) for t in wanted)

            rows, end = [], start
            while end < count and len(rows) < limit and end - start < MAX_SCAN:
                chunk = self._read(session_id, end, min(count, end + limit, start + MAX_SCAN))
                for event in chunk:
                    end = event.seq + 1
                    if match(event.type):
                        rows.append(event)
                        if len(rows) == limit:
                            break
        return {
            "events": count,
            "start": start,
            "end": end,
            "limit": limit,
            "types": types or [],
            "rows": [log_row(e) for e in rows],
            "previous": max(0, start - limit) if start > 0 else None,
            "next": end if end < count else None,
        }

    def event(self, session_id: str, seq: int) -> dict[str, Any]:
        check_session_id(session_id)
        rows = self._read(session_id, seq, seq + 1) if seq >= 0 else []
        if not rows:
            msg = f"session {session_id!r} has no event {seq}"
            raise SessionNotFoundError(msg)
        return event_json(rows[0])
