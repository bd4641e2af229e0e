"""A replacement of the whole surface (a window switch) or of all but a few nodes (a handoff keeps
the open turn) takes the short way (issue 21, item 3): the pairing indexes are built again from the
nodes kept instead of walking the removed ones, the meter's total starts over from the nodes kept
instead of taking every removed count off, and a whole-surface span's ``tokens_before`` is the
meter's surface total instead of a sum over its nodes. Each short way leaves exactly the state the
general path builds, on drawn sessions of tool-calling steps, partial compactions, pruned results
and drops."""

from __future__ import annotations

from typing import Any

import drawn_support as drawn
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import CompactionError, Message, Span, ToolCallBlock
from ctxkernel.errors import SurfaceError
from ctxkernel.events import SURFACE_DROP, TOOL_RESULT, Event
from ctxkernel.meter import LARGE_NODE_TOKENS, Meter
from ctxkernel.snapshot import SnapshotWriter
from ctxkernel.surface import Surface
from ctxkernel.testing import build_kernel


def meter_view(meter: Meter) -> tuple[int, set[int], set[int]]:
    """What the meter's state means, read without changing it: the total with the counts of nodes
    counted but not yet added in, the nodes still uncounted, the large ones (``surface_tokens()``
    would fold the counted ones in: both paths then agree on every field)."""
    waiting = meter._uncounted.values()
    counted = [n for n in waiting if n.tokens is not None]
    return (
        meter.total + sum(n.tokens for n in counted),
        {n.seq for n in waiting if n.tokens is None},
        set(meter.large) | {n.seq for n in counted if n.tokens >= LARGE_NODE_TOKENS},
    )


class GeneralPath:
    """Wraps ``Surface.apply``: before a replacement of a listened surface that keeps fewer nodes
    than it removes (the whole surface, or all but a few), copies the indexes and the meter and
    runs the general path on the copies (``_index_remove`` and ``Meter.on_remove`` of the removed
    range, ``on_add`` of the replacement); after it, the live state must equal the copies'."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.short = 0  # replacements that took the short way
        self.whole = 0  # of them, those of the whole surface
        original = Surface.apply

        def apply(surface: Surface, event: Any, message: Any = None, *, checked: bool = False) -> None:
            op = event.surface or {}
            meters = [m for m in surface.listeners if isinstance(m, Meter)]
            if not meters or op.get("op") not in ("replace", "remove") or event.type == TOOL_RESULT:
                original(surface, event, message, checked=checked)
                return
            a, b = surface.position(op["start"]), surface.position(op["end"])
            assert a is not None and b is not None
            removed = surface.nodes[a : b + 1]
            if len(surface.nodes) - len(removed) >= len(removed):
                original(surface, event, message, checked=checked)
                return
            indexes = Surface()
            indexes.pending_calls = dict(surface.pending_calls)
            indexes.call_owner = dict(surface.call_owner)
            indexes.result_of = dict(surface.result_of)
            indexes._index_remove(removed)
            meter = meters[0]
            walked = Meter(meter.tokenizer)
            walked.total, walked.large, walked._uncounted = meter.total, dict(meter.large), dict(meter._uncounted)
            walked.on_remove(removed)
            whole = len(removed) == len(surface.nodes)
            original(surface, event, message, checked=checked)
            replacement = surface.nodes[a : a + 1] if event.type != SURFACE_DROP else []
            for node in replacement:
                walked.on_add(node)
            # in the same order too: a snapshot writes the indexes as they iterate
            for live, general_ in zip(
                (surface.pending_calls, surface.call_owner, surface.result_of),
                (indexes.pending_calls, indexes.call_owner, indexes.result_of),
                strict=True,
            ):
                assert list(live.items()) == list(general_.items())
            assert meter_view(meter) == meter_view(walked)
            self.short += 1
            self.whole += whole

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
                calls = drawn.drawn_turn(session, calls, n, padding=drawn.PLEASE)
            elif op == "result" and pending:
                drawn.drawn_results(session, pending, n)
            elif op == "head" and len(surface) > 3:
                drawn.drawn_head_summary(session, n)
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
        assert session._snapshots.writer.encode(session, session._tracker.snapshot()) == SnapshotWriter().encode(
            session, session._tracker.snapshot()
        )
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


def test_the_drawn_sessions_reach_the_short_way(tmp_path, monkeypatch):
    """The property above is not vacuous: a switch of a tool-calling surface takes the short way
    (and is checked against the general path) live and when the log is replayed, and so does a
    replacement that keeps a pending call and an answered pair after it."""
    general = GeneralPath(monkeypatch)
    kernel = build_kernel(tmp_path, fsync=False)
    session = kernel.open_session()

    def step(n: int, pending: bool = False) -> None:
        session.user(f"read two files, {n}")
        session.prepare_request()
        calls = [ToolCallBlock(f"a{n}", "read", {}), ToolCallBlock(f"b{n}", "read", {})]
        session.commit_reply(Message.assistant(f"reading {n}", calls))
        session.tool_result(f"a{n}", "alpha\n" * 30)
        if not pending:
            session.tool_result(f"b{n}", "beta\n" * 30)
            session.end_turn()

    for n in range(3):
        step(n)
    nodes = session.surface.nodes
    before = fresh_count(session, nodes)
    result = session.compact(
        Span(nodes[0].seq, nodes[-1].seq, message=Message.user("seed")), strategy="t", check_shrink=False
    )
    assert (general.short, general.whole) == (1, 1)
    assert result.tokens_before == before
    assert (session.surface.pending_calls, session.surface.call_owner, session.surface.result_of) == ({}, {}, {})
    assert session.meter.surface_tokens() == fresh_count(session, session.surface.nodes)
    for n in range(3, 6):
        step(n, pending=n == 5)
    nodes = session.surface.nodes
    head = nodes[-4].seq  # the pending step (its user message, call and one result) is kept
    session.compact(Span(nodes[0].seq, head, message=Message.user("older")), strategy="t", check_shrink=False)
    assert (general.short, general.whole) == (2, 1)
    assert session.surface.pending_calls == {"b5": nodes[-2].seq}
    assert session.surface.result_of == {"a5": nodes[-1].seq}
    session.tool_result("b5", "beta\n" * 30)
    build_kernel(tmp_path, fsync=False, store={"snapshot_every": 0}).open_session(session.id)
    assert (general.short, general.whole) == (4, 2)


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
