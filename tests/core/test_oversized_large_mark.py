"""``guard.excerpt_oversized`` skips its scan when the meter's index of large nodes holds the same
nodes (``Meter.large_changes``) and the cap is the one a pass that found nothing had: a request
folds a few small messages, none of which can be over a cap of at least ``LARGE_NODE_TOKENS``.
After every step of a drawn session (the steps of ``test_request_memos``: oversized tool results
the kernel excerpts, compactions, routes to windows large and small, usage in and out of the
band), the mark holds only when a fresh scan of the whole surface finds nothing over the cap,
and a second session with the mark switched off (cleared before every pass) ends every step with
the same surface, pressures and event types."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from request_memos_support import assert_steps_match, no_large_mark, step, twin_sessions

from ctxkernel import Message, Session, guard
from ctxkernel.guard import MAX_MESSAGE_SHARE
from ctxkernel.meter import LARGE_NODE_TOKENS
from ctxkernel.testing import build_kernel


def check_mark(session: Session) -> bool:
    """When the mark holds now, nothing on the surface is over its cap; True when it held."""
    mark = session.oversized.large_clear_at
    meter = session.meter
    meter.surface_tokens()
    if mark is None or mark[0] != meter.large_changes:
        return False
    cap = mark[1]
    assert cap >= LARGE_NODE_TOKENS
    assert all(meter.node_tokens(n) <= cap for n in session.surface.nodes)
    window = session.pressure().effective_window
    if int(MAX_MESSAGE_SHARE * window) == cap:  # the pass would skip: so would a fresh scan
        assert guard.excerpt_oversized(session) is None
    return True


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=30))
def test_the_large_mark_skips_only_scans_that_find_nothing(tmp_path_factory: Any, steps: list[Any]) -> None:
    assert_steps_match(twin_sessions(tmp_path_factory, "mark", "fresh"), steps, check_mark, no_large_mark)


def test_a_request_after_a_clear_pass_skips_the_scan(tmp_path: Path) -> None:
    """The steady state: a large node on the surface, small messages folded since, the same window."""
    session = build_kernel(tmp_path, strategies=["basic"], fsync=False).open_session()
    session.user("alpha " * 2_000)  # a large node, under the bound of the default window
    session.prepare_request()
    session.commit_reply(Message.assistant("ok"))
    session.end_turn()
    assert session.meter.large and session.oversized.large_clear_at is not None
    scanned = []
    real = guard._large_nodes
    with mock.patch.object(guard, "_large_nodes", lambda s, above: scanned.append(above) or real(s, above)):
        session.user("a short question")
        session.prepare_request()
    assert scanned == []
