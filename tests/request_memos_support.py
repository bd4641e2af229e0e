"""Drawn sessions for the tests that prove a memo of the request path answers what a fresh
computation answers (tests/core/test_session_memos.py): the drawn steps (user messages, requests
with tool calls and oversized results, compactions, routes, system prompts), a runner that makes
each valid for the session's state, twin sessions, and the switches that put a memo out of play."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import strategies as st

from ctxkernel import ControlError, Message, Session, ToolCallBlock, guard
from ctxkernel.guard import MAX_MESSAGE_SHARE
from ctxkernel.session.pressure import Gauge
from ctxkernel.testing import build_kernel

WORDS = "alpha beta gamma delta parser token module error window anchor".split()


def words(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed + i * 7) % len(WORDS)] + str(i % 13) for i in range(n))


#: a request: how many tool calls its reply makes, its usage, and how many words each result has
#: (2,500 are over the bound of the 8,000-token window, so the kernel excerpts them)
request = st.tuples(
    st.just("request"),
    st.integers(0, 2),
    st.sampled_from(["honest", "honest", "wild", "none"]),
    st.sampled_from([20, 300, 900, 2_500]),
)
step = st.one_of(
    st.tuples(st.just("user"), st.integers(1, 400)),
    request,
    request,
    st.tuples(st.just("compact")),
    st.tuples(st.just("route"), st.sampled_from([None, 1_200, 3_000, 6_000, 50_000])),
    st.tuples(st.just("system"), st.sampled_from([None, "Be brief.", "Answer in French."])),
)


def fresh_pressure(session: Session) -> Any:
    session._gauge.memo = None
    return session.pressure()


@contextlib.contextmanager
def excerpt_after(clear: Callable[[Session], None]) -> Iterator[None]:
    """``guard.excerpt_oversized``, wherever it is bound (the guard, the session, basic), runs
    ``clear(session)`` first: the tests switch its marks off with it."""
    excerpt = guard.excerpt_oversized

    def excerpt_cleared(session: Session) -> Any:
        clear(session)
        return excerpt(session)

    with (
        mock.patch.object(guard, "excerpt_oversized", excerpt_cleared),
        mock.patch("ctxkernel.session.compose.excerpt_oversized", excerpt_cleared),
        mock.patch("ctxkernel.handle.excerpt_oversized", excerpt_cleared),  # basic's, through its handle
    ):
        yield


@contextlib.contextmanager
def no_memos() -> Iterator[None]:
    """Every read computes afresh: the memo of pressure and the clear mark are cleared first."""
    pressure = Gauge.pressure

    def pressure_fresh(self: Gauge) -> Any:
        self.memo = None
        return pressure(self)

    def clear_mark(session: Session) -> None:
        session.oversized.clear_at = None

    with mock.patch.object(Gauge, "pressure", pressure_fresh), excerpt_after(clear_mark):
        yield


def run(session: Session, action: tuple[Any, ...], n: int) -> Any:
    """One drawn step, made valid for the session's state; returns what it observed."""
    kind = action[0]
    pending = session.pending_calls
    if kind == "user":
        session.user(words(action[1], n))
        return None
    if kind == "request":
        if not session.turn_open:
            session.user(words(5, n))
        request = session.prepare_request()
        seen = request.pressure
        assert seen == fresh_pressure(session)
        calls = [ToolCallBlock(f"c{n}_{k}", "read_file", {"path": f"m{k}.py"}) for k in range(action[1])]
        reply = Message.assistant(words(12, n), calls)
        usage = None
        if action[2] == "honest":
            usage = {"prompt_tokens": seen.tokens, "completion_tokens": session.meter.count_message(reply)}
        elif action[2] == "wild":  # far outside the plausible band: pressure keeps the meter's count
            usage = {"prompt_tokens": seen.tokens * 50 + 10_000, "completion_tokens": 3}
        session.commit_reply(reply, usage=usage)
        for call in calls:
            session.tool_result(call.id, words(action[3], n))
        return seen
    if kind == "compact":
        if session.step_open or pending:
            return None
        with contextlib.suppress(ControlError):
            session.compact_now()
        return None
    if kind == "route":
        session.set_route("openai", "gpt-4o", context_window=action[1])
        return None
    session.set_harness_system(action[1])
    return None


def check_memos(session: Session) -> None:
    memoised = session.pressure()
    assert memoised == fresh_pressure(session)
    window = memoised.effective_window
    if session.oversized.clear_at == (len(session.events), window):
        cap = int(MAX_MESSAGE_SHARE * window)
        assert all(session.meter.node_tokens(n) <= cap for n in session.surface.nodes)


def twin_sessions(tmp_path_factory: Any, first: str, second: str) -> tuple[Session, Session]:
    """Two fresh ``basic`` sessions of the same small-window profile, each in a home of its own."""
    profile = {"model": {"context_window": 8_000, "reserved_output_tokens": 500}}
    homes = [Path(tmp_path_factory.mktemp(first)), Path(tmp_path_factory.mktemp(second))]
    live, other = (build_kernel(home, strategies=["basic"], fsync=False, **profile).open_session() for home in homes)
    return live, other


def assert_steps_match(
    twins: tuple[Session, Session],
    steps: list[Any],
    check: Callable[[Session], object],
    switched_off: Callable[[], contextlib.AbstractContextManager[None]],
) -> None:
    """Run each step on both sessions, the second inside ``switched_off()`` (the paths under test
    replaced by fresh computation); ``check`` the first after each step, and require both to end
    it with the same answer, surface, pressure and event types."""
    live, fresh = twins
    for n, action in enumerate(steps):
        seen = run(live, action, n)
        check(live)
        with switched_off():
            expected = run(fresh, action, n)
            surface = [node.message.to_dict() for node in fresh.surface.nodes]
            pressure = fresh.pressure()
        assert seen == expected
        assert [node.message.to_dict() for node in live.surface.nodes] == surface
        assert live.pressure() == pressure
        assert [e.type for e in live.events] == [e.type for e in fresh.events]


def clear_large_mark(session: Session) -> None:
    session.oversized.large_clear_at = None


def no_large_mark() -> contextlib.AbstractContextManager[None]:
    return excerpt_after(clear_large_mark)
