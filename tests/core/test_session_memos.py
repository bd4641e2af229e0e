"""The session's memos answer what the paths without them answer: the memos of a request (pressure,
the oversized marks, the routed model's settings), the counts taken before an append, the
per-class decision to sync an index, and the log's bytes with every shortcut of the request path
put back. One section per property, each with the description it was written with."""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from request_memos_support import (
    assert_steps_match,
    check_memos,
    clear_large_mark,
    excerpt_after,
    no_large_mark,
    no_memos,
    run,
    step,
    twin_sessions,
    words,
)

import ctxkernel
from ctxkernel import Message, Session, ToolCallBlock, guard
from ctxkernel import events as ev
from ctxkernel.guard import MAX_MESSAGE_SHARE
from ctxkernel.meter import LARGE_NODE_TOKENS, Meter, get_tokenizer
from ctxkernel.plugins import HookFacade, StrategySpec
from ctxkernel.profile import ModelPolicy
from ctxkernel.session import COUNTED_ENTRIES, ROUTE_WINDOW_KEY
from ctxkernel.session import reply as session_module
from ctxkernel.session import snapshots as snapshots_module
from ctxkernel.session.route import Routing
from ctxkernel.snapshot import SnapshotIndex
from ctxkernel.surface import Surface
from ctxkernel.testing import CountingTokenizer, build_kernel
from ctxkernel.text import storable

# -- pressure and the oversized clear mark ---------------------------------------------------------
# The memos a request reads more than once (``Session.pressure`` and the clear mark of
# ``guard.excerpt_oversized``) give the answer a fresh computation gives, after every step of a
# drawn session: user messages, replies with tool calls, small and oversized results, compactions,
# routes with and without a window of their own (one too small for the meter's index of large
# nodes, so the bound scans the whole surface), provider usage in and out of the plausible band,
# and a changed system prompt. A second session runs the same steps with both memos switched off
# (cleared before every read): its surface and every pressure must be the same.


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=30))
def test_memoised_answers_equal_fresh_ones_after_every_step(tmp_path_factory: Any, steps: list[Any]) -> None:
    assert_steps_match(twin_sessions(tmp_path_factory, "memo", "fresh"), steps, check_memos, no_memos)


# -- the oversized scan's large-node mark ----------------------------------------------------------
# ``guard.excerpt_oversized`` skips its scan when the meter's index of large nodes holds the same
# nodes (``Meter.large_changes``) and the cap is the one a pass that found nothing had: a request
# folds a few small messages, none of which can be over a cap of at least ``LARGE_NODE_TOKENS``.
# After every step of a drawn session (the steps of tests/request_memos_support.py: oversized tool results
# the kernel excerpts, compactions, routes to windows large and small, usage in and out of the
# band), the mark holds only when a fresh scan of the whole surface finds nothing over the cap,
# and a second session with the mark switched off (cleared before every pass) ends every step with
# the same surface, pressures and event types.


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


# -- the routed model's settings, read once per request --------------------------------------------
# While a request is prepared, ``Session.model_settings()`` is read once per route and profile
# object (a request asks up to seven times). Every answer, inside a request (asked by a strategy's
# ``pre_step`` before and after it routes the session elsewhere or the profile is reloaded) and
# between requests (after the profile was edited in place), equals the settings computed afresh
# from the profile and the route.


def fresh_settings(session: Any) -> Any:
    route = session.route or {}
    model = session.kernel.profile.model_for(route.get("provider"), route.get("model"))
    window = route.get(ROUTE_WINDOW_KEY)
    if isinstance(window, int) and window != model.context_window:
        model = model.with_window(window)
    return model


def same(a: Any, b: Any) -> bool:
    return a.model_dump() == b.model_dump()


