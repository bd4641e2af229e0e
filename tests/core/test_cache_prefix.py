"""The prompt cache in a session: ``Request.cache_prefix_tokens`` (recorded with each step, shown
by ``inspect``, the same after a restart), and the break-even rule applied where strategies commit
their edits (compaction.py, ``Session.replace_tool_result``): an automatic edit that does not pay
for the cached prefix it rewrites waits, with nothing written; an overflow, a manual edit, an
expired cache or ``[cache] rule = "off"`` let it through."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

import ctxkernel
from ctxkernel import CacheWaitError, Message, Span, ToolCallBlock
from ctxkernel.events import StepStart, replay_clock, views
from ctxkernel.testing import build_kernel

SONNET = {
    "provider": "anthropic",
    "name": "claude-sonnet-4-5",
    "context_window": 200_000,
    "reserved_output_tokens": 1_000,
}


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


STRATEGY = ctxkernel.Strategy("editor", _Settings)


class Editor:
    """A strategy that runs one planned edit at its next ``pre_step`` and records the outcome."""

    def __init__(self) -> None:
        self.plan: Any = None
        self.outcomes: list[Any] = []

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(STRATEGY.spec)

    @ctxkernel.hookimpl
    def register_tools(self, register: Any, ctx: Any) -> None:
        register(STRATEGY.tool("tidy_up", "ask for a tidier context", ctxkernel.ToolArgs, lambda c, a: "noted"))

    @ctxkernel.hookimpl
    def pre_step(self, ctx: Any, step: Any) -> None:
        if self.plan is None:
            return
        plan, self.plan = self.plan, None
        try:
            self.outcomes.append(plan(STRATEGY.on(ctx)))
        except CacheWaitError as exc:
            self.outcomes.append(exc)


def _kernel(tmp_path, editor: Editor, model=None, **tables: Any):
    return build_kernel(
        tmp_path,
        strategies=["editor"],
        plugins=[("editor", editor)],
        model=model or SONNET,
        instructions={"budget_ratio": 0},
        fsync=False,
        **tables,
    )


def _steps(session, n: int, size: int = 400) -> list[int]:
    """``n`` steps, each reading one file of ``size`` lines; returns the tool results' seqs."""
    results = []
    for i in range(n):
        session.prepare_request()
        session.commit_reply(Message.assistant("", [ToolCallBlock(f"c{i}", "read", {"path": f"f{i}.py"})]))
        results.append(
            session.tool_result(f"c{i}", "\n".join(f"line {k} of file {i}: value = {k * i}" for k in range(size)))
        )
    return results


def _log(session) -> bytes:
    return session.store.path(session.id).read_bytes()


def test_the_prefix_repeats_the_previous_request_and_is_recorded(tmp_path):
    session = _kernel(tmp_path, Editor()).open_session()
    session.user("read the files")
    first = session.prepare_request()
    assert first.cache_prefix_tokens == 0 and first.cache_prefix_messages == 0
    session.commit_reply(Message.assistant("", [ToolCallBlock("c0", "read", {"path": "a.py"})]))
    session.tool_result("c0", "x = 1\n" * 200)
    second = session.prepare_request()
    # an append: the whole first request (header and its one message) is repeated
    assert second.cache_prefix_tokens == first.pressure.tokens
    assert second.cache_prefix_messages == len(first.messages) == 1
    recorded = [v.cache_prefix_tokens for _, v in views(session.events, StepStart)]
    assert recorded == [0, first.pressure.tokens]
    assert session.project()["cache"] == {"prefix_tokens": first.pressure.tokens, "turn": 1, "step": 2}


def test_an_edit_cuts_the_prefix_where_it_starts(tmp_path):
    editor = Editor()
    session = _kernel(tmp_path, editor, cache={"rule": "off"}).open_session()
    session.user("read the files")
    results = _steps(session, 4)
    before = session.prepare_request()
    editor.plan = lambda handle: handle.replace_tool_result(results[1], "[cleared]")
    session.commit_reply(Message.assistant("", [ToolCallBlock("c9", "read", {"path": "z.py"})]))
    session.tool_result("c9", "z = 0")
    after = session.prepare_request()
    assert isinstance(editor.outcomes[0], int)
    position = [n.seq for n in session.surface.nodes].index(editor.outcomes[0])
    header = session.request_header().tokens
    assert after.cache_prefix_messages == position
    assert after.cache_prefix_tokens == header + session.meter.nodes_tokens(session.surface.nodes[:position])
    assert after.cache_prefix_tokens < before.pressure.tokens


