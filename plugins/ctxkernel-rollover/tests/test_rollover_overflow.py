"""Overflow: protective rollover without any model call, no deadlock; failures are loud."""

from __future__ import annotations

import pytest
from helpers_rollover import call, rollover_kernel, rollover_summaries, step

import ctxkernel
from ctxkernel import ContextOverflowError, Message, ScriptedModel
from ctxkernel_rollover.state import state_of


class SummarizeSpy:
    """A strategy whose summarize hook records every call (and would answer it)."""

    def __init__(self):
        self.calls = []

    @ctxkernel.hookimpl
    def register_strategy(self, register):
        register(ctxkernel.StrategySpec("spy"))

    @ctxkernel.hookimpl(tryfirst=True)
    def summarize(self, ctx, region):
        self.calls.append(region)
        return ctxkernel.Summary("a summary that must never be asked for")


@pytest.fixture
def spied(tmp_path):
    spy = SummarizeSpy()
    kernel = rollover_kernel(
        tmp_path, window=12_000, reserve=1_000, plugins=[("spy", spy)], strategies=["rollover", "spy"]
    )
    summarizer = ScriptedModel(lambda *a: "never")
    kernel.summarizer = summarizer
    return kernel, spy, summarizer


def run_with_retries(session, model, harness_output, attempts=5):
    """One turn of a harness that retries when request_failed says so."""
    errors = []
    while True:
        for attempt in range(attempts):
            request = session.prepare_request(attempt=attempt)
            try:
                reply = model.complete(request.messages, system=request.system, tools=request.tools)
            except ContextOverflowError as exc:
                errors.append(exc)
                if session.request_failed(exc):
                    continue
                session.end_turn("error")
                return errors, False
            break
        session.commit_reply(reply.message, usage=reply.usage)
        for c in session.pending_calls:
            session.tool_result(c.id, session.run_tool(c) if session.owns_tool(c.name) else harness_output)
        if not session.wants_another_step:
            session.end_turn()
            return errors, True


def test_provider_overflow_rolls_over_without_any_model_call(spied):
    kernel, spy, summarizer = spied
    session = kernel.open_session()
    count = {"n": 0}

    def script(messages, system, tools):
        count["n"] += 1
        if count["n"] == 1:
            return Message.assistant("", [call("g", "note_create", path="goal", content="KEEP-ME")])
        if count["n"] > 12:
            return Message.assistant("done")
        return Message.assistant("", [call(f"r{count['n']}", "read_file", path="x")])

    # the provider's real limit is below what the profile says: only an overflow reveals it
    model = ScriptedModel(script, overflow_above=6_000)
    session.user("work")
    errors, finished = run_with_retries(session, model, "data line\n" * 300)
    assert finished and errors
    summaries = rollover_summaries(session)
    assert summaries and summaries[0]["trigger"] == "overflow"
    seed = next(e for e in session.events if e.type == "user/message" and e.data.get("compaction_id")).data["message"][
        "content"
    ][0]["text"]
    assert "The provider refused the request" in seed and "KEEP-ME" in seed
    assert spy.calls == [] and summarizer.calls == []
    assert all(e.data.get("summary") == "" for e in session.events if e.type == "compaction/summary")


def test_oversized_tool_result_triggers_a_protective_rollover(spied):
    kernel, spy, summarizer = spied
    session = kernel.open_session()
    session.user("dump the log")
    model = ScriptedModel(
        [
            Message.assistant("", [call("g", "note_create", path="goal", content="find the crash")]),
            Message.assistant("", [call("big", "cat", path="huge.log")]),
            Message.assistant("I will read it in parts"),
        ]
    )
    step(session, model)
    step(session, model, harness=lambda c: "x" * 60_000)  # about 7,500 tokens, over half the window
    request = session.prepare_request()
    assert request.pressure.tokens <= request.pressure.effective_window
    summaries = rollover_summaries(session)
    assert [s["trigger"] for s in summaries] == ["overflow"]
    seed = request.messages[0].text
    big_seq = next(
        e.seq
        for e in session.events
        if e.type == "tool/result" and "xxxx" in e.data["message"]["content"][0]["content"]
    )
    assert f"item_{big_seq}" in seed and "history_read" in seed and "find the crash" in seed
    assert spy.calls == [] and summarizer.calls == []


