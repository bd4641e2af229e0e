"""Session snapshots (issue 21): opening from a snapshot is the same session as replaying the whole
log, on every backend, and any snapshot that cannot be trusted falls back to the full replay."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import CorruptionError, Kernel, Message, ToolCallBlock
from ctxkernel.snapshot import SNAPSHOT_VERSION, LazyEvents
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.store.sqlite import SqliteStore
from ctxkernel.testing import check_conformance, make_profile
from ctxkernel.testing.store import postgres_dsn, postgres_schema

SMALL_WINDOW = {"context_window": 6000, "reserved_output_tokens": 1000}


def kernel(store: Any, home: Path, snapshot_every: int = 25) -> Kernel:
    profile = make_profile(model=SMALL_WINDOW, store={"snapshot_every": snapshot_every})
    return Kernel(profile, store=store, home=home, entry_points=False)


def work(session: Any, turns: int, seed: int = 0) -> None:
    """Tool-calling turns that overflow the small window, so ``basic`` compacts."""
    for n in range(turns):
        session.user(f"task {seed}.{n}: " + "fix the parser and keep the tests green " * 4)
        session.prepare_request()
        calls = [ToolCallBlock(f"c{seed}x{n}a", "read_file", {"path": f"m{n}.py"})]
        session.commit_reply(Message.assistant(f"reading {n}", calls), usage={"prompt_tokens": 900})
        session.tool_result(f"c{seed}x{n}a", f"line {seed} {n} of the file, with some words\n" * (20 + n % 7))
        session.prepare_request()
        session.commit_reply(Message.assistant(f"done {n}"))
        session.end_turn()


def state_of(session: Any) -> dict[str, Any]:
    """Everything a reopened session must agree on with the live one."""
    return {
        "surface": [(n.seq, n.message.to_dict(), n.turn, n.step) for n in session.surface.nodes],
        "surface_place": (session.surface.turn, session.surface.step),
        "indexes": (session.surface.pending_calls, session.surface.call_owner, session.surface.result_of),
        "applied": session.surface.applied,
        "tokens": session.meter.surface_tokens(),
        "pressure": session.pressure().to_dict(),
        "track": (
            session.turn,
            session.turn_open,
            session.step,
            session.step_open,
            session.open_compaction,
            session.header_hash,
            session.route,
            session._tracker.anchor,
        ),
        "summaries": session.compaction_summaries,
        "events": len(session.events),
        "project": orjson.loads(orjson.dumps(session.project(), default=str)),
    }


@pytest.fixture(params=["jsonl", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "jsonl":
        yield lambda: JsonlStore(tmp_path / "home", fsync=False)
    elif request.param == "sqlite":
        yield lambda: SqliteStore(tmp_path / "home", durable=False)
    else:
        from ctxkernel.store.postgres import PostgresStore

        with postgres_schema(postgres_dsn()) as dsn:
            yield lambda: PostgresStore(dsn)


def built(store_factory: Callable[[], Any], tmp_path: Path, turns: int = 30) -> tuple[Any, str]:
    session = kernel(store_factory(), tmp_path).open_session()
    work(session, turns)
    assert any(e.type == "compaction/end" for e in session.events)
    return session, session.id


def test_open_from_snapshot_equals_full_replay_on_every_backend(store_factory, tmp_path):
    session, sid = built(store_factory, tmp_path)
    live = state_of(session)
    covers, _ = store_factory().snapshot_get(sid)
    assert 0 < covers <= len(session.events)
    reopened = kernel(store_factory(), tmp_path).open_session(sid)
    assert isinstance(reopened.events, LazyEvents) and reopened.events.base == covers
    assert reopened.events.loaded == 0  # the open read nothing before the snapshot
    assert state_of(reopened) == live
    replayed = kernel(store_factory(), tmp_path, snapshot_every=0).open_session(sid)
    assert type(replayed.events) is list and state_of(replayed) == live
    # the whole log reads back the same through the lazy prefix, and work goes on from it
    assert [e.to_dict() for e in reopened.events] == [e.to_dict() for e in session.events]
    work(reopened, 5, seed=1)
    again = kernel(store_factory(), tmp_path, snapshot_every=0).open_session(sid)
    assert state_of(again) == state_of(reopened)


def test_restart_equivalence_with_and_without_snapshots_on_every_backend(store_factory, tmp_path):
    report = check_conformance(tmp_path / "conf", ["basic"], entry_points=False, store_factory=store_factory, turns=12)
    assert report.restarts_checked == 6 and report.snapshot_restarts == 3


def _rewrite(payload: bytes, change: Callable[[dict[str, Any]], None], version: int = SNAPSHOT_VERSION) -> bytes:
    body = orjson.loads(payload.partition(b"\n")[2])
    change(body)
    data = orjson.dumps(body)
    return b"ctxkernel-snapshot %d %s\n" % (version, hashlib.sha256(data).hexdigest().encode()) + data


def _flip_a_byte(payload: bytes) -> bytes:
    at = len(payload) // 2
    return payload[:at] + bytes([payload[at] ^ 0x01]) + payload[at + 1 :]


DEFECTS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "corrupt": (_flip_a_byte, "digest does not match"),
    "torn": (lambda p: p[: len(p) // 3], "digest does not match"),
    "version": (lambda p: _rewrite(p, lambda b: None, version=SNAPSHOT_VERSION + 1), "format version"),
    "stale": (lambda p: _rewrite(p, lambda b: b.update(last_hash="0" * 64)), "stale"),
    "malformed": (lambda p: _rewrite(p, lambda b: b["surface"].update(nodes=[[{"seq": "x"}, 1]])), "malformed"),
    "other session": (lambda p: _rewrite(p, lambda b: b.update(session="someone-else")), "another session"),
    # a body whose digest matches but whose tracked state lacks an entry or has another type: the
    # open raised KeyError, TypeError or AttributeError instead of replaying
    "track entry missing": (lambda p: _rewrite(p, lambda b: b["track"].pop("turn")), "do not fit"),
    "track of other types": (
        lambda p: _rewrite(p, lambda b: b["track"].update(route=5, compaction_summaries=[1], turn_open="yes")),
        "do not fit",
    ),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_an_untrusted_snapshot_falls_back_to_full_replay(store_factory, tmp_path, caplog, defect):
    session, sid = built(store_factory, tmp_path, turns=20)
    live = state_of(session)
    store = store_factory()
    covers, payload = store.snapshot_get(sid)
    damage, reason = DEFECTS[defect]
    store.snapshot_put(sid, covers, damage(payload))
    before = [e.to_dict() for e in store.read(sid)]
    with caplog.at_level(logging.WARNING):
        reopened = kernel(store_factory(), tmp_path).open_session(sid)
    assert type(reopened.events) is list  # replayed from the first event
    assert state_of(reopened) == live
    assert any("snapshot set aside" in r.getMessage() and reason in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
    assert [e.to_dict() for e in store_factory().read(sid)] == before  # the open wrote nothing


def test_a_missing_snapshot_replays_the_log(store_factory, tmp_path):
    session, sid = built(store_factory, tmp_path, turns=20)
    store_factory().snapshot_delete(sid)
    reopened = kernel(store_factory(), tmp_path).open_session(sid)
    assert type(reopened.events) is list and state_of(reopened) == state_of(session)


def test_a_snapshot_beyond_the_log_is_stale(tmp_path):
    factory = lambda: SqliteStore(tmp_path / "home", durable=False)  # noqa: E731 - jsonl refuses to place it
    session, sid = built(factory, tmp_path, turns=20)
    store = factory()
    covers, payload = store.snapshot_get(sid)
    store.snapshot_put(sid, covers + 50, _rewrite(payload, lambda b: b.update(covers=covers + 50)))
    reopened = kernel(factory(), tmp_path).open_session(sid)
    assert type(reopened.events) is list and state_of(reopened) == state_of(session)


def test_jsonl_snapshot_of_a_rewritten_log_is_set_aside(tmp_path, caplog):
    """The log changed under the snapshot (same length, other text): the position check passes,
    the last event's hash does not."""
    factory = lambda: JsonlStore(tmp_path / "home", fsync=False)  # noqa: E731
    session, sid = built(factory, tmp_path, turns=20)
    covers, _ = factory().snapshot_get(sid)
    path = factory().path(sid)
    lines = path.read_bytes().splitlines(keepends=True)
    last = orjson.loads(lines[covers])  # line covers + 1 holds event covers - 1
    assert last["seq"] == covers - 1
    last["time"] = last["time"][:-2] + ("00" if last["time"][-2:] != "00" else "01")
    lines[covers] = orjson.dumps(last) + b"\n"
    path.write_bytes(b"".join(lines))
    with caplog.at_level(logging.WARNING):
        reopened = kernel(factory(), tmp_path).open_session(sid)
    assert type(reopened.events) is list
    assert any("stale" in r.getMessage() for r in caplog.records)
    assert reopened.events[covers - 1].time == last["time"]


