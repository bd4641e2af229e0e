"""The pressure timeline index (``ctxkernel.timeline``): restored from a snapshot and folded over
the tail, it is the timeline folded from the whole log; it stays bounded however long the log;
and a snapshot without it, with a malformed one, or a snapshot that cannot be trusted at all,
falls back to the fold of the whole log."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel import timeline as tl
from ctxkernel.events import Event
from ctxkernel.snapshot import SNAPSHOT_VERSION, LazyEvents
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile
from ctxkernel.timeline import STATE_KEY, Timeline

SMALL_WINDOW = {"context_window": 6000, "reserved_output_tokens": 1000}


def kernel(home: Path, snapshot_every: int = 25) -> Kernel:
    profile = make_profile(model=SMALL_WINDOW, store={"snapshot_every": snapshot_every})
    return Kernel(profile, store=JsonlStore(home, fsync=False), home=home, entry_points=False)


def work(session: Any, turns: int, seed: int = 0) -> None:
    """Tool-calling turns that overflow the small window (``basic`` compacts), some replies
    without usage, and a re-route to a smaller window half way."""
    for n in range(turns):
        if n == turns // 2:
            session.set_route("openai", "small-model", context_window=5_000)
        session.user(f"task {seed}.{n}: " + "fix the parser and keep the tests green " * 4)
        session.prepare_request()
        calls = [ToolCallBlock(f"c{seed}x{n}a", "read_file", {"path": f"m{n}.py"})]
        session.commit_reply(Message.assistant(f"reading {n}", calls), usage={"prompt_tokens": 900 + 37 * n})
        session.tool_result(f"c{seed}x{n}a", f"line {seed} {n} of the file, with some words\n" * (20 + n % 7))
        session.prepare_request()
        session.commit_reply(Message.assistant(f"done {n}"))
        session.end_turn()


def seen(session: Any) -> dict[str, Any]:
    """Everything the inspector shows of the timeline, and what a snapshot keeps of it."""
    timeline = Timeline.for_session(session)
    return {
        "points": timeline.points(),
        "markers": timeline.markers,
        "transactions": timeline.transaction_rows(),
        "folded": timeline.folded(),
    }


def from_the_log(session: Any) -> dict[str, Any]:
    """The timeline folded straight from the events as they read back from the store."""
    events = list(session.store.read(session.id))
    return seen(LogOnly(events))


@dataclass
class LogOnly:
    """What :class:`Timeline` reads of a session: its events, and the two dicts it keeps itself in."""

    events: list[Event]
    id: str = "log-only"
    state: dict[str, Any] = field(default_factory=dict)
    snapshot_indexes: dict[str, Any] = field(default_factory=dict)


def resign(session: Any, change: Any) -> None:
    """Rewrite the session's stored snapshot through ``change(body)`` with a valid digest."""
    covers, payload = session.store.snapshot_get(session.id)
    body = orjson.loads(payload.partition(b"\n")[2])
    change(body)
    data = orjson.dumps(body)
    digest = hashlib.sha256(data).hexdigest().encode()
    session.store.snapshot_put(session.id, covers, b"ctxkernel-snapshot %d %s\n" % (SNAPSHOT_VERSION, digest) + data)


@pytest.fixture
def long_session(tmp_path):
    session = kernel(tmp_path).open_session()
    work(session, 24)
    kinds = {e.type for e in session.events}
    assert {"compaction/end", "compaction/summary"} <= kinds
    return session


def test_restored_from_the_snapshot_it_is_the_timeline_of_the_whole_log(tmp_path, long_session):
    reopened = kernel(tmp_path).open_session(long_session.id)
    assert isinstance(reopened.events, LazyEvents) and STATE_KEY in reopened.snapshot_indexes
    restored = seen(reopened)
    assert reopened.events.loaded == 0, "the timeline came from the snapshot, not from a walk of the log"
    whole = from_the_log(long_session)
    assert restored == whole == seen(long_session)
    assert [m["kind"] for m in whole["markers"]].count("route") == 1
    assert {t["outcome"] for t in whole["transactions"]} >= {"committed"}
    replies = [e for e in long_session.events if e.type == "assistant/message"]
    assert [p["seq"] for p in whole["points"]] == [e.seq for e in replies]
    assert [p["tokens"] for p in whole["points"]] == [(e.data.get("usage") or {}).get("input_tokens") for e in replies]
    # work goes on from the restored timeline, folding only the new events
    work(reopened, 6, seed=1)
    assert seen(reopened) == from_the_log(reopened)


