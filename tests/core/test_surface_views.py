"""The surface keeps its nodes' messages and seqs between requests (``Surface._views``: every
request sends the whole surface) and extends them by the nodes appended since. Whatever was
appended, replaced, dropped, rewritten in place or restored from a snapshot in between, what it
hands out equals the lists built afresh from ``nodes``, and each call hands out a new list."""

from __future__ import annotations

import contextlib

import drawn_support as drawn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, Span
from ctxkernel.errors import CompactionError
from ctxkernel.surface import Surface
from ctxkernel.testing import build_kernel


def assert_views_fresh(surface: Surface) -> None:
    messages, seqs = surface.messages(), surface.seqs()
    assert messages == [n.message for n in surface.nodes]
    assert all(a is n.message for a, n in zip(messages, surface.nodes, strict=True))
    assert seqs == [n.seq for n in surface.nodes]
    # new lists each time: a request decorates its own copy, never the kept one
    messages.append(None)
    seqs.clear()
    assert len(surface.messages()) == len(surface.nodes) == len(surface.seqs())


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.integers(0, 3)),  # a user message, a reply with n calls
        st.tuples(st.just("result"), st.integers(0, 3)),  # results of some pending calls
        st.tuples(st.just("compact"), st.integers(0, 50)),  # a summary of a head region
        st.tuples(st.just("drop"), st.integers(0, 50)),  # a head region removed without a summary
        st.tuples(st.just("prune"), st.integers(0, 50)),  # a tool result rewritten in place
        st.tuples(st.just("reopen"), st.integers(0, 1)),  # the session opened again (from a snapshot)
    ),
    min_size=4,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS, st.lists(st.booleans(), min_size=40, max_size=40))
def test_the_kept_views_are_the_nodes_messages_and_seqs(tmp_path_factory, ops, look):
    kernel = build_kernel(tmp_path_factory.mktemp("views"), fsync=False, store={"snapshot_every": 6})
    session = kernel.open_session()
    calls = 0
    for step, (op, n) in enumerate(ops):
        calls, ran = drawn.drawn_shared_step(session, op, n, calls)
        surface = session.surface
        pending = list(surface.pending_calls)
        if ran:
            pass  # one of the steps the surface tests share
        elif op == "drop" and len(surface) > 3:
            nodes = surface.nodes
            end = 1 + n % (len(nodes) - 1)
            # a pending call in the span: refused, one of the drawn outcomes
            with contextlib.suppress(CompactionError):
                session.compact(
                    Span(nodes[0].seq, nodes[end - 1].seq, remove=True), strategy="t", kind="drop", check_shrink=False
                )
        elif op == "prune":
            results = [node for node in surface.nodes if node.role == "tool"]
            if results:
                session.replace_tool_result(results[n % len(results)].seq, f"pruned {n}", strategy="t")
        elif op == "reopen":
            if session.turn_open and not pending:
                session.end_turn()
            session = kernel.open_session(session.id)
        if look[step]:  # not after every step: several changes between two looks, as between requests
            assert_views_fresh(session.surface)
    assert_views_fresh(session.surface)


def test_a_request_carries_the_surface_as_it_is_now(tmp_path):
    """The request's messages and seqs are the surface's at the time it was composed; decorating
    one request leaves the next one's lists untouched."""
    session = build_kernel(tmp_path, fsync=False).open_session()
    for k in range(3):
        session.user(f"question {k}")
        first = session.prepare_request()
        assert first.seqs == [n.seq for n in session.surface.nodes]
        assert first.messages == [n.message for n in session.surface.nodes]
        first.messages[0] = None  # a caller's change to its own copy
        first.seqs.append(-1)
        session.commit_reply(Message.assistant(f"answer {k}"))
        session.end_turn()
    assert session.surface.messages() == [n.message for n in session.surface.nodes]
    assert session.surface.seqs() == [n.seq for n in session.surface.nodes]