def test_overflow_that_cannot_be_relieved_gives_up_instead_of_looping(spied):
    kernel, spy, summarizer = spied
    session = kernel.open_session()
    model = ScriptedModel(lambda *a: Message.assistant("never reached"), overflow_above=50)  # below the header
    session.user("hello")
    errors, finished = run_with_retries(session, model, "", attempts=10)
    assert not finished
    assert 1 <= len(errors) <= 3  # a protective rollover was tried, then the error went to the harness
    assert spy.calls == [] and summarizer.calls == []


def test_a_rollover_that_cannot_be_done_fails_loud_and_leaves_the_surface(spied):
    kernel, spy, summarizer = spied
    session = kernel.open_session()
    session.user("go")
    step(session, ScriptedModel([Message.assistant("", [call("n", "new_context", next_goal="next")])]))
    session.end_turn()
    # another live writer holds the compaction lock (and its lease): the switch must fail, not summarise
    holder = {"host": "elsewhere", "pid": 1, "started": "2026-01-01T00:00:00Z", "token": "other"}
    assert session.kernel.store.lease_acquire(f"compaction/{session.id}", holder, 600).acquired
    session.append_one("compaction/start", {"compaction_id": "other", "strategy": "someone", "holder": holder})
    session.user("continue")
    visible = [n.seq for n in session.surface.nodes]
    request = session.prepare_request()
    assert not rollover_summaries(session)
    failed = [e for e in session.events if e.type == "rollover/failed"]
    assert len(failed) == 1 and "CompactionBusyError" in failed[0].data["error"]
    assert [n.seq for n in session.surface.nodes][: len(visible)] == visible  # unchanged, plus the notice
    assert "[rollover]" in request.messages[-1].text and "nothing was summarised" in request.messages[-1].text
    assert spy.calls == [] and summarizer.calls == []
    assert state_of(session.context).pending is None  # the failed intent is not retried forever


def test_each_new_overflow_gets_its_own_protective_rollover(spied):
    kernel, spy, summarizer = spied
    session = kernel.open_session()
    count = {"n": 0}

    def script(messages, system, tools):
        count["n"] += 1
        return (
            Message.assistant("", [call(f"r{count['n']}", "read_file", path="x")])
            if count["n"] < 40
            else Message.assistant("done")
        )

    model = ScriptedModel(script, overflow_above=4_000)  # far below the profile's window: many overflows
    session.user("work")
    errors, finished = run_with_retries(session, model, "data line\n" * 300)
    assert finished and len(errors) >= 3
    assert sum(s["trigger"] == "overflow" for s in rollover_summaries(session)) == len(errors)
    assert spy.calls == [] and summarizer.calls == []


def test_the_overflow_retry_streak_survives_a_restart(tmp_path):
    """Seed 002 §3.6: the retry counter is folded from the log, not kept in one process's memory,
    so a restarted harness does not get a fresh retry budget for the same overflow."""
    kernel = rollover_kernel(tmp_path, window=12_000, reserve=1_000)
    session = kernel.open_session()
    for turn in range(6):
        # the bulk is the model's own output: the user's instructions (which the kernel keeps
        # verbatim through a switch, within their budget) stay small
        session.user(f"turn {turn}: read the parser")
        step(session, ScriptedModel([Message.assistant("read the parser " * 80)]))
        session.end_turn()
    session.user("one more")
    session.prepare_request()
    overflow = ContextOverflowError("prompt is too long", prompt_tokens=13_000, limit=11_000)
    assert session.request_failed(overflow) is True  # a protective switch, then a retry
    assert [s["trigger"] for s in rollover_summaries(session)] == ["overflow"]

    restarted = rollover_kernel(tmp_path, window=12_000, reserve=1_000).open_session(session.id)
    assert state_of(restarted.context).overflow_streak == 1
    restarted.prepare_request()
    assert restarted.request_failed(overflow) is False  # the fresh seed itself does not fit: fail loud
    assert [s["trigger"] for s in rollover_summaries(restarted)] == ["overflow"]  # no second switch
    assert not [e for e in restarted.events if e.type == "rollover/failed"]
    gave_up = [e.data for e in restarted.events if e.type == "rollover/overflow"]
    assert gave_up == [{"gave_up": True, "attempts": 1}]
    assert state_of(restarted.context).overflow_streak == 0  # the next overflow starts over
