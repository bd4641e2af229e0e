"""Property tests over random sessions: replay equals the live surface, tool calls and results
are never split, pressure after a reopen equals the live pressure."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ctxkernel import CompactionError, Message, Span, ToolCallBlock, balanced_cut_at_or_before
from ctxkernel import events as ev
from ctxkernel.testing import build_kernel

WINDOW = {"context_window": 3000, "reserved_output_tokens": 500}

ops = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.integers(1, 300)),
        st.tuples(st.just("reply"), st.integers(0, 3), st.integers(0, 80), st.booleans()),
        st.tuples(st.just("result"), st.booleans(), st.integers(0, 600)),
        st.tuples(st.just("compact"), st.integers(0, 30), st.integers(0, 30), st.integers(1, 60)),
        st.tuples(st.just("compact_balanced"), st.integers(1, 30), st.integers(1, 20)),
        st.tuples(st.just("prune"), st.integers(0, 10)),
        st.tuples(st.just("end"), st.sampled_from(["completed", "aborted"])),
        st.tuples(st.just("reopen")),
    ),
    min_size=15,
    max_size=80,
)


def words(n: int, seed: int) -> str:
    return " ".join(f"w{(seed * 31 + i) % 97}" for i in range(n))


def check_pairing(session: Any) -> None:
    """Every visible result's call is visible before it; every visible call is pending or has
    its result visible after it."""
    position = {n.seq: i for i, n in enumerate(session.surface)}
    calls: dict[str, int] = {}
    for i, node in enumerate(session.surface):
        for call in node.message.tool_calls:
            calls[call.id] = i
    results: dict[str, int] = {}
    for i, node in enumerate(session.surface):
        if node.role == "tool":
            call_id = node.message.content[0].call_id
            assert call_id in calls and calls[call_id] < i, f"result {node.seq} is visible without its call"
            results[call_id] = i
    for call_id, i in calls.items():
        assert call_id in session.surface.pending_calls or results.get(call_id, -1) > i, (
            f"call {call_id} lost its result"
        )
    assert len(position) == len(session.surface)


def snapshot(session: Any) -> dict[str, Any]:
    return {
        "seqs": [n.seq for n in session.surface],
        "messages": [n.message.to_dict() for n in session.surface],
        "pressure": session.pressure(),
        "pending": dict(session.surface.pending_calls),
        "places": [(n.turn, n.step) for n in session.surface],
    }


def check_places(session: Any) -> None:
    """Each node's turn and step are those of the turn/start and step/start before the message
    it stands for (a replacement: the first node it replaced), folded here from the typed views."""
    turn = step = 0
    place: dict[int, tuple[int, int]] = {}
    for logged in session.events:
        typed = ev.view(logged)
        if isinstance(typed, ev.TurnStart):
            turn, step = typed.turn, 0
        elif isinstance(typed, ev.StepStart):
            step = typed.step
        elif isinstance(typed, ev.MessageRecord):
            place[logged.seq] = place[typed.cites[0]] if typed.cites else (turn, step)
    assert [(n.turn, n.step) for n in session.surface] == [place[n.seq] for n in session.surface]


def apply(kernel: Any, session: Any, op: tuple[Any, ...], counter: list[int]) -> Any:
    kind = op[0]
    counter[0] += 1
    n = counter[0]
    if kind == "user":
        if session.surface.pending_calls:
            return session
        session.user(words(op[1], n))
    elif kind == "reply":
        if session.surface.pending_calls:
            return session
        if not session.turn_open:
            session.user(f"task {n}")
        request = session.prepare_request()
        calls = [ToolCallBlock(f"c{n}_{i}", "read", {"path": f"f{n}_{i}.py"}) for i in range(op[1])]
        text = words(op[2], n) if op[2] or not calls else ""
        usage = {"input_tokens": request.pressure.tokens + 7, "output_tokens": 3} if op[3] else None
        session.commit_reply(Message.assistant(text or "ok", calls), usage=usage)
    elif kind == "result":
        pending = session.pending_calls
        if pending:
            session.tool_result(pending[0].id, words(op[2], n), is_error=op[1])
    elif kind == "compact":
        visible = [node.seq for node in session.surface]
        if not visible:
            return session
        i, j = sorted((op[1] % len(visible), op[2] % len(visible)))
        path = session.store.path(session.id)
        before_bytes = path.read_bytes()
        before = snapshot(session)
        events_before = len(session.events)
        try:
            session.compact(Span(visible[i], visible[j], summary=words(op[3], n)), strategy="basic")
        except CompactionError:
            assert snapshot(session) == before  # a failed transaction never changes the surface
            started = any(e.type == "compaction/start" for e in session.events[events_before:])
            if started:
                ends = [e for e in session.events[events_before:] if e.type == "compaction/end"]
                assert len(ends) == 1 and "error" in ends[0].data
            else:
                assert path.read_bytes() == before_bytes
    elif kind == "compact_balanced":
        # the head up to a balanced cut, as strategies choose it: exercises the commit path
        cut = balanced_cut_at_or_before(session.surface, min(op[1], len(session.surface)))
        if cut >= 1:
            nodes = session.surface.nodes
            try:
                session.compact(Span(nodes[0].seq, nodes[cut - 1].seq, summary=words(op[2], n)), strategy="basic")
            except CompactionError as exc:
                assert "not fewer than" in str(exc)  # only the shrink check may refuse a balanced head
    elif kind == "prune":
        tools = [node for node in session.surface if node.role == "tool"]
        if tools:
            node = tools[op[1] % len(tools)]
            content = node.message.content[0].content
            if len(content) > 10:
                session.replace_tool_result(node.seq, content[:5] + "…", strategy="basic")
    elif kind == "end":
        session.end_turn(op[1])
    elif kind == "reopen":
        live = snapshot(session)
        session = kernel.open_session(session.id, repair=False)
        assert snapshot(session) == live
    return session


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_sessions_replay_pair_and_meter_consistently(sequence: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        kernel = build_kernel(home, model=WINDOW, fsync=False)
        session = kernel.open_session()
        counter = [0]
        for op in sequence:
            session = apply(kernel, session, op, counter)
            check_pairing(session)
        check_places(session)
        live = snapshot(session)
        summaries = sum(e.type == "compaction/summary" for e in session.events)
        event(f"compactions: {min(summaries, 3)}{'+' if summaries >= 3 else ''}")
        event(f"pending calls at the end: {bool(session.surface.pending_calls)}")
        event(f"anchored: {live['pressure'].anchored}")
        # a different kernel and store object: nothing cached, the bytes alone
        reopened = build_kernel(home, model=WINDOW, fsync=False).open_session(session.id, repair=False)
        assert snapshot(reopened) == live
        assert [e.to_dict() for e in reopened.events] == [e.to_dict() for e in session.events]
        # and a crash-repair reopen closes whatever was open without breaking the pairing
        repaired = build_kernel(home, model=WINDOW, fsync=False).open_session(session.id)
        check_pairing(repaired)
        assert not repaired.surface.pending_calls
