"""A session's pressure timeline, folded incrementally and carried in its snapshots.

What the web inspector (``ctxkernel ui``) draws over a session: the prompt tokens of each model
request as the provider reported them (``usage.input_tokens`` of each ``assistant/message``) with
the effective window then in force, markers for compactions, window switches, prunes, drops,
re-routes and continuations, and one row per compaction transaction with its outcome.

:class:`Timeline` is a :class:`ctxkernel.snapshot.SnapshotIndex`: the session folds it to the end
of the log whenever it writes a snapshot (:meth:`Session.write_snapshot`), so a session opened
from a snapshot has it without reading the events before the snapshot and folds only the tail.
The per-request points are kept in at most :data:`MAX_POINTS` buckets of ``width`` consecutive
requests: one request each until a session has made more requests than that, then adjacent
buckets merge pairwise and the width doubles (each bucket keeps the peak and the lowest prompt
tokens of its requests, and how many reported usage). So the index, and what it adds to a
snapshot, is bounded by the number of compactions, not by the length of the log; and since the
fold depends only on the events, the index restored from a snapshot and folded over the tail is
the one folded from the whole log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from . import events as ev
from .events import Event
from .logging import get_logger
from .snapshot import folded_cursor

if TYPE_CHECKING:
    from .ports import SessionPort

#: the index's key in ``session.state`` and in a snapshot's ``session_indexes``
STATE_KEY = "ctxkernel.timeline"
#: format of :meth:`Timeline.folded`; a snapshot holding another is set aside (one full fold)
FOLDED_VERSION = 1
#: per-request points kept at most (even: full buckets merge pairwise); about one per pixel of
#: the inspector's chart
MAX_POINTS = 1024
#: characters kept of a marker's label and of a failed compaction's error (both come from event
#: data that strategies and providers wrote)
LABEL_CHARS = 200
ERROR_CHARS = 2_000
#: tools whose successful result means the session continued in a new session (chapters)
CONTINUATION_TOOLS = frozenset({"chapters_continue", "chapters_fork"})
MARKER_KINDS = frozenset({"route", "compaction", "window", "prune", "drop", "continuation"})
#: one compaction transaction's row, in this order in :meth:`Timeline.folded`
TRANSACTION_FIELDS = (
    "id",
    "strategy",
    "start",
    "time",
    "kind",
    "summary_seq",
    "end",
    "outcome",
    "error",
    "tokens_before",
    "tokens_after",
    "cites",
)
OUTCOMES = frozenset({"open", "committed", "empty", "failed"})
#: the kernel event types :meth:`Timeline._fold` reads (it also reads every ignorable event)
_FOLDED_TYPES = frozenset(
    {
        ev.ASSISTANT_MESSAGE,
        ev.REQUEST_CONTEXT,
        ev.COMPACTION_START,
        ev.COMPACTION_SUMMARY,
        ev.COMPACTION_END,
        ev.COMPACTION_PRUNE,
        ev.SURFACE_DROP,
        ev.TOOL_RESULT,
    }
)
_row = itemgetter(*TRANSACTION_FIELDS)

# a bucket of requests: [first seq, last seq, requests, requests that reported usage,
# peak prompt tokens, lowest prompt tokens (both None when none reported), window at its last]
_FIRST, _LAST, _COUNT, _MEASURED, _PEAK, _LOW, _WINDOW = range(7)

log = get_logger("ctxkernel.timeline")


def _short(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None


def _merge(a: list[Any], b: list[Any]) -> list[Any]:
    """Two adjacent buckets as one."""
    peaks = [p for p in (a[_PEAK], b[_PEAK]) if p is not None]
    lows = [p for p in (a[_LOW], b[_LOW]) if p is not None]
    return [
        a[_FIRST],
        b[_LAST],
        a[_COUNT] + b[_COUNT],
        a[_MEASURED] + b[_MEASURED],
        max(peaks) if peaks else None,
        min(lows) if lows else None,
        b[_WINDOW],
    ]


@dataclass
class Timeline:
    """The timeline of one session's log. Build it with :meth:`for_session`."""

    session: SessionPort
    cursor: int = 0  # events folded
    window: int | None = None  # effective window of the current route
    requests: int = 0  # requests folded (assistant messages)
    width: int = 1  # requests per bucket (a power of two)
    buckets: list[list[Any]] = field(default_factory=list)
    markers: list[dict[str, Any]] = field(default_factory=list)
    transactions: dict[str, dict[str, Any]] = field(default_factory=dict)  # by compaction id, in start order

    @classmethod
    def for_session(cls, session: SessionPort) -> Timeline:
        """The session's timeline, brought up to date with its log (cached per session; opened
        from a snapshot, restored from it on first use)."""
        timeline = session.state.get(STATE_KEY)
        if not isinstance(timeline, cls) or timeline.session is not session:
            timeline = cls(session)
            folded = session.snapshot_indexes.pop(STATE_KEY, None)
            if folded is not None:
                timeline._restore(folded)
            session.state[STATE_KEY] = timeline
        timeline.sync()
        return timeline

    # -- what the inspector shows ---------------------------------------------------------------------
    def points(self) -> list[dict[str, Any]]:
        """One point per bucket: ``request`` (index of its first request), ``count``, ``seq`` and
        ``last_seq`` (its first and last ``assistant/message``), ``tokens`` (the peak prompt tokens
        reported, None when none), ``tokens_min``, ``measured`` (requests that reported usage) and
        ``window`` (the effective window at its last request). With ``width`` 1 a point is one
        request and ``tokens`` its prompt tokens."""
        out, request = [], 0
        for b in self.buckets:
            out.append(
                {
                    "request": request,
                    "count": b[_COUNT],
                    "seq": b[_FIRST],
                    "last_seq": b[_LAST],
                    "tokens": b[_PEAK],
                    "tokens_min": b[_LOW],
                    "measured": b[_MEASURED],
                    "window": b[_WINDOW],
                }
            )
            request += b[_COUNT]
        return out

    def measured(self) -> int:
        """Requests whose reply reported prompt tokens."""
        return sum(b[_MEASURED] for b in self.buckets)

    def transaction_rows(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self.transactions.values()]

    # -- folding ------------------------------------------------------------------------------------------
    def sync(self) -> int:
        """Fold the events appended since the last call; returns how many."""
        end = len(self.session.events)
        if self.cursor >= end:
            return 0
        start = self.cursor
        fold, folded_types = self._fold, _FOLDED_TYPES
        for event in self.session.events[start:end]:
            if event.type in folded_types or event.ignorable:  # most of a log is messages and turns
                fold(event)
        self.cursor = end
        return end - start

    def _request(self, seq: int, tokens: int | None) -> None:
        buckets = self.buckets
        if buckets and buckets[-1][_COUNT] < self.width:
            last = buckets[-1]
            last[_LAST], last[_WINDOW] = seq, self.window
            last[_COUNT] += 1
            if tokens is not None:
                last[_MEASURED] += 1
                last[_PEAK] = tokens if last[_PEAK] is None else max(last[_PEAK], tokens)
                last[_LOW] = tokens if last[_LOW] is None else min(last[_LOW], tokens)
        else:
            if len(buckets) >= MAX_POINTS:
                self.buckets = buckets = [_merge(buckets[i], buckets[i + 1]) for i in range(0, len(buckets), 2)]
                self.width *= 2
            buckets.append([seq, seq, 1, int(tokens is not None), tokens, tokens, self.window])
        self.requests += 1

    def _mark(self, event: Event, kind: str, label: Any) -> None:
        self.markers.append(
            {"seq": event.seq, "request": self.requests, "kind": kind, "label": str(label)[:LABEL_CHARS]}
        )

    def _fold(self, event: Event) -> None:
        # the required keys of each kernel event are checked before it joins a log
        # (events.validate_shape); the optional ones are read defensively
        t, d = event.type, event.data
        if t == ev.ASSISTANT_MESSAGE:
            usage = d.get("usage")
            tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
            self._request(event.seq, _int_or_none(tokens))
        elif t == ev.REQUEST_CONTEXT:
            window = d["context_window"] - d["reserved_output_tokens"]
            if self.window is not None and window != self.window:
                self._mark(event, "route", f"{d['provider']}/{d['model']}")
            self.window = window
        elif t == ev.COMPACTION_START:
            self.transactions[d["compaction_id"]] = {
                "id": d["compaction_id"],
                "strategy": _short(d["strategy"], LABEL_CHARS),
                "start": event.seq,
                "time": event.time,
                "kind": None,
                "summary_seq": None,
                "end": None,
                "outcome": "open",
                "error": None,
                "tokens_before": None,
                "tokens_after": None,
                "cites": 0,
            }
        elif t == ev.COMPACTION_SUMMARY:
            txn = self.transactions.get(d["compaction_id"])
            if txn is not None:
                txn.update(
                    kind=_short(d.get("kind"), LABEL_CHARS),
                    summary_seq=event.seq,
                    tokens_before=_int_or_none(d.get("tokens_before")),
                    tokens_after=_int_or_none(d.get("tokens_after")),
                    cites=len(d["cites"]),
                )
            kind = "window" if d.get("kind") == "window" else "compaction"
            self._mark(event, kind, f"{d.get('strategy')}/{d.get('kind')}")
        elif t == ev.COMPACTION_END:
            txn = self.transactions.get(d["compaction_id"])
            if txn is not None:
                error = d.get("error")
                txn.update(
                    end=event.seq,
                    error=str(error)[:ERROR_CHARS] if error else None,
                    outcome="failed" if error else ("committed" if txn["summary_seq"] is not None else "empty"),
                )
        elif t == ev.COMPACTION_PRUNE:
            self._mark(event, "prune", f"{d['strategy']} prune {d['target']}")
        elif t == ev.SURFACE_DROP:
            self._mark(event, "drop", f"{d['strategy']} drop")
        elif t == ev.TOOL_RESULT:
            content = d["message"].get("content")
            block = content[0] if isinstance(content, list) and content else None
            if isinstance(block, dict) and block.get("name") in CONTINUATION_TOOLS and not block.get("is_error"):
                # the session went on in a new one (the tool result names it)
                self._mark(event, "continuation", block["name"])
        elif event.ignorable and ("window" in t or "continu" in t):
            # strategies' own switch records (rollover/window, chapters continuations)
            self._mark(event, "window", t)

    # -- session snapshots ------------------------------------------------------------------------------
    def folded(self) -> dict[str, Any]:
        """What a session snapshot keeps: the buckets, markers and transactions (rows as lists in
        :data:`TRANSACTION_FIELDS` order), folded to the end of the log first."""
        self.sync()
        return {
            "version": FOLDED_VERSION,
            "cursor": self.cursor,
            "window": self.window,
            "requests": self.requests,
            "width": self.width,
            "buckets": [list(b) for b in self.buckets],
            "markers": [[m["seq"], m["request"], m["kind"], m["label"]] for m in self.markers],
            "transactions": [list(_row(t)) for t in self.transactions.values()],
        }

    def _restore(self, data: Any) -> None:
        """Start from :meth:`folded` output; anything malformed is set aside with a warning (the
        timeline is then folded from the first event, as without a snapshot)."""
        try:
            cursor = folded_cursor(data, FOLDED_VERSION, len(self.session.events))
            window, requests, width = data["window"], data["requests"], data["width"]
            buckets = [list(b) for b in data["buckets"]]
            markers = [{"seq": s, "request": r, "kind": k, "label": label} for s, r, k, label in data["markers"]]
            transactions = {}
            for row in data["transactions"]:
                if len(row) != len(TRANSACTION_FIELDS):
                    msg = f"a transaction row has {len(row)} fields, not {len(TRANSACTION_FIELDS)}"
                    raise ValueError(msg)
                txn = dict(zip(TRANSACTION_FIELDS, row, strict=True))
                transactions[txn["id"]] = txn
            _check(cursor, window, requests, width, buckets, markers, transactions)
        except Exception as exc:  # a malformed part costs a full fold, never the open
            log.warning(
                "timeline snapshot set aside; folding the whole log",
                session=self.session.id,
                reason=f"{type(exc).__name__}: {exc}"[:300],
            )
            return
        self.cursor, self.window, self.requests, self.width = cursor, window, requests, width
        self.buckets, self.markers, self.transactions = buckets, markers, transactions


