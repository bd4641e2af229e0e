"""A replacement of the whole surface (a window switch, a handoff) takes the short way (issue 21,
item 3): the pairing indexes are cleared instead of walked, the meter's total starts over instead
of taking every node's count off, and the span's ``tokens_before`` is the meter's surface total
instead of a sum over its nodes. Each short way leaves exactly the state the general path builds,
on drawn sessions of tool-calling steps, partial compactions, pruned results and drops."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import CompactionError, Message, Span, ToolCallBlock
from ctxkernel.errors import SurfaceError
from ctxkernel.events import TOOL_RESULT, Event
from ctxkernel.meter import Meter
from ctxkernel.snapshot import SnapshotWriter
from ctxkernel.surface import Surface
from ctxkernel.testing import build_kernel


class GeneralPath:
    """Wraps ``Surface.apply``: before a whole-surface replacement of a listened surface, copies
    the indexes and the meter and runs the general path on the copies (``_index_remove`` and
    ``Meter.on_remove`` of every node, ``on_add`` of the replacement); after it, the live state
    must equal the copies'."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.whole = 0
        original = Surface.apply

        def apply(surface: Surface, event: Any, message: Any = None, *, checked: bool = False) -> None:
            op = event.surface or {}
            meters = [m for m in surface.listeners if isinstance(m, Meter)]
            whole = (
                meters
                and op.get("op") in ("replace", "remove")
                and event.type != TOOL_RESULT
                and surface.position(op["start"]) == 0
                and surface.position(op["end"]) == len(surface.nodes) - 1
            )
            if not whole:
                original(surface, event, message, checked=checked)
                return
            removed = list(surface.nodes)
            indexes = Surface()
            indexes.pending_calls = dict(surface.pending_calls)
            indexes.call_owner = dict(surface.call_owner)
            indexes.result_of = dict(surface.result_of)
            indexes._index_remove(removed)
            meter = meters[0]
            walked = Meter(meter.tokenizer)
            walked.total, walked.large, walked._uncounted = meter.total, dict(meter.large), dict(meter._uncounted)
            walked.on_remove(removed)
            original(surface, event, message, checked=checked)
            for node in surface.nodes:
                walked.on_add(node)
            assert (surface.pending_calls, surface.call_owner, surface.result_of) == (
                indexes.pending_calls,
                indexes.call_owner,
                indexes.result_of,
            )
            assert meter.total == walked.total
            assert meter.large.keys() == walked.large.keys()
            assert meter._uncounted.keys() == walked._uncounted.keys()
            self.whole += 1

        monkeypatch.setattr(Surface, "apply", apply)


def fresh_count(session: Any, nodes: list[Any]) -> int:
    """Every node's count taken again from its message (no cached count)."""
    return sum(session.meter.count_message(n.message) for n in nodes)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.integers(0, 3)),  # a user message, a reply with n calls
        st.tuples(st.just("result"), st.integers(0, 3)),  # results of some pending calls
        st.tuples(st.just("head"), st.integers(0, 50)),  # a summary of a head region
        st.tuples(st.just("prune"), st.integers(0, 50)),  # a tool result shrunk in place
        st.tuples(st.just("count"), st.integers(0, 1)),  # the meter counts the surface (or not)
        st.tuples(st.just("whole"), st.integers(0, 1)),  # every node replaced (1: dropped)
    ),
    min_size=4,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_a_whole_surface_commit_leaves_the_general_paths_state(tmp_path_factory, ops):
    with pytest.MonkeyPatch.context() as monkeypatch:
        GeneralPath(monkeypatch)
        kernel = build_kernel(tmp_path_factory.mktemp("whole"), fsync=False)
        session = kernel.open_session()
        session.user("start")
        calls = 0
        for op, n in ops:
            surface = session.surface
            pending = list(surface.pending_calls)
            if op == "turn" and not pending:
                if session.turn_open:
                    session.end_turn()
                session.user(f"task {calls}: " + "please " * 5)
                session.prepare_request()
                blocks = [ToolCallBlock(f"c{calls}x{i}", "read", {"path": f"f{i}.py"}) for i in range(n)]
                calls += 1
                session.commit_reply(Message.assistant(f"step {calls}", blocks))
            elif op == "result" and pending:
                for call_id in pending[: max(1, n)]:
                    session.tool_result(call_id, f"content of {call_id}\n" * 8)
            elif op == "head" and len(surface) > 3:
                nodes = surface.nodes
                end = 1 + n % (len(nodes) - 1)
                try:
                    session.compact(
                        Span(nodes[0].seq, nodes[end - 1].seq, summary="s"), strategy="t", check_shrink=False
                    )
                except CompactionError:
                    pass
            elif op == "prune":
                tools = [node for node in surface.nodes if node.role == "tool"]
                if tools:
                    session.replace_tool_result(tools[n % len(tools)].seq, "[pruned]", strategy="t")
            elif op == "count" and n:
                session.meter.surface_tokens()
            elif op == "whole" and len(surface):
                nodes = list(surface.nodes)
                seed = None if n else Message.user(f"the new window after {calls} steps")
                span = Span(nodes[0].seq, nodes[-1].seq, remove=bool(n), message=seed)
                expected = fresh_count(session, nodes)
                try:
                    result = session.compact(span, strategy="t", check_shrink=False)
                except CompactionError:
                    assert pending  # only a pending call refuses the whole surface
                    continue
                assert result.tokens_before == expected
                # a drop leaves nothing but, when it took the user's instructions, the block keeping them
                assert len(session.surface) <= 1 if n else session.surface.seqs() == [result.spans[0].replacement_seq]
        for call_id in list(session.surface.pending_calls):  # a reopen would close them (repair)
            session.tool_result(call_id, "late")
        # the live state is the state built from nothing: the total, the indexes, the snapshot
        assert session.meter.surface_tokens() == fresh_count(session, session.surface.nodes)
        assert session._snapshots.encode(session) == SnapshotWriter().encode(session)
        replayed = build_kernel(session.store.home, fsync=False, store={"snapshot_every": 0}).open_session(session.id)
        assert [(n.seq, n.turn, n.step) for n in replayed.surface.nodes] == [
            (n.seq, n.turn, n.step) for n in session.surface.nodes
        ]
        assert (replayed.surface.pending_calls, replayed.surface.call_owner, replayed.surface.result_of) == (
            session.surface.pending_calls,
            session.surface.call_owner,
            session.surface.result_of,
        )
        assert replayed.meter.surface_tokens() == session.meter.surface_tokens()