def test_jsonl_damaged_or_torn_snapshot_file_falls_back(tmp_path, caplog):
    factory = lambda: JsonlStore(tmp_path / "home", fsync=False)  # noqa: E731
    session, sid = built(factory, tmp_path, turns=20)
    path = factory().snapshot_path(sid)
    whole = path.read_bytes()
    for damaged in (
        b"{not json\n" + whole.partition(b"\n")[2],
        b'{"covers": 3, "at": 1, "end": 99, "length": 1}\nx',
        whole[: len(whole) // 2],  # torn: shorter than its recorded length
    ):
        path.write_bytes(damaged)
        with caplog.at_level(logging.WARNING):
            reopened = kernel(factory(), tmp_path).open_session(sid)
        assert type(reopened.events) is list and state_of(reopened) == state_of(session)
        assert any("snapshot set aside" in r.getMessage() for r in caplog.records)


def test_an_unreadable_snapshot_record_falls_back(tmp_path, caplog):
    """A position past the end of the log (OverflowError reading it), a folder at the snapshot's
    name (IsADirectoryError), a sqlite row of other types (ValueError, TypeError) failed the open."""
    import sqlite3

    jsonl = lambda: JsonlStore(tmp_path / "home", fsync=False)  # noqa: E731
    session, sid = built(jsonl, tmp_path, turns=20)
    path = jsonl().snapshot_path(sid)
    covers, body = jsonl().snapshot_get(sid)
    damaged: list[Callable[[], None]] = [
        lambda: path.write_bytes(b'{"covers": %d, "at": 1, "end": %d, "length": 1}\nx' % (covers, 2**63 - 1)),
        lambda: (path.unlink(), path.mkdir()),
    ]
    for damage in damaged:
        damage()
        with caplog.at_level(logging.WARNING):
            reopened = kernel(jsonl(), tmp_path).open_session(sid)
        assert type(reopened.events) is list and state_of(reopened) == state_of(session)
        assert any("snapshot set aside" in r.getMessage() for r in caplog.records)
        caplog.clear()
    sqlite = lambda: SqliteStore(tmp_path / "db", durable=False)  # noqa: E731
    session, sid = built(sqlite, tmp_path, turns=20)
    for change in ("covers = 'x'", "covers = 2.5", "body = CAST(body AS TEXT)"):
        with sqlite3.connect(tmp_path / "db" / "ctxkernel.sqlite3") as db:
            db.execute(f"UPDATE snapshots SET {change}")
        with caplog.at_level(logging.WARNING):
            reopened = kernel(sqlite(), tmp_path).open_session(sid)
        assert type(reopened.events) is list and state_of(reopened) == state_of(session)
        assert any("snapshot row" in r.getMessage() for r in caplog.records), change
        caplog.clear()


def test_snapshots_off_writes_none(tmp_path):
    factory = lambda: JsonlStore(tmp_path / "home", fsync=False)  # noqa: E731
    session = kernel(factory(), tmp_path, snapshot_every=0).open_session()
    work(session, 20)
    assert factory().snapshot_get(session.id) is None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.integers(1, 24), every=st.integers(1, 60), seed=st.integers(0, 3), more=st.integers(0, 4))