class Router:
    """In ``pre_step``: ask, do the drawn thing (route elsewhere, reload the profile as a copy,
    nothing), ask again; every answer is checked against a fresh computation."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, Any]] = []
        self.checked = 0
        self.session: Any = None

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("router"))

    @ctxkernel.hookimpl(tryfirst=True)
    def pre_step(self, ctx: Any, step: Any) -> None:
        session = self.session  # the test reaches past the plugin contract on purpose: it drives the kernel
        assert same(session.model_settings(), fresh_settings(session))
        kind, value = self.actions.pop(0) if self.actions else ("none", None)
        if kind == "route":
            provider, model, window = value
            session.set_route(provider, model, window)
        elif kind == "reload":  # what refresh_profile does: another profile object
            session.kernel.profile = session.kernel.profile.model_copy(deep=True)
            session.kernel.profile.model.reserved_output_tokens = 1_500
        for _ in range(2):
            assert same(session.model_settings(), fresh_settings(session))
            self.checked += 1


routes = st.tuples(
    st.sampled_from(["openai", "anthropic"]),
    st.sampled_from(["gpt-x", "big-model", "small-model"]),
    st.sampled_from([None, 9_000, 40_000, 200_000]),
)
actions = st.one_of(
    st.tuples(st.just("route"), routes),
    st.tuples(st.just("reload"), st.none()),
    st.tuples(st.just("none"), st.none()),
    st.tuples(st.just("edit"), st.sampled_from([16_000, 64_000, 128_000])),  # between requests, in place
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(actions, min_size=1, max_size=10))
def test_every_answer_is_the_fresh_one(tmp_path_factory: Any, drawn: list[tuple[str, Any]]) -> None:
    router = Router()
    kernel = build_kernel(
        tmp_path_factory.mktemp("settings"), fsync=False, strategies=["router"], plugins=[("router", router)]
    )
    kernel.profile.model_policies = [
        ModelPolicy.model_validate({"match": {"name": "big-model"}, "model": {"context_window": 150_000}})
    ]
    session = router.session = kernel.open_session()
    for k, (kind, value) in enumerate(drawn):
        if kind == "edit":
            kernel.profile.model.context_window = value  # in place: the next request reads it
            assert same(session.model_settings(), fresh_settings(session))
            continue
        router.actions.append((kind, value))
        session.user(f"question {k}")
        request = session.prepare_request()
        assert request.pressure.context_window == fresh_settings(session).context_window
        assert session._routing._memo is None  # nothing kept once the request is prepared
        session.commit_reply(Message.assistant(f"answer {k}"))
        session.end_turn()
        assert same(session.model_settings(), fresh_settings(session))
    assert router.checked >= 2 * sum(kind != "edit" for kind, _ in drawn)


def test_the_memo_is_dropped_when_the_request_fails(tmp_path: Any) -> None:
    kernel = build_kernel(tmp_path, fsync=False)
    session = kernel.open_session()
    session.user("hello")
    session.prepare_request()
    session.commit_reply(Message.assistant("", [ToolCallBlock("c1", "read", {"path": "a"})]))
    with pytest.raises(ctxkernel.EventError, match="wait for results"):
        session.prepare_request()  # refused inside the request, after the memo was set up
    assert session._routing._memo is None and session._routing.preparing == 0


# -- the request path's shortcuts leave the log's bytes as they were -------------------------------
# The cuts to a request's work (the surface's kept message lists, the reply's
# surrogate check and its one ``to_dict``, the model settings read once per request, hooks nobody
# implements not dispatched, the excerpt bound's mark on the index of large nodes) leave the log's
# bytes as they were. Drawn sessions (client-held history written with the request, as ``serve``
# does, and the usual user/request/reply steps with tool calls, oversized results, compactions,
# routes and system prompts) are run twice, once on these paths and once with each of them put back
# to what it replaced; the two jsonl logs are byte-identical once the event times and the random
# ids (compaction ids, lease tokens) are numbered in order of appearance.


def _storable_message_before(message: Message) -> tuple[Message, dict[str, Any]]:
    """The reply's cleaning as it was: storable() walks its dict, and the dict is built again."""
    data = message.to_dict()
    cleaned = storable(data)
    message = message if cleaned is data else Message.from_dict(cleaned)
    return message, message.to_dict()


@contextlib.contextmanager
def paths_before() -> Iterator[None]:
    model_settings = Routing.model_settings

    def settings_fresh(self: Routing) -> Any:
        self._memo = None
        return model_settings(self)

    def always_dispatch(self: HookFacade, name: str, session: Any, /, **kwargs: Any) -> None:
        self._caller(name, session)(ctx=session.context, **kwargs)

    with (
        mock.patch.object(Surface, "messages", lambda self: [n.message for n in self.nodes]),
        mock.patch.object(Surface, "seqs", lambda self: [n.seq for n in self.nodes]),
        mock.patch.object(session_module, "_storable_message", _storable_message_before),
        mock.patch.object(Routing, "model_settings", settings_fresh),
        mock.patch.object(HookFacade, "_call_if_implemented", always_dispatch),
        excerpt_after(clear_large_mark),
    ):
        yield


