"""The snapshot a compaction commit calls for is cheap (issue 21, item 2): at each step's end the
session folds its snapshot indexes (the timeline, recall's history index once in use), so the
snapshot folds only what came since. The bytes are those a writer with nothing prepared builds,
and a node snapshotted before the meter counted it is snapshotted again with its count (nodes are
serialised when a snapshot is written, never kept between snapshots)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.recall.history import STATE_KEY as HISTORY_KEY
from ctxkernel.recall.history import History
from ctxkernel.snapshot import SnapshotWriter
from ctxkernel.snapshot import decode as decode_snapshot
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile
from ctxkernel.timeline import STATE_KEY as TIMELINE_KEY

SMALL_WINDOW = {"context_window": 6000, "reserved_output_tokens": 1000}


def kernel(home: Path) -> Kernel:
    profile = make_profile(model=SMALL_WINDOW, store={"snapshot_every": 10_000})
    return Kernel(profile, store=JsonlStore(home / "logs", fsync=False), home=home, entry_points=False)


def step(session: Any, n: int, calls: int, lines: int) -> None:
    session.user(f"task {n}: " + "fix the parser and keep the tests green " * 3)
    session.prepare_request()
    blocks = [ToolCallBlock(f"c{n}x{i}", "read_file", {"path": f"m{i}.py"}) for i in range(calls)]
    session.commit_reply(Message.assistant(f"reading {n}", blocks))
    for block in blocks:
        session.tool_result(block.id, f"line {n} of the file\n" * lines)
    if blocks:
        session.prepare_request()
        session.commit_reply(Message.assistant(f"done {n}"))
    session.end_turn()


def prepared_equals_unprepared(home: Path, turns: list[tuple[int, int]]) -> Any:
    session = kernel(home).open_session()
    History.for_session(session)  # recall's index in use, as a strategy's history tools put it
    for n, (calls, lines) in enumerate(turns):
        step(session, n, calls, lines)
        # folded at the step's end: a snapshot now folds nothing
        assert session.state[TIMELINE_KEY].cursor == len(session.events)
        assert session.state[HISTORY_KEY].cursor == len(session.events)
        assert session._snapshots.writer.encode(session, session._tracker.snapshot()) == SnapshotWriter().encode(
            session, session._tracker.snapshot()
        )
    return session


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 120)), min_size=1, max_size=10))
def test_a_prepared_snapshot_is_the_snapshot_built_from_nothing(tmp_path_factory, turns):
    prepared_equals_unprepared(tmp_path_factory.mktemp("prepared"), turns)


def test_the_same_across_compactions(tmp_path):
    session = prepared_equals_unprepared(tmp_path, [(2, 120), (1, 90), (3, 60)] * 3)
    assert sum(e.type == "compaction/summary" for e in session.events) >= 2


def nodes_of(session: Any) -> dict[int, Any]:
    covers, payload = session.store.snapshot_get(session.id)
    body = decode_snapshot(payload, session.id, covers, len(session.events))
    return {raw[0]["seq"]: raw[1] for raw in body["surface"]["nodes"]}


def test_a_node_snapshotted_before_it_was_counted_is_snapshotted_again_with_its_count(tmp_path):
    session = kernel(tmp_path).open_session()
    step(session, 0, 1, 5)
    seq = session.user("a message the meter has not counted yet")
    assert session.surface.node(seq).tokens is None
    session.write_snapshot()
    assert nodes_of(session)[seq] is None
    session.meter.surface_tokens()  # the next request counts it
    session.write_snapshot()
    assert nodes_of(session)[seq] == session.surface.node(seq).tokens > 0
    reopened = kernel(tmp_path).open_session(session.id)
    assert orjson.dumps([n.tokens for n in reopened.surface]) == orjson.dumps([n.tokens for n in session.surface])