def test_property_open_from_snapshot_equals_full_replay(tmp_path_factory, turns, every, seed, more):
    home = tmp_path_factory.mktemp("prop")
    factory = lambda: JsonlStore(home, fsync=False)  # noqa: E731
    session = kernel(factory(), home, snapshot_every=every).open_session()
    work(session, turns, seed)
    session.user("one more instruction, left open")  # an open turn is folded state too
    reopened = kernel(factory(), home, snapshot_every=every).open_session(session.id, repair=False)
    replayed = kernel(factory(), home, snapshot_every=0).open_session(session.id, repair=False)
    assert state_of(reopened) == state_of(replayed) == state_of(session)
    # and they stay the same as work goes on in the reopened one
    work(reopened, more, seed + 10)
    replayed = kernel(factory(), home, snapshot_every=0).open_session(session.id, repair=False)
    assert state_of(reopened) == state_of(replayed)


@settings(max_examples=60, deadline=None)
@given(
    base=st.integers(0, 3000),
    tail=st.integers(0, 40),
    ops=st.lists(st.tuples(st.integers(-3100, 3100), st.integers(-3100, 3100), st.sampled_from([1, 1, 2, -1]))),
)
def test_property_lazy_events_behave_as_the_list(base, tail, ops):
    from ctxkernel.events import Event

    whole = [Event(i, "test/x", {}, "", None, True) for i in range(base + tail)]
    loads: list[tuple[int, int]] = []

    def load(start: int, end: int) -> list[Event]:
        loads.append((start, end))
        return whole[start:end]

    lazy = LazyEvents(load, base)
    for event in whole[base:]:
        lazy.append(event)
    assert len(lazy) == len(whole) and not loads
    assert lazy[base:] == whole[base:] and not loads  # the tail never reads the store
    for a, b, step in ops:
        assert lazy[a:b:step] == whole[a:b:step]
        if -len(whole) <= a < len(whole):
            assert lazy[a] is whole[a]
        else:
            with pytest.raises(IndexError):
                lazy[a]
    assert list(lazy) == whole and list(reversed(lazy)) == whole[::-1]
    assert all(end - start <= base for start, end in loads)