def serve_request(session: Session, n: int, calls: int) -> None:
    """A proxy's request: the client's new user message held and written with the reply."""
    if session.surface.pending_calls or session.step_open:
        return
    request = session.prepare_request(history=[Message.user(words(8, n))], defer_write=True)
    blocks = [ToolCallBlock(f"s{n}_{k}", "read_file", {"path": f"s{k}.py"}) for k in range(calls)]
    reply = Message.assistant(words(10, n) + (" \ud800" if n % 5 == 0 else ""), blocks)  # a lone surrogate too
    session.commit_reply(reply, usage={"prompt_tokens": request.pressure.tokens, "completion_tokens": 9})
    for call in blocks:
        session.tool_result(call.id, words(30, n))


_RANDOM = re.compile(rb'"(compaction_id|token)":"([0-9a-f]+)"')
_TIMES = re.compile(rb'"(time|started)":"[^"]*"')


def normalised(path: Path) -> bytes:
    """The events' lines (the header line, with the session's own id, left out)."""
    data = _TIMES.sub(rb'"\1":"T"', path.read_bytes().split(b"\n", 1)[1])
    seen: dict[bytes, int] = {}
    return _RANDOM.sub(lambda m: b'"%s":"id%d"' % (m.group(1), seen.setdefault(m.group(2), len(seen))), data)


drawn = st.one_of(step, st.tuples(st.just("serve"), st.integers(0, 2)), st.tuples(st.just("serve"), st.just(0)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(drawn, min_size=1, max_size=25))
def test_the_log_is_byte_identical_to_the_paths_before(tmp_path_factory: Any, steps: list[Any]) -> None:
    now, before = twin_sessions(tmp_path_factory, "now", "before")
    for n, action in enumerate(steps):
        for session, paths in ((now, contextlib.nullcontext()), (before, paths_before())):
            with paths:
                if action[0] == "serve":
                    serve_request(session, n, action[1])
                else:
                    run(session, action, n)
    logs = [normalised(s.store.path(s.id)) for s in (now, before)]
    assert logs[0] == logs[1]
    assert len(now.events) == len(before.events)


# -- counts taken before an append -----------------------------------------------------------------
# A message counted before it is appended (the reply's estimate in ``commit_reply``, a front
# door's ledger through ``Session.count_message``) is tokenised once: its surface node takes the
# count of its exact text. The meter's total stays exact.


def counted_session(tmp_path: Path) -> tuple[Any, CountingTokenizer]:
    session = build_kernel(tmp_path, fsync=False).open_session()
    counting = CountingTokenizer(session.meter.tokenizer)
    session.meter.tokenizer = counting
    return session, counting


def recount(session: Any) -> int:
    """The surface's tokens counted from nothing by a fresh meter."""
    fresh = Meter(get_tokenizer())
    return sum(fresh.count_message(node.message) for node in session.surface.nodes)


def test_a_reply_is_tokenised_once_by_the_kernel(tmp_path: Path) -> None:
    session, counting = counted_session(tmp_path)
    session.user("start the work")
    session.prepare_request()
    request_tokens = session._composer.request_estimate
    reply = "the reply, counted for the estimate and on the surface " * 5
    session.commit_reply(Message.assistant(reply), usage={"prompt_tokens": 30, "completion_tokens": 70})
    session.user("and the next thing")
    session.prepare_request()
    assert counting.texts.count(reply) == 1
    assert session.meter.surface_tokens() == recount(session)
    [event] = [e for e in session.events if e.type == ev.ASSISTANT_MESSAGE]
    assert event.data["estimate"] == request_tokens + Meter(get_tokenizer()).count_message(Message.assistant(reply))


def test_messages_counted_before_their_append_are_tokenised_once(tmp_path: Path) -> None:
    session, counting = counted_session(tmp_path)
    history = [
        Message.user("the user's instruction"),
        Message.assistant("calling", [ToolCallBlock("c1", "read", {"path": "a.txt"})]),
        Message.tool("c1", "the file's text"),
    ]
    counts = [session.count_message(m) for m in history]  # as a front door's ledger does
    session.append_history(history)
    session.meter.surface_tokens()
    assert counts == [Meter(get_tokenizer()).count_message(m) for m in history]
    assert len(counting.texts) == len(history)
    assert session.meter.surface_tokens() == recount(session)
    assert not session._counts.pending  # every count was taken by its node


def test_a_count_of_other_text_is_not_taken(tmp_path: Path) -> None:
    session, counting = counted_session(tmp_path)
    session.count_message(Message.user("what was counted"))
    session.user("what was appended")
    assert session.meter.surface_tokens() == recount(session)
    assert counting.texts == ["what was counted", "what was appended"]


def test_the_kept_counts_are_bounded(tmp_path: Path) -> None:
    session, _ = counted_session(tmp_path)
    for index in range(5 * COUNTED_ENTRIES):
        session.count_message(Message.user(f"never appended {index}"))
        assert len(session._counts.pending) <= COUNTED_ENTRIES


texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["user", "reply", "call"]), texts, st.booleans(), st.booleans()),
        min_size=1,
        max_size=10,
    )
)
def test_the_meter_total_stays_exact_whatever_was_counted_first(steps) -> None:
    """Messages counted before their append (the same text, another text, or not at all), through
    user(), commit_reply() and append_history(): the total equals a fresh count of the surface,
    and no counted text is tokenised twice."""
    with tempfile.TemporaryDirectory() as home:
        session, counting = counted_session(Path(home))
        session.user("begin")
        for index, (kind, text, precount, same) in enumerate(steps):
            if kind == "user":
                message = Message.user(text or "x")
            elif kind == "reply":
                message = Message.assistant(text)
            else:
                message = Message.assistant(text, [ToolCallBlock(f"c{index}", "read", {"path": text})])
            if precount:
                session.count_message(message if same else Message.user(text + "!"))
            if kind == "user":
                session.user(message)
            else:
                session.prepare_request()
                session.commit_reply(message, usage={"prompt_tokens": 10, "completion_tokens": 5})
                if message.tool_calls:
                    session.append_history([Message.tool(f"c{index}", text)])
            assert session.meter.surface_tokens() == recount(session)


