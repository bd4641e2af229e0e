"""While a request is prepared, ``Session.model_settings()`` is read once per route and profile
object (a request asks up to seven times). Every answer, inside a request (asked by a strategy's
``pre_step`` before and after it routes the session elsewhere or the profile is reloaded) and
between requests (after the profile was edited in place), equals the settings computed afresh
from the profile and the route."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxkernel
from ctxkernel import Message, ToolCallBlock
from ctxkernel.plugins import StrategySpec
from ctxkernel.profile import ModelPolicy
from ctxkernel.session import ROUTE_WINDOW_KEY
from ctxkernel.testing import build_kernel


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