def test_the_prefix_after_a_restart_is_the_one_without(tmp_path):
    session = _kernel(tmp_path / "a", Editor()).open_session()
    session.user("read the files")
    _steps(session, 3)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    going_on = session.prepare_request()
    reopened = _kernel(tmp_path / "b", Editor()).open_session(session.id)
    assert reopened.prepare_request().cache_prefix_tokens == going_on.cache_prefix_tokens > 0


def _cached_session(tmp_path, **tables: Any):
    editor = Editor()
    session = _kernel(tmp_path, editor, **tables).open_session()
    session.user("read the files")
    results = _steps(session, 6)
    return session, editor, results


def test_a_small_clear_under_a_large_cached_prefix_waits_and_writes_nothing(tmp_path):
    session, editor, results = _cached_session(tmp_path)
    editor.plan = lambda handle: handle.replace_tool_result(results[0], "[cleared]")
    log = _log(session)
    session.prepare_request()
    (outcome,) = editor.outcomes
    assert isinstance(outcome, CacheWaitError) and not outcome.decision.edits
    assert outcome.decision.saving < outcome.decision.cost
    assert "waits" in str(outcome) and "editor" in str(outcome)
    # only the request's own step/start was written
    assert _log(session)[: len(log)] == log
    assert all(e.type != "compaction/prune" for e in session.events)


def test_a_clear_that_saves_more_than_it_rewrites_goes_ahead(tmp_path):
    session, editor, results = _cached_session(tmp_path)
    # the last result: nothing cached behind it but itself, and it is gone
    editor.plan = lambda handle: handle.replace_tool_result(results[-1], "[cleared]")
    session.prepare_request()
    assert isinstance(editor.outcomes[0], int)


def test_clearing_many_results_at_once_pays_where_one_does_not(tmp_path):
    session, editor, results = _cached_session(tmp_path)
    nodes = session.surface.nodes
    first, last = nodes[0].seq, nodes[-1].seq

    def batch(handle):
        return handle.compact(Span(first, last, summary="the files were read; see history"), kind="clear")

    editor.plan = batch
    session.prepare_request()
    assert editor.outcomes[0].tokens_after < editor.outcomes[0].tokens_before


def test_a_summary_that_cannot_pay_waits_before_its_lock(tmp_path):
    session, editor, results = _cached_session(tmp_path)
    nodes = session.surface.nodes
    editor.plan = lambda handle: handle.compact(Span(nodes[0].seq, nodes[2].seq))  # the first call and result
    session.prepare_request()
    assert isinstance(editor.outcomes[0], CacheWaitError)
    assert all(e.type != "compaction/start" for e in session.events)  # no lock, no summary call


def test_an_overflow_always_wins_over_waiting(tmp_path):
    # the same small clear, with the next request within [cache] headroom_ratio of the window
    session, editor, results = _cached_session(tmp_path, cache={"headroom_ratio": 0.9})
    editor.plan = lambda handle: handle.replace_tool_result(results[0], "[cleared]")
    session.prepare_request()
    assert isinstance(editor.outcomes[0], int)


def test_an_expired_cache_costs_nothing_to_rewrite(tmp_path):
    clock = {"now": 1_000.0}
    with replay_clock(lambda: clock["now"], seed=1):
        session, editor, results = _cached_session(tmp_path)
        clock["now"] += 301  # past the 5-minute TTL since the last request
        editor.plan = lambda handle: handle.replace_tool_result(results[0], "[cleared]")
        session.prepare_request()
    assert isinstance(editor.outcomes[0], int)


@pytest.mark.parametrize("tables", [{"cache": {"rule": "off"}}, {"model": {**SONNET, "name": "no-price-model"}}])
def test_without_the_rule_or_a_price_every_edit_goes_ahead(tmp_path, tables):
    model = tables.pop("model", None)
    session, editor, results = _cached_session(tmp_path, model=model, **tables)
    editor.plan = lambda handle: handle.replace_tool_result(results[0], "[cleared]")
    session.prepare_request()
    assert isinstance(editor.outcomes[0], int)


def test_an_edit_outside_pre_step_is_not_judged(tmp_path):
    # a person's or a harness's edit (compact_now, a tool the model called) is asked for
    session, _, results = _cached_session(tmp_path)
    session.prepare_request()
    session.commit_reply(Message.assistant("done"))
    assert session.replace_tool_result(results[0], "[cleared]", strategy="editor") > 0


def test_an_edit_the_model_asked_for_is_not_judged(tmp_path):
    # the model called the strategy's own tool since the last request: the next step carries it out
    session, editor, results = _cached_session(tmp_path)
    session.prepare_request()
    session.commit_reply(Message.assistant("", [ToolCallBlock("t1", "tidy_up", {})]))
    session.tool_result("t1", session.run_tool(session.pending_calls[0]))
    editor.plan = lambda handle: handle.replace_tool_result(results[0], "[cleared]")
    session.prepare_request()
    assert isinstance(editor.outcomes[0], int)