def test_a_snapshot_without_the_timeline_folds_the_whole_log(tmp_path, long_session):
    """A snapshot written before the timeline took part (or by a process that left it out)."""
    resign(long_session, lambda body: body["session_indexes"].pop(STATE_KEY))
    reopened = kernel(tmp_path).open_session(long_session.id)
    assert isinstance(reopened.events, LazyEvents) and STATE_KEY not in reopened.snapshot_indexes
    assert seen(reopened) == from_the_log(long_session)
    assert reopened.events.loaded == reopened.events.base  # folded from the first event
    # the next snapshot of that session carries it again
    work(reopened, 2, seed=2)
    reopened.write_snapshot()
    again = kernel(tmp_path).open_session(long_session.id)
    assert STATE_KEY in again.snapshot_indexes
    assert seen(again) == from_the_log(long_session) and again.events.loaded == 0


MALFORMED = {
    "version": lambda part: part.update(version=99),
    "cursor": lambda part: part.update(cursor=10**9),
    "bucket count": lambda part: part["buckets"][0].__setitem__(2, 0),
    "bucket shape": lambda part: part["buckets"].append([1, 2]),
    "requests": lambda part: part.update(requests=part["requests"] + 1),
    "width": lambda part: part.update(width=3),
    "marker kind": lambda part: part["markers"][0].__setitem__(2, "<script>"),
    "marker label": lambda part: part["markers"][0].__setitem__(3, "x" * (tl.LABEL_CHARS + 1)),
    "transaction row": lambda part: part["transactions"][0].pop(),
    "transaction outcome": lambda part: part["transactions"][0].__setitem__(7, "maybe"),
    "not an object": lambda part: part.clear(),
    "bucket peak without usage": lambda part: part["buckets"][0].__setitem__(3, 0),
    "bucket low above its peak": lambda part: part["buckets"][0].__setitem__(5, part["buckets"][0][4] + 1),
    "bucket seq a boolean": lambda part: part["buckets"][0].__setitem__(0, False),
    "bucket past the cursor": lambda part: part["buckets"][-1].__setitem__(1, 10**9),
    "bucket window a string": lambda part: part["buckets"][0].__setitem__(6, "8000"),
    "marker past the cursor": lambda part: part["markers"][0].__setitem__(0, 10**9),
    "transaction tokens a string": lambda part: part["transactions"][0].__setitem__(9, "many"),
    "transaction id a number": lambda part: part["transactions"][0].__setitem__(0, 5),
}


@pytest.mark.parametrize("defect", sorted(MALFORMED))
def test_a_malformed_timeline_part_is_set_aside_and_the_log_folded(tmp_path, long_session, caplog, defect):
    resign(long_session, lambda body: MALFORMED[defect](body["session_indexes"][STATE_KEY]))
    with caplog.at_level(logging.WARNING):
        reopened = kernel(tmp_path).open_session(long_session.id)
        restored = seen(reopened)
    assert isinstance(reopened.events, LazyEvents)  # the snapshot itself is used
    assert "timeline snapshot set aside" in caplog.text
    assert restored == from_the_log(long_session)


def test_an_untrusted_snapshot_replays_and_the_timeline_is_the_same(tmp_path, long_session, caplog):
    resign(long_session, lambda body: body.update(last_hash="0" * 64))  # stale
    with caplog.at_level(logging.WARNING):
        reopened = kernel(tmp_path).open_session(long_session.id)
    assert type(reopened.events) is list and "stale" in caplog.text
    assert seen(reopened) == from_the_log(long_session)
    long_session.store.snapshot_delete(long_session.id)  # missing
    assert seen(kernel(tmp_path).open_session(long_session.id)) == from_the_log(long_session)


def test_past_the_bound_requests_merge_into_buckets_and_a_snapshot_stays_bounded(tmp_path):
    with mock.patch.object(tl, "MAX_POINTS", 8):
        session = kernel(tmp_path, snapshot_every=10).open_session()
        work(session, 30)
        replies = [e for e in session.events if e.type == "assistant/message"]
        timeline = Timeline.for_session(session)
        assert timeline.requests == len(replies) == 60 and timeline.width == 8
        assert 4 <= len(timeline.buckets) <= 8
        reopened = kernel(tmp_path, snapshot_every=10).open_session(session.id)
        assert seen(reopened) == from_the_log(session) and reopened.events.loaded == 0
    tokens = {e.seq: (e.data.get("usage") or {}).get("input_tokens") for e in replies}
    for point in timeline.points():
        inside = [t for seq, t in tokens.items() if point["seq"] <= seq <= point["last_seq"]]
        measured = [t for t in inside if t is not None]
        assert len(inside) == point["count"] and len(measured) == point["measured"]
        assert point["tokens"] == (max(measured) if measured else None)
        assert point["tokens_min"] == (min(measured) if measured else None)