# -- the per-class decision to sync an index -------------------------------------------------------
# At each step's end the session syncs the ``session.state`` entries whose class is a
# :class:`ctxkernel.snapshot.SnapshotIndex` with a ``sync()``, deciding once per class (the
# runtime Protocol check costs ~10 us an entry), with the same decision as the Protocol's.


class Index:
    def __init__(self) -> None:
        self.synced = 0

    def folded(self) -> dict[str, Any]:
        return {"version": 1, "cursor": 1}

    def sync(self) -> None:
        self.synced += 1


class FoldedOnly:
    def folded(self) -> dict[str, Any]:
        return {}


class SyncOnly:
    def __init__(self) -> None:
        self.synced = 0

    def sync(self) -> None:
        self.synced += 1


class SyncNotCallable:
    sync = 3

    def folded(self) -> dict[str, Any]:
        return {}


def one_step(session: Any) -> None:
    session.user("do it")
    session.prepare_request()
    session.commit_reply(Message.assistant("done"))  # ends the step: the indexes are synced


def test_index_entries_are_synced_at_each_step_end_and_others_are_left_alone(tmp_path: Path) -> None:
    session = build_kernel(tmp_path, fsync=False).open_session()
    index, sync_only = Index(), SyncOnly()
    session.state.update(index=index, sync_only=sync_only, folded_only=FoldedOnly(), plain={"a": 1})
    session.state["odd"] = SyncNotCallable()
    one_step(session)
    one_step(session)
    assert index.synced == 2
    assert sync_only.synced == 0  # not a SnapshotIndex: no folded()


@pytest.mark.parametrize("cls", [Index, FoldedOnly, SyncOnly, SyncNotCallable, dict, list, int])
def test_the_class_decision_is_the_protocol_s_and_is_taken_once(cls: type, monkeypatch) -> None:
    monkeypatch.setattr(snapshots_module, "_INDEX_CLASSES", {})
    value = cls()
    expected = isinstance(value, SnapshotIndex) and callable(getattr(value, "sync", None))
    assert snapshots_module._syncs_as_index(value) is expected
    assert snapshots_module._INDEX_CLASSES == {cls: expected}
    calls = 0
    real = type(SnapshotIndex).__subclasscheck__

    def counting(proto: Any, other: type) -> bool:
        nonlocal calls
        calls += 1
        return real(proto, other)

    monkeypatch.setattr(type(SnapshotIndex), "__subclasscheck__", counting)
    for _ in range(3):
        assert snapshots_module._syncs_as_index(cls()) is expected
    assert calls == 0  # decided from the kept answer


def test_the_kept_decisions_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(snapshots_module, "_INDEX_CLASSES", {})
    for n in range(2 * snapshots_module._INDEX_CLASSES_MAX + 5):
        snapshots_module._syncs_as_index(type(f"Made{n}", (), {})())
        assert len(snapshots_module._INDEX_CLASSES) <= snapshots_module._INDEX_CLASSES_MAX