def test_the_simulated_price_is_the_one_the_rule_uses(tmp_path):
    from ctxkernel.compaction import session_price
    from ctxkernel.pricing import price_for, priced_as

    session, _, _ = _cached_session(tmp_path)
    assert session_price(session).model == "claude-sonnet-4-5"
    with priced_as(price_for("gpt-5")):
        assert session_price(session).model == "gpt-5"


def test_to_anthropic_places_the_breakpoints_and_to_openai_the_cache_key(tmp_path):
    from ctxkernel.convert import count_cache_breakpoints, prompt_cache_key

    session = _kernel(tmp_path, Editor()).open_session()
    session.set_harness_tools(
        [{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}}]
    )
    session.user("read the files")
    _steps(session, 2)
    request = session.prepare_request()
    body = request.to_anthropic()
    assert body["system"] == [{"type": "text", "text": request.system, "cache_control": {"type": "ephemeral"}}]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    marked = [
        (i, j) for i, m in enumerate(body["messages"]) for j, b in enumerate(m["content"]) if b.get("cache_control")
    ]
    # the last message, and the last one the previous request held (the result before this step's)
    assert marked[-1] == (len(body["messages"]) - 1, len(body["messages"][-1]["content"]) - 1)
    assert len(marked) == 2 and count_cache_breakpoints(body) == 4
    chat = request.to_openai()
    assert chat["prompt_cache_key"] == prompt_cache_key(session.id)
    assert chat["messages"][0] == {"role": "system", "content": request.system}
    request.cache_hints = False
    assert isinstance(request.to_anthropic()["system"], str) and count_cache_breakpoints(request.to_anthropic()) == 0
    assert "prompt_cache_key" not in request.to_openai()


def test_a_breakpoint_never_lands_on_a_thinking_block():
    from ctxkernel.convert import mark_message_breakpoints

    parts = [
        ("user", [{"type": "text", "text": "q"}]),
        ("assistant", [{"type": "text", "text": "a"}, {"type": "thinking", "thinking": "t", "signature": "s"}]),
    ]
    marked = mark_message_breakpoints(parts, 1)
    assert marked[1][1][0]["cache_control"] == {"type": "ephemeral"} and "cache_control" not in marked[1][1][1]
    assert marked[0][1][0]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in parts[1][1][0]  # the caller's blocks are not changed


def test_a_strategy_can_weigh_an_edit_before_building_it(tmp_path):
    session, editor, results = _cached_session(tmp_path)
    seen = []
    editor.plan = lambda handle: seen.extend(
        [
            handle.weigh_edit(results[0], 100),
            handle.weigh_edit(results[-1], 10_000),
            handle.weigh_edit(results[0], 10**6),
        ]
    )
    session.prepare_request()
    small, last, huge = seen
    assert not small.edits and last.edits and huge.edits
    assert small.cost > last.cost  # more of the cached prefix lies behind the first result


def test_a_wait_a_strategy_does_not_catch_never_reaches_the_harness(tmp_path):
    class Careless(Editor):
        """Lets CacheWaitError out of its pre_step, as a strategy unaware of the rule would."""

        @ctxkernel.hookimpl
        def pre_step(self, ctx: Any, step: Any) -> None:
            if self.plan is not None:
                plan, self.plan = self.plan, None
                self.outcomes.append(plan(STRATEGY.on(ctx)))

    seen = []

    class Next:
        @ctxkernel.hookimpl
        def register_strategy(self, register: Any) -> None:
            register(ctxkernel.StrategySpec("next", settings=_Settings))

        @ctxkernel.hookimpl
        def pre_step(self, ctx: Any, step: Any) -> None:
            seen.append(step.step)

    careless = Careless()
    kernel = build_kernel(
        tmp_path,
        strategies=["editor", "next"],
        plugins=[("editor", careless), ("next", Next())],
        model=SONNET,
        instructions={"budget_ratio": 0},
        fsync=False,
    )
    session = kernel.open_session()
    session.user("read the files")
    results = _steps(session, 6)
    careless.plan = lambda handle: handle.replace_tool_result(results[0], "[cleared]")
    request = session.prepare_request()  # no CacheWaitError out of it
    assert careless.outcomes == [] and careless.plan is None  # its edit waited
    assert seen[-1] == request.step  # the strategy after it still ran
    assert all(e.type != "compaction/prune" for e in session.events)