def test_lazy_events_refuse_a_prefix_out_of_order():
    from ctxkernel.events import Event

    lazy = LazyEvents(lambda start, end: [Event(0, "test/x", {}, "", None, True)] * (end - start), 5)
    with pytest.raises(CorruptionError, match="in order"):
        lazy[2]


def _indexed_kernel(home: Path, snapshot_every: int = 25) -> Kernel:
    profile = make_profile(model=SMALL_WINDOW, store={"snapshot_every": snapshot_every})
    profile.profile.strategies = ["basic", "history"]
    return Kernel(profile, store=JsonlStore(home, fsync=False), home=home, entry_points=False)


def _indexes(session: Any) -> dict[str, Any]:
    from ctxkernel.recall.history import History
    from ctxkernel.recall.notes import Notes

    history, notes = History.for_session(session), Notes.for_session(session)
    return {
        "windows": [w.to_dict() for w in history.windows],
        "instructions": history.instructions,
        "tools": history.tool_names,
        "calls": history.call_seqs,
        "page": history.list_items(limit=50, order="desc"),
        "search": history.search("parser", limit=50),
        "notes": [n.to_dict() for n in notes.active()],
        "total": notes.total_bytes,
    }


def test_the_history_index_and_notes_open_from_the_snapshot_without_reading_the_history(tmp_path):
    from ctxkernel.recall.notes import Notes

    session = _indexed_kernel(tmp_path).open_session()
    for n in range(4):
        work(session, 6, seed=n)
        Notes.for_session(session).write(f"plan/{n}", f"step {n} of the plan", strategy="basic")
    work(session, 2, seed=9)
    assert any(e.type == "compaction/summary" for e in session.events)
    reopened = _indexed_kernel(tmp_path).open_session(session.id)
    assert isinstance(reopened.events, LazyEvents) and reopened.events.loaded == 0
    # the history strategy took its index at open; the notes (and the inspector's timeline) wait
    # for their first use
    assert sorted(reopened.snapshot_indexes) == ["ctxkernel.timeline", "recall.notes"]
    replayed = _indexed_kernel(tmp_path, snapshot_every=0).open_session(session.id)
    assert _indexes(reopened) == _indexes(replayed) == _indexes(session)


def test_a_malformed_index_part_is_set_aside_and_the_index_folded_from_the_first_event(tmp_path, caplog):
    session = _indexed_kernel(tmp_path).open_session()
    work(session, 12)
    session.write_snapshot()
    covers, payload = session.store.snapshot_get(session.id)
    body = orjson.loads(payload.partition(b"\n")[2])
    body["session_indexes"]["ctxkernel.recall.history"]["windows"] = "not a list"
    data = orjson.dumps(body)
    session.store.snapshot_put(
        session.id,
        covers,
        b"ctxkernel-snapshot %d " % SNAPSHOT_VERSION + hashlib.sha256(data).hexdigest().encode() + b"\n" + data,
    )
    with caplog.at_level(logging.WARNING):
        reopened = _indexed_kernel(tmp_path).open_session(session.id)
    assert isinstance(reopened.events, LazyEvents)  # the snapshot itself is used
    assert "history index snapshot set aside" in caplog.text
    replayed = _indexed_kernel(tmp_path, snapshot_every=0).open_session(session.id)
    assert _indexes(reopened) == _indexes(replayed)


def test_a_strategys_transient_counter_is_not_restored_from_the_snapshot(tmp_path):
    """Regression: snapshots restored every plain-JSON ``session.state`` entry as it was. The
    snapshot written by an overflow compaction's commit batch caught ``basic``'s retry counter
    mid-compaction (1; the commit hook resets it only afterwards), so a session reopened from it
    refused the next overflow that the live session (and a full replay) would have compacted: a
    decay-profile session continued after a reopen hit ``RequestTooLargeError``."""
    from ctxkernel import ContextOverflowError

    session = kernel(JsonlStore(tmp_path, fsync=False), tmp_path, snapshot_every=1000).open_session()
    work(session, 12)
    session.user("one more step")
    request = session.prepare_request()
    window = request.pressure.effective_window
    assert session.request_failed(ContextOverflowError("too long", prompt_tokens=window + 1, limit=window)) is True
    assert session.state["basic"]["overflow_streak"] == 0  # the live session: reset by the commit
    reopened = kernel(JsonlStore(tmp_path, fsync=False), tmp_path, snapshot_every=1000).open_session(session.id)
    assert isinstance(reopened.events, LazyEvents)
    assert reopened.state["basic"].get("overflow_streak", 0) == 0
    replayed = kernel(JsonlStore(tmp_path, fsync=False), tmp_path, snapshot_every=0).open_session(session.id)
    assert {k: v for k, v in reopened.state["basic"].items()} == {k: v for k, v in replayed.state["basic"].items()}