def _check(
    cursor: int,
    window: Any,
    requests: Any,
    width: Any,
    buckets: list[list[Any]],
    markers: list[dict[str, Any]],
    transactions: dict[str, dict[str, Any]],
) -> None:
    """ValueError naming the first thing in a restored timeline that a fold could not have made."""

    def ints(*values: Any) -> bool:
        return all(type(v) is int and v >= 0 for v in values)

    if window is not None and type(window) is not int:
        msg = f"window {window!r:.40} is not an integer"
        raise ValueError(msg)
    if not ints(requests, width) or width < 1 or width & (width - 1) or len(buckets) > MAX_POINTS:
        msg = f"width {width!r:.20} must be a power of two and buckets at most {MAX_POINTS}"
        raise ValueError(msg)
    # one pass of plain comparisons per bucket (a restore checks up to 1,024 of them on the
    # inspector's first view; ``type(x) is int`` also refuses a bool)
    last_full = len(buckets) - 1
    for i, b in enumerate(buckets):
        if type(b) is not list or len(b) != 7:
            msg = f"bucket {i} {b!r:.120} is not one a fold makes"
            raise ValueError(msg)
        first, last, count, measured, peak, low, window = b
        if not (
            type(first) is int
            and type(last) is int
            and type(count) is int
            and type(measured) is int
            and 0 <= first <= last < cursor
            and 0 < count <= width
            and (i == last_full or count == width)
            and 0 <= measured <= count
            and (
                (type(peak) is int and type(low) is int and 0 <= low <= peak)
                if measured
                else (peak is None and low is None)
            )
            and (window is None or type(window) is int)
        ):
            msg = f"bucket {i} {b!r:.120} is not one a fold makes"
            raise ValueError(msg)
    if sum(b[_COUNT] for b in buckets) != requests:
        msg = f"the buckets hold {sum(b[_COUNT] for b in buckets)} requests, not {requests}"
        raise ValueError(msg)
    for m in markers:
        seq, request = m["seq"], m["request"]
        if not (type(seq) is int and type(request) is int and 0 <= seq < cursor and request >= 0) or (
            m["kind"] not in MARKER_KINDS
        ):
            msg = f"marker {m!r:.120} is not one a fold makes"
            raise ValueError(msg)
        if type(m["label"]) is not str or len(m["label"]) > LABEL_CHARS:
            msg = f"marker label {m['label']!r:.40} is not a string of at most {LABEL_CHARS} characters"
            raise ValueError(msg)
    for key, t in transactions.items():
        start, cites, summary_seq, end = t["start"], t["cites"], t["summary_seq"], t["end"]
        before, after, strategy, kind, error = (
            t["tokens_before"],
            t["tokens_after"],
            t["strategy"],
            t["kind"],
            t["error"],
        )
        if not (
            type(key) is str
            and type(start) is int
            and start >= 0
            and type(cites) is int
            and cites >= 0
            and t["outcome"] in OUTCOMES
            and type(t["time"]) is str
            and (summary_seq is None or (type(summary_seq) is int and summary_seq >= 0))
            and (end is None or (type(end) is int and end >= 0))
            and (before is None or type(before) is int)
            and (after is None or type(after) is int)
            and (strategy is None or type(strategy) is str)
            and (kind is None or type(kind) is str)
            and (error is None or type(error) is str)
        ):
            msg = f"transaction {t!r:.120} is not one a fold makes"
            raise ValueError(msg)


__all__ = ["MAX_POINTS", "STATE_KEY", "Timeline"]
