"""Automatic rollover: one reminder per window, a switch at the threshold, a long session."""

from __future__ import annotations

from helpers_rollover import call, rollover_kernel, rollover_summaries

from ctxkernel import Message, ScriptedModel
from ctxkernel.recall.notes import Notes
from ctxkernel_rollover.state import state_of

FILE = "def f(x):\n    return x * 2  # a line of code\n" * 40  # about 600 tokens


def reminders(session):
    return [e for e in session.events if e.type == "user/message" and "rollover_reminder" in e.data]


def run_turn(session, model, *, max_steps=50, requests=None):
    for _ in range(max_steps):
        request = session.prepare_request()
        if requests is not None:
            requests.append(request)
        reply = model.complete(request.messages, system=request.system, tools=request.tools)
        session.commit_reply(reply.message, usage=reply.usage)
        for c in session.pending_calls:
            session.tool_result(c.id, session.run_tool(c) if session.owns_tool(c.name) else FILE)
        if not session.wants_another_step:
            break
    session.end_turn()


def reader(stop_after):
    """A model that reads files and never manages its context (the automatic path must)."""
    count = {"n": 0}

    def script(messages, system, tools):
        count["n"] += 1
        if count["n"] >= stop_after:
            return Message.assistant("done")
        return Message.assistant("reading", [call(f"r{count['n']}", "read_file", path=f"f{count['n']}.py")])

    return script


def test_one_reminder_per_window_then_automatic_rollover(tmp_path):
    kernel = rollover_kernel(tmp_path, window=12_000, reserve=1_000)
    session = kernel.open_session()
    session.user("read everything")
    run_turn(session, ScriptedModel(reader(60)))
    summaries = rollover_summaries(session)
    assert len(summaries) >= 2
    assert {s["trigger"] for s in summaries} == {"auto"}
    windows = state_of(session.context).chain
    by_window = [e.data["rollover_reminder"] for e in reminders(session)]
    assert len(by_window) == len(set(by_window))  # never two reminders in one window
    assert set(by_window) <= set(windows)
    assert set(windows[:-1]) <= set(by_window)  # each full window was reminded before it rolled over
    # the reminder came before the switch of its window, and after it the window restarts low
    for s in summaries:
        assert s["tokens_after"] < s["tokens_before"]


def test_reminder_is_not_repeated_after_a_restart(tmp_path):
    kernel = rollover_kernel(tmp_path, window=12_000, reserve=1_000)
    session = kernel.open_session()
    session.user("read")
    read = reader(100)

    def until_reminded(messages, system, tools):
        return (
            Message.assistant("stopping")
            if "<rollover-reminder" in messages[-1].text
            else read(messages, system, tools)
        )

    run_turn(session, ScriptedModel(until_reminded))
    assert len(reminders(session)) == 1 and not rollover_summaries(session)
    reopened = rollover_kernel(tmp_path, window=12_000, reserve=1_000).open_session(session.id)
    reopened.user("more")
    run_turn(reopened, ScriptedModel([Message.assistant("ok")]))
    assert len(reminders(reopened)) == 1


def steward_model():
    """A model that keeps notes and calls new_context when reminded, but sometimes ignores the
    reminder so the automatic path runs too."""
    count = {"n": 0, "reminders": 0}

    def script(messages, system, tools):
        count["n"] += 1
        n = count["n"]
        if n == 1:
            return Message.assistant(
                "noting the goal",
                [
                    call("g", "note_create", path="goal", content="GOAL-FROM-WINDOW-1: port the parser to rust"),
                    call("h", "note_create", path="decisions", content="keep the public API"),
                ],
            )
        last = messages[-1].text
        if "<rollover-reminder" in last:
            count["reminders"] += 1
            if count["reminders"] % 2:
                return Message.assistant(
                    "saving and rolling over",
                    [
                        call(f"p{n}", "note_append", path="progress", text=f"\nstep {n} done"),
                        call(f"nc{n}", "new_context", next_goal="continue porting"),
                    ],
                )
        if n >= 400:
            return Message.assistant("finished")
        return Message.assistant("reading", [call(f"r{n}", "read_file", path=f"f{n}.py")])

    return script


def test_long_session_five_rollovers_never_exceeds_the_window_and_keeps_window_1_notes(tmp_path):
    kernel = rollover_kernel(tmp_path, window=12_000, reserve=1_000)
    effective = 11_000
    summarizer_calls = []
    kernel.summarizer = ScriptedModel(lambda *a: summarizer_calls.append(a) or "never")
    model = ScriptedModel(steward_model(), overflow_above=effective)
    session = kernel.open_session()
    requests = []
    turn = 0
    while len(rollover_summaries(session)) < 7 and turn < 40:
        session.user(f"turn {turn}: keep porting")
        run_turn(session, model, max_steps=12, requests=requests)
        turn += 1
    summaries = rollover_summaries(session)
    assert len(summaries) >= 5
    assert {"manual", "auto"} <= {s["trigger"] for s in summaries}
    assert max(r.pressure.tokens for r in requests) <= effective
    assert max(c["prompt_tokens"] for c in model.calls) <= effective  # the model's own count agrees
    state = state_of(session.context)
    assert state.number >= 6
    # notes written in window 1 are still visible in window 5 and later
    window_5_seed = next(
        e
        for e in session.events
        if e.type == "user/message"
        and e.data.get("compaction_id")
        and state.chain[4] in e.data["message"]["content"][0]["text"][:400]
    )
    assert "GOAL-FROM-WINDOW-1" in window_5_seed.data["message"]["content"][0]["text"]
    goal = Notes.for_session(session).read("goal")
    assert goal.created_window == state.chain[0]
    assert "GOAL-FROM-WINDOW-1" in session.surface.nodes[0].message.text
    assert not summarizer_calls
    assert all(s["summary"] == "" for s in summaries)