def _head_span(session: Any) -> Any:
    from ctxkernel import Span, balanced_cut_at_or_before

    nodes = session.surface.nodes
    cut = balanced_cut_at_or_before(session.surface, len(nodes) - 1)
    return Span(nodes[0].seq, nodes[cut - 1].seq, summary="the head, summarised")


def test_a_compaction_commit_snapshots_at_the_next_step_boundary_not_inside_the_commit(tmp_path):
    """Issue 21 item 2: the commit costs one durable write; its snapshot is written when the step
    ends (once for every commit of the step). Reopened in between (a crash before the boundary),
    the session replays from the older snapshot: the same session, only a longer replay."""
    session = kernel(JsonlStore(tmp_path, fsync=False), tmp_path, snapshot_every=1000).open_session()
    work(session, 4)
    session.write_snapshot()
    session.user("one more step")
    before = session.store.snapshot_get(session.id)
    session.compact(_head_span(session), strategy="basic")
    session.compact(_head_span(session), strategy="basic")
    assert session.store.snapshot_get(session.id) == before  # nothing written inside the commits
    live = state_of(session)
    crashed = kernel(JsonlStore(tmp_path, fsync=False), tmp_path, snapshot_every=1000).open_session(
        session.id, repair=False
    )
    assert crashed.events.base == before[0] and state_of(crashed) == live
    session.prepare_request()  # step/start: the boundary
    covers, _ = session.store.snapshot_get(session.id)
    assert covers == len(session.events)
    reopened = kernel(JsonlStore(tmp_path, fsync=False), tmp_path, snapshot_every=1000).open_session(
        session.id, repair=False
    )
    assert reopened.events.base == covers and reopened.events.loaded == 0
    assert state_of(reopened) == state_of(session)


def test_an_overflow_compaction_snapshots_when_request_failed_returns(tmp_path):
    from ctxkernel import ContextOverflowError

    session = kernel(JsonlStore(tmp_path, fsync=False), tmp_path, snapshot_every=1000).open_session()
    work(session, 12)
    session.user("one more step")
    window = session.prepare_request().pressure.effective_window
    assert session.request_failed(ContextOverflowError("too long", prompt_tokens=window + 1, limit=window)) is True
    assert session.events[-1].type == "compaction/end"  # the compaction was the last append...
    covers, _ = session.store.snapshot_get(session.id)
    assert covers == len(session.events)  # ...and request_failed snapshotted it before returning


def test_a_compaction_by_a_kernel_tool_snapshots_when_its_result_closes_the_step(tmp_path, monkeypatch):
    """A tool that compacts (decay's ``compress``) runs between the reply that called it and its
    result: like every commit, its snapshot waits for the step's end, which the call's result
    writes, so the tool's return pays the commit's one durable write and not the snapshot."""
    from ctxkernel import ToolOutcome

    session = kernel(JsonlStore(tmp_path, fsync=False), tmp_path, snapshot_every=1000).open_session()
    work(session, 4)
    session.write_snapshot()
    session.user("one more step")
    session.prepare_request()
    session.commit_reply(Message.assistant("squashing", [ToolCallBlock("t1", "squash", {})]))
    session.owns_tool("compress")  # builds the session's tool registry

    def squash(session: Any, call: Any) -> ToolOutcome:
        session.compact(_head_span(session), strategy="basic")
        return ToolOutcome("squashed")

    monkeypatch.setattr(session.tools, "run", squash)
    outcome = session.run_tool({"id": "t1", "name": "squash", "arguments": {}})
    assert not outcome.is_error
    assert session.events[-1].type == "compaction/end"
    assert session.store.snapshot_get(session.id)[0] < len(session.events)  # not at the tool's return
    session.tool_result("t1", outcome)
    assert session.events[-1].type == "step/end"
    covers, _ = session.store.snapshot_get(session.id)
    assert covers == len(session.events)  # the result closed the step: the boundary
