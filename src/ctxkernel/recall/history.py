"""Paged recall over a session's own immutable log (the history behind every window switch).

Strategies that take things off the surface (``handoff``, ``rollover``) give the model a way back:
``item_<seq>`` is a stable address of one event of the log, and the queries here list, read and
search those events with the seed's hard limits, so a recall never floods the context it was
meant to relieve.

:class:`History` is the session's index (:mod:`ctxkernel.recall.history_index`: windows,
instructions, goal, todo lists, folded incrementally) with the queries below; strategies get it
from their handle (``STRATEGY.on(ctx).history()``).

Ids that :meth:`History.read_item` resolves:

``item_<seq>``          one event of the log
``win_<n>``             window ``n`` (1 is the session's first)
``win_<n>_summary``     the summary event of the switch that closed window ``n``
``goal``                the session's goal: the one the harness set (``session/task``), else its
                        first substantive user instruction (a trivial opener such as "hi" is not one)
``checklist``           the latest todo list: the model's (``TodoWrite``, ``update_plan``, ...) or
                        the harness's (``session/task``), whichever was written last
``todo_<seq>_<i>``      entry ``i`` of the todo list written at ``seq``
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import re
from collections.abc import Sequence
from typing import Any

import orjson

from ..events import ASSISTANT_MESSAGE, SESSION_TASK, Event
from .history_index import (
    _CURSOR,
    _ITEM_ID,
    _TODO_ID,
    _WIN_ID,
    DEFAULT_ROLES,
    FOLDED_VERSION,
    GOAL_SCAN,
    ITEM_CHARS_DEFAULT,
    ITEM_CHARS_MAX,
    LIST_DEFAULT,
    LIST_MAX,
    PREVIEW_CHARS_PER_PAGE,
    QUERY_MAX_CHARS,
    READ_CHARS_DEFAULT,
    READ_CHARS_MAX,
    ROLES,
    SCAN_CHARS_PER_PAGE,
    SCAN_EVENTS_PER_PAGE,
    STATE_KEY,
    TODO_TOOLS,
    WINDOW_KINDS,
    HistoryError,
    HistoryIndex,
    TodoEntry,
    Window,
    _clip_chars,
    _head,
    _render,
)


class History(HistoryIndex):
    """The index of one session's log, and its paged queries. Build it with :meth:`for_session`."""

    # -- queries ---------------------------------------------------------------------------------------
    def list_windows(self, *, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """Windows oldest first, ``limit`` per page (20 default, 50 max)."""
        self.sync()
        limit = _limit(limit)
        start = _decode_cursor(cursor, _fingerprint("windows")) if cursor else 1
        if start < 1:  # no page answers a cursor before the first window (0 would read from the last)
            msg = f"cursor {cursor!r} is not one this history returned: pass next_cursor exactly, or omit it to start over"
            raise HistoryError(msg)
        page = self.windows[start - 1 : start - 1 + limit]
        nxt = start + len(page)
        has_more = nxt <= len(self.windows)
        out: dict[str, Any] = {
            "windows": [self._window_dict(w) for w in page],
            "current_window": self.current_window.number,
            "has_more": has_more,
        }
        if has_more:
            out["next_cursor"] = _encode_cursor(nxt, _fingerprint("windows"))
        return out

    def _window_dict(self, window: Window) -> dict[str, Any]:
        out = window.to_dict()
        end = window.end_seq if window.end_seq is not None else self.cursor - 1
        out["events"] = max(0, end - window.start_seq + 1)
        return out

    def list_items(
        self,
        *,
        window: int | str | None = None,
        role: str | list[str] | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        max_chars: int | None = None,
        cursor: str | None = None,
        order: str = "asc",
    ) -> dict[str, Any]:
        """Items matching the filters, with a preview of ``max_chars`` each (400 default, 1,000 max).

        One page scans at most 2,000 events or about 2,000,000 content characters (an event is
        always checked in full) and shows at most 12,000 preview characters; ``has_more`` and
        ``next_cursor`` continue it (keep the same filters and order).
        """
        return self._query(None, True, window, role, seq_from, seq_to, limit, max_chars, cursor, order)

    def search(
        self,
        query: str,
        *,
        case_sensitive: bool = True,
        window: int | str | None = None,
        role: str | list[str] | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        max_chars: int | None = None,
        cursor: str | None = None,
        order: str = "asc",
    ) -> dict[str, Any]:
        """Items whose text contains ``query`` (case-sensitive unless ``case_sensitive=False``),
        each with a snippet around the first match; paging and limits as :meth:`list_items`."""
        if not isinstance(query, str) or not query:
            msg = "search needs a non-empty query string"
            raise HistoryError(msg)
        if len(query) > QUERY_MAX_CHARS:
            msg = f"search query is {len(query)} characters; the limit is {QUERY_MAX_CHARS}: search for a shorter distinctive part"
            raise HistoryError(msg)
        return self._query(query, case_sensitive, window, role, seq_from, seq_to, limit, max_chars, cursor, order)

    # over the complexity cap: each filter of a history query (role, seq range, window, cursor,
    # order) validated and applied in one pass over the index
    def _query(  # noqa: C901
        self,
        query: str | None,
        case_sensitive: bool,
        window: int | str | None,
        role: str | list[str] | None,
        seq_from: int | None,
        seq_to: int | None,
        limit: int | None,
        max_chars: int | None,
        cursor: str | None,
        order: str,
    ) -> dict[str, Any]:
        self.sync()
        limit = _limit(limit)
        per_item = _chars(max_chars)
        roles = _roles(role)
        if order not in ("asc", "desc"):
            msg = f"order must be 'asc' (oldest first) or 'desc' (newest first), got {order!r}"
            raise HistoryError(msg)
        lo, hi = 0, self.cursor - 1
        win = None
        if window is not None:
            win = self.window(window)
            lo = win.start_seq
            hi = win.end_seq if win.end_seq is not None else hi
        for name, value in (("seq_from", seq_from), ("seq_to", seq_to)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                msg = f"{name} must be a non-negative event seq, got {value!r}"
                raise HistoryError(msg)
        if seq_from is not None:
            lo = max(lo, seq_from)
        if seq_to is not None:
            hi = min(hi, seq_to)
        fingerprint = _fingerprint(
            query, case_sensitive, win.number if win else None, sorted(roles), seq_from, seq_to, order
        )
        if cursor:
            position = _decode_cursor(cursor, fingerprint)
            if order == "asc":
                lo = max(lo, position)
            else:
                hi = min(hi, position)
        pattern = None
        if query is not None:
            pattern = re.compile(re.escape(query), 0 if case_sensitive else re.IGNORECASE)
        events = self.session.events
        seqs = range(lo, hi + 1) if order == "asc" else range(hi, lo - 1, -1)
        # The page scans at most SCAN_EVENTS_PER_PAGE events and stops once SCAN_CHARS_PER_PAGE
        # characters of wanted roles were scanned, or at the event after the one that filled the
        # item limit or the preview budget. The candidates are found first, in bulk (a role
        # filter and a substring test per text, as a raw scan does), then only matches are
        # turned into items; the stop, scanned_events and scanned_chars are those of a
        # one-event-at-a-time loop.
        block = seqs[:SCAN_EVENTS_PER_PAGE]
        self._fold_head()
        role_by_seq = self._role_by_seq
        wanted = [p for p, seq in enumerate(block) if role_by_seq[seq] in roles]  # positions in block
        texts = self._texts_for([block[p] for p in wanted])
        sizes = list(itertools.accumulate(map(len, texts)))  # chars scanned after each wanted event
        stop = SCAN_EVENTS_PER_PAGE if len(seqs) > SCAN_EVENTS_PER_PAGE else None
        full = bisect.bisect_left(sizes, SCAN_CHARS_PER_PAGE)
        if full < len(wanted):  # the chars budget is spent at that event: stop at the next one
            wanted, texts = wanted[: full + 1], texts[: full + 1]
            stop = min(stop, wanted[-1] + 1) if stop is not None else wanted[-1] + 1
        hits: Sequence[int]
        if pattern is None:
            hits = range(len(wanted))
        elif case_sensitive:  # a literal test is several times faster than the regex engine
            hits = [k for k, text in enumerate(texts) if query in text]  # type: ignore[operator]
        else:
            search = pattern.search
            hits = [k for k, text in enumerate(texts) if search(text) is not None]
        items: list[dict[str, Any]] = []
        preview_used = 0
        for k in hits:
            if stop is not None and wanted[k] >= stop:
                break
            text = texts[k]
            if pattern is None:
                snippet, truncated = _head(text, per_item)
                matches = None
            elif case_sensitive:
                at = text.find(query)  # type: ignore[arg-type]
                snippet, truncated = _around(text, at, at + len(query), per_item)  # type: ignore[arg-type]
                matches = text.count(query)  # type: ignore[arg-type]
            else:
                found = pattern.search(text)
                assert found is not None
                snippet, truncated = _around(text, found.start(), found.end(), per_item)
                matches = sum(1 for _ in pattern.finditer(text))
            room = PREVIEW_CHARS_PER_PAGE - preview_used
            if len(snippet) > room:
                snippet, truncated = _clip_chars(snippet, room), True
            preview_used += len(snippet)
            event = events[block[wanted[k]]]
            item = self.meta(event)
            item["chars"] = len(text)
            item["preview" if pattern is None else "snippet"] = snippet
            if truncated:
                item["truncated"] = True
            if matches is not None:
                item["matches"] = matches
            items.append(item)
            if len(items) >= limit or preview_used >= PREVIEW_CHARS_PER_PAGE:
                stop = min(stop, wanted[k] + 1) if stop is not None else wanted[k] + 1
                break
        if stop is not None and stop >= len(seqs):
            stop = None  # the limit was reached on the last event: nothing is left to page to
        scanned = len(block) if stop is None else stop
        counted = bisect.bisect_left(wanted, scanned)  # wanted events before the stop
        chars = sizes[counted - 1] if counted else 0
        stopped_at = None if stop is None else seqs[stop]
        out: dict[str, Any] = {
            "items": items,
            "scanned_events": scanned,
            "scanned_chars": chars,
            "has_more": stopped_at is not None,
        }
        if stopped_at is not None:
            out["next_cursor"] = _encode_cursor(stopped_at, fingerprint)
        if query is not None:
            out["case_sensitive"] = case_sensitive
        return out

    def read_item(
        self, item_id: str, *, format: str = "text", offset_chars: int = 0, max_chars: int | None = None
    ) -> dict[str, Any]:
        """The body of an item (or of a window, goal or checklist id), ``max_chars`` at a time
        (8,000 default, 20,000 max) from ``offset_chars``; ``format="json"`` pages the complete
        raw event(s). ``next_offset_chars`` continues a long body."""
        self.sync()
        if format not in ("text", "json"):
            msg = f"format must be 'text' or 'json', got {format!r}"
            raise HistoryError(msg)
        if not isinstance(offset_chars, int) or isinstance(offset_chars, bool) or offset_chars < 0:
            msg = f"offset_chars must be a non-negative integer, got {offset_chars!r}"
            raise HistoryError(msg)
        if max_chars is None:
            max_chars = READ_CHARS_DEFAULT
        if not isinstance(max_chars, int) or isinstance(max_chars, bool) or not 1 <= max_chars <= READ_CHARS_MAX:
            msg = f"max_chars must be 1..{READ_CHARS_MAX} (default {READ_CHARS_DEFAULT}), got {max_chars!r}"
            raise HistoryError(msg)
        meta, body = self._resolve(str(item_id).strip(), format)
        if offset_chars > len(body):
            msg = f"offset_chars {offset_chars} is past the end of {item_id} ({len(body)} characters)"
            raise HistoryError(msg)
        end = min(len(body), offset_chars + max_chars)
        out = {
            **meta,
            "format": format,
            "total_chars": len(body),
            "offset_chars": offset_chars,
            "content": body[offset_chars:end],
        }
        if end < len(body):
            out["next_offset_chars"] = end
        return out

    def _resolve(self, ref: str, fmt: str) -> tuple[dict[str, Any], str]:
        events = self.session.events
        if match := _ITEM_ID.fullmatch(ref):
            seq = int(match.group(1))
            if seq >= self.cursor:
                msg = f"no {ref}: this session's items are item_0..item_{self.cursor - 1}"
                raise HistoryError(msg)
            return self._event_body(events[seq], fmt)
        if match := _WIN_ID.fullmatch(ref):
            window = self.window(int(match.group(1)))
            if match.group(2):
                if window.closed_by is None:
                    msg = f"window {window.number} is the current window: it has no summary yet (summaries exist for windows 1..{len(self.windows) - 1})"
                    raise HistoryError(msg)
                meta, body = self._event_body(events[window.closed_by], fmt)
                return {**meta, "resolved_from": ref}, body
            data = self._window_dict(window)
            return {"id": ref, "role": "window", "window": window.number}, _render(data, fmt)
        if ref == "goal":
            goal = self.goal()
            if goal is None:
                msg = "no goal yet: the session has no user instruction"
                raise HistoryError(msg)
            meta, body = self._event_body(goal, fmt)
            return {**meta, "resolved_from": ref}, body
        if ref == "checklist":
            entries = self.checklist()
            if not entries:
                msg = "no checklist: the model has not written a todo list in this session"
                raise HistoryError(msg)
            rows = [{"id": e.ref, "status": e.status, "text": e.text} for e in entries]
            body = (
                orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
                if fmt == "json"
                else "\n".join(f"[{e.status}] {e.ref}: {e.text}" for e in entries)
            )
            return {"id": ref, "role": "checklist", "item": f"item_{entries[0].seq}"}, body
        if match := _TODO_ID.fullmatch(ref):
            seq, index = int(match.group(1)), int(match.group(2))
            entries = self._checklist_at(seq)
            if index >= len(entries):
                msg = f"no {ref}: the todo list at item_{seq} has {len(entries)} entries"
                raise HistoryError(msg)
            entry = entries[index]
            data = {"id": entry.ref, "status": entry.status, "text": entry.text, "item": f"item_{seq}"}
            return {"id": ref, "role": "todo", "item": f"item_{seq}"}, _render(
                data, fmt
            ) if fmt == "json" else f"[{entry.status}] {entry.text}"
        msg = (
            f"unknown id {ref!r}: use item_<seq>, win_<n>, win_<n>_summary, goal, checklist or todo_<seq>_<i> "
            "(ids are printed by history listings and handoffs)"
        )
        raise HistoryError(msg)

    def _checklist_at(self, seq: int) -> list[TodoEntry]:
        """The todo list written at an older seq (a handoff may print ids of an earlier list)."""
        if seq < self.cursor and self.session.events[seq].type == SESSION_TASK:
            todos = self.session.events[seq].data.get("todos") or []
            return [TodoEntry(f"todo_{seq}_{i}", t["text"], t["status"], seq) for i, t in enumerate(todos)]
        if seq >= self.cursor or self.session.events[seq].type != ASSISTANT_MESSAGE:
            return []
        saved = (self.todo_seq, self.todo_call)
        for i, block in enumerate(self.session.events[seq].data["message"].get("content", ())):
            if block.get("type") == "tool_call" and block.get("name") in TODO_TOOLS:
                self.todo_seq, self.todo_call = seq, i
        try:
            return self._model_checklist() if self.todo_seq == seq else []
        finally:
            self.todo_seq, self.todo_call = saved

    def _event_body(self, event: Event, fmt: str) -> tuple[dict[str, Any], str]:
        meta = self.meta(event)
        if fmt == "json":
            return meta, orjson.dumps(event.to_dict(), option=orjson.OPT_INDENT_2).decode()
        return meta, self.text_of(event)


# -- helpers ---------------------------------------------------------------------------------------------
def _limit(limit: int | None) -> int:
    if limit is None:
        return LIST_DEFAULT
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= LIST_MAX:
        msg = f"limit must be 1..{LIST_MAX} (default {LIST_DEFAULT}), got {limit!r}"
        raise HistoryError(msg)
    return limit


def _chars(max_chars: int | None) -> int:
    if max_chars is None:
        return ITEM_CHARS_DEFAULT
    if not isinstance(max_chars, int) or isinstance(max_chars, bool) or not 1 <= max_chars <= ITEM_CHARS_MAX:
        msg = f"max_chars per item must be 1..{ITEM_CHARS_MAX} (default {ITEM_CHARS_DEFAULT}), got {max_chars!r}"
        raise HistoryError(msg)
    return max_chars


def _roles(role: str | list[str] | None) -> frozenset[str]:
    if role is None:
        return frozenset(DEFAULT_ROLES)
    wanted = [role] if isinstance(role, str) else list(role)
    bad = [r for r in wanted if r not in ROLES]
    if bad or not wanted:
        msg = f"role must be one or more of {list(ROLES)}, got {role!r}"
        raise HistoryError(msg)
    return frozenset(wanted)


def _fingerprint(*parts: Any) -> str:
    return hashlib.sha256(orjson.dumps(list(parts))).hexdigest()[:8]


def _encode_cursor(position: int, fingerprint: str) -> str:
    return f"c{position}.{fingerprint}"


def _decode_cursor(cursor: str, fingerprint: str) -> int:
    match = _CURSOR.fullmatch(str(cursor))
    if not match:
        msg = f"cursor {cursor!r} is not one this history returned: pass next_cursor exactly, or omit it to start over"
        raise HistoryError(msg)
    if match.group(2) != fingerprint:
        msg = f"cursor {cursor!r} belongs to a query with other filters or order: keep the same filters and order when continuing, or omit the cursor"
        raise HistoryError(msg)
    return int(match.group(1))


def _around(text: str, start: int, end: int, limit: int) -> tuple[str, bool]:
    """A snippet of at most ``limit`` characters around text[start:end]."""
    if len(text) <= limit:
        return text, False
    if limit < 3:
        return _clip_chars(text[start:], limit), True
    lead = max(0, (limit - (end - start)) // 3)
    a = max(0, start - lead)
    b = min(len(text), a + limit)
    a = max(0, b - limit)
    snippet = text[a:b]
    prefix = "…" if a > 0 else ""
    suffix = "…" if b < len(text) else ""
    room = limit - len(prefix) - len(suffix)
    if len(snippet) > room:
        # trim the far side of the match first so the match itself stays visible
        excess = len(snippet) - room
        before = min(excess, start - a)
        snippet = snippet[before : len(snippet) - (excess - before)]
    return prefix + snippet + suffix, True


__all__ = [
    "FOLDED_VERSION",
    "GOAL_SCAN",
    "ITEM_CHARS_DEFAULT",
    "ITEM_CHARS_MAX",
    "LIST_DEFAULT",
    "LIST_MAX",
    "PREVIEW_CHARS_PER_PAGE",
    "QUERY_MAX_CHARS",
    "READ_CHARS_DEFAULT",
    "READ_CHARS_MAX",
    "SCAN_CHARS_PER_PAGE",
    "SCAN_EVENTS_PER_PAGE",
    "STATE_KEY",
    "WINDOW_KINDS",
    "History",
    "HistoryError",
    "TodoEntry",
    "Window",
]