# -- the fold itself, on generated logs ----------------------------------------------------------------
def _event(seq: int, op: tuple[Any, ...]) -> Event:
    kind = op[0]
    time = f"2026-01-01T00:00:{seq % 60:02d}.000Z"
    if kind == "reply":
        usage = {"input_tokens": op[1]} if op[1] is not None else None
        data = {"message": {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}, "usage": usage}
        return Event(seq, "assistant/message", data, time, {"op": "append"})
    if kind == "route":
        data = {"provider": "p", "model": f"m{op[1]}", "context_window": op[1], "reserved_output_tokens": 100}
        return Event(seq, "request/context", data, time)
    if kind == "start":
        return Event(seq, "compaction/start", {"compaction_id": f"t{op[1]}", "strategy": "basic"}, time)
    if kind == "summary":
        data = {"compaction_id": f"t{op[1]}", "summary": "s", "cites": [1, 2], "kind": op[2], "strategy": "basic"}
        return Event(seq, "compaction/summary", {**data, "tokens_before": 900, "tokens_after": 300}, time)
    if kind == "end":
        return Event(seq, "compaction/end", {"compaction_id": f"t{op[1]}", "error": op[2]}, time)
    if kind == "prune":
        return Event(seq, "compaction/prune", {"target": 3, "strategy": "decay"}, time)
    if kind == "continue":
        block = {"type": "tool_result", "call_id": "c", "name": "chapters_continue", "content": "next"}
        return Event(seq, "tool/result", {"message": {"role": "tool", "content": [block]}}, time, {"op": "append"})
    if kind == "user":
        return Event(seq, "user/message", {"message": {"role": "user", "content": "go"}}, time, {"op": "append"})
    if kind == "turn":
        return Event(seq, "turn/start", {"turn": op[1]}, time)
    return Event(seq, "rollover/window", {"window": op[1]}, time, ignorable=True)


OPS = st.one_of(
    st.tuples(st.just("reply"), st.none() | st.integers(0, 200_000)),
    st.tuples(st.just("route"), st.sampled_from([4_000, 8_000, 128_000])),
    st.tuples(st.just("start"), st.integers(0, 5)),
    st.tuples(st.just("summary"), st.integers(0, 5), st.sampled_from(["window", "in_place", None])),
    st.tuples(st.just("end"), st.integers(0, 5), st.none() | st.just("boom " * 600)),
    st.tuples(st.just("prune")),
    st.tuples(st.just("continue")),
    st.tuples(st.just("plugin"), st.integers(0, 9)),
    st.tuples(st.just("user")),
    st.tuples(st.just("turn"), st.integers(0, 9)),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(OPS, max_size=120), cut=st.integers(0, 120), bound=st.sampled_from([2, 4, 16]))
def test_any_cut_restored_and_folded_on_equals_the_fold_of_the_whole_log(ops, cut, bound):
    events = [_event(seq, op) for seq, op in enumerate(ops)]
    with mock.patch.object(tl, "MAX_POINTS", bound):
        whole = seen(LogOnly(events))
        head = LogOnly(events[: min(cut, len(events))])
        part = orjson.loads(orjson.dumps(Timeline.for_session(head).folded()))  # as a snapshot holds it
        resumed = LogOnly(events, snapshot_indexes={STATE_KEY: part})
        assert seen(resumed) == whole
        # sync passes _fold only the event types it reads: handing it every event changes nothing
        every = Timeline(LogOnly(events))
        for event in events:
            every._fold(event)
        every.cursor = len(events)
        assert every.folded() == whole["folded"]
    # bounded, and every request is in exactly one bucket, in order
    points = whole["points"]
    replies = [e.seq for e in events if e.type == "assistant/message"]
    assert len(points) <= bound and sum(p["count"] for p in points) == len(replies)
    assert [p["request"] for p in points] == [sum(q["count"] for q in points[:i]) for i in range(len(points))]
    assert all(len(m["label"]) <= tl.LABEL_CHARS for m in whole["markers"])
    assert all(t["error"] is None or len(t["error"]) <= tl.ERROR_CHARS for t in whole["transactions"])