def test_the_drawn_sessions_reach_the_whole_surface_path(tmp_path, monkeypatch):
    """The property above is not vacuous: a switch of a tool-calling surface takes the short way
    (and is checked against the general path) once live and once when the log is replayed."""
    general = GeneralPath(monkeypatch)
    kernel = build_kernel(tmp_path, fsync=False)
    session = kernel.open_session()
    session.user("read two files")
    session.prepare_request()
    session.commit_reply(Message.assistant("reading", [ToolCallBlock("a", "read", {}), ToolCallBlock("b", "read", {})]))
    session.tool_result("a", "alpha\n" * 30)
    session.tool_result("b", "beta\n" * 30)
    assert session.surface.call_owner and session.surface.result_of
    nodes = session.surface.nodes
    before = fresh_count(session, nodes)
    result = session.compact(
        Span(nodes[0].seq, nodes[-1].seq, message=Message.user("seed")), strategy="t", check_shrink=False
    )
    assert general.whole == 1
    assert result.tokens_before == before
    assert (session.surface.pending_calls, session.surface.call_owner, session.surface.result_of) == ({}, {}, {})
    assert session.meter.surface_tokens() == fresh_count(session, session.surface.nodes)
    build_kernel(tmp_path, fsync=False, store={"snapshot_every": 0}).open_session(session.id)
    assert general.whole == 2


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_a_replacements_cites_are_judged_as_a_set_whatever_their_order(data):
    """Cites listed in surface order are accepted without building two sets; any other listing
    gets the set comparison's verdict (a permutation passes, a repeat, gap or stranger fails)."""
    surface = Surface()
    size = data.draw(st.integers(1, 8))
    for seq in range(size):
        message = Message.user(f"message {seq}")
        surface.apply(Event(seq, "user/message", {"message": message.to_dict()}, "t", {"op": "append"}))
    seqs = surface.seqs()
    start = data.draw(st.integers(0, size - 1))
    end = data.draw(st.integers(start, size - 1))
    shadowed = seqs[start : end + 1]
    cites = data.draw(
        st.one_of(
            st.just(list(shadowed)),
            st.permutations(shadowed).map(list),
            st.lists(st.sampled_from([*seqs, 99]), min_size=1, max_size=10),
        )
    )
    op = {"op": "replace", "start": shadowed[0], "end": shadowed[-1], "cites": cites}
    event = Event(size, "user/message", {"message": Message.user("summary").to_dict()}, "t", op)
    try:
        surface.check(event)
        accepted = True
    except SurfaceError as exc:
        accepted = False
        assert f"it must cite exactly {shadowed}" in str(exc)
    assert accepted == (len(cites) == len(shadowed) and set(cites) == set(shadowed))
