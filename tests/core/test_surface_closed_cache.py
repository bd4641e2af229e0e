"""A range found closed is remembered until a replacement changes the surface (issue 21, item 2:
a transaction checks its span when it validates and again when its commit is appended). The
remembered verdict is always the one a fresh check gives, whatever was appended or replaced."""

from __future__ import annotations

from typing import Any

import drawn_support as drawn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel.errors import SurfaceError
from ctxkernel.surface import Surface
from ctxkernel.testing import build_kernel


def verdict(surface: Surface, nodes: list[Any]) -> str | None:
    try:
        surface.check_range_closed(nodes)
    except SurfaceError as exc:
        return str(exc)
    return None


def walked_verdict(surface: Surface, nodes: list[Any]) -> str | None:
    """The walk over every node, which the check skips for the whole surface with no call pending."""
    try:
        surface._walk_closed(nodes)
    except SurfaceError as exc:
        return str(exc)
    return None


def fresh_verdict(surface: Surface, nodes: list[Any]) -> str | None:
    saved = surface._closed
    surface._closed = None
    try:
        return verdict(surface, nodes)
    finally:
        surface._closed = saved


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.integers(0, 3)),  # a user message, a reply with n calls
        st.tuples(st.just("result"), st.integers(0, 3)),  # results of some pending calls
        st.tuples(st.just("compact"), st.integers(0, 50)),  # a summary of a head region
        st.tuples(st.just("check"), st.integers(0, 10_000)),  # a range, checked twice
    ),
    min_size=4,
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_the_remembered_verdict_is_a_fresh_checks(tmp_path_factory, ops):
    session = build_kernel(tmp_path_factory.mktemp("closed")).open_session()
    calls = 0
    for op, n in ops:
        surface = session.surface
        pending = list(surface.pending_calls)
        if op == "turn" and not pending:
            calls = drawn.drawn_turn(session, calls, n, padding=drawn.PLEASE)
        elif op == "result" and pending:
            drawn.drawn_results(session, pending, n)
        elif op == "compact" and len(surface) > 3:
            drawn.drawn_head_summary(session, n)
        elif op == "check" and len(surface):
            nodes = surface.nodes
            i = n % len(nodes)
            j = i + (n // len(nodes)) % (len(nodes) - i)
            span = nodes[i : j + 1]
            assert verdict(surface, span) == fresh_verdict(surface, span)
            assert verdict(surface, span) == fresh_verdict(surface, span)  # from the memory, if closed
        # every remembered range, after whatever happened since, still gets a fresh check's verdict
        if surface._closed is not None:
            version, first, last, length = surface._closed
            a, b = surface.position(first), surface.position(last)
            if version == surface.version and a is not None and b is not None and b - a + 1 == length:
                span = surface.nodes[a : b + 1]
                assert verdict(surface, span) is None
                assert fresh_verdict(surface, span) is None
        # the whole surface (a rollover's span) gets the walk's verdict without the walk
        whole = list(session.surface.nodes)
        if whole:
            assert fresh_verdict(session.surface, whole) == walked_verdict(session.surface, whole)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS, st.lists(st.integers(0, 10_000), max_size=3))
def test_a_range_closed_at_its_edges_is_what_the_walk_finds(tmp_path_factory, ops, rewrites):
    """The check skips the walk when neither edge of a range is a tool result (no call pending):
    every range of drawn surfaces (calls with several results, some pending, summaries, results
    rewritten in place) gets the walk's verdict, and a range closed at its edges is one the walk
    finds closed."""
    session = build_kernel(tmp_path_factory.mktemp("edges"), fsync=False).open_session()
    calls = 0
    for step, (op, n) in enumerate(ops):
        calls, _ = drawn.drawn_shared_step(session, op, n, calls)
        if step < len(rewrites):
            results = [node for node in session.surface.nodes if node.role == "tool"]
            if results:
                session.replace_tool_result(results[rewrites[step] % len(results)].seq, "shorter", strategy="t")
        nodes = session.surface.nodes
        for i in range(len(nodes)):
            for j in range(i, len(nodes)):
                span = nodes[i : j + 1]
                walked = walked_verdict(session.surface, span)
                assert fresh_verdict(session.surface, span) == walked
                if session.surface._closed_at_its_edges(span):
                    assert walked is None
