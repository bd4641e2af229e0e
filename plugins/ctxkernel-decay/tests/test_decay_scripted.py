"""A scripted model works through several hundred steps with large tool outputs and compresses
whenever a decay reminder appears. It never exceeds the effective window and no request holds an
orphan tool call or result. A turn of up to 25 steps outgrows the window on its own, and the
current turn is never compressed (seed §7): decay compresses the earlier turns, and the request
guard's ``basic`` summary is what keeps such a turn inside the window."""

from __future__ import annotations

import random

import pytest

from ctxkernel import Message, ScriptedModel, ToolCallBlock
from ctxkernel_decay import current_state, replay
from ctxkernel_decay.steward import actions

WINDOW, RESERVE = 26_000, 2_000


def assert_paired(messages: list[Message]) -> None:
    """Every tool call is answered right after its message; every result follows its call."""
    i = 0
    while i < len(messages):
        message = messages[i]
        assert message.role != "tool", f"orphan tool result at index {i}"
        calls = [c.id for c in message.tool_calls]
        i += 1
        answered = []
        while i < len(messages) and messages[i].role == "tool":
            answered.append(messages[i].tool_result.call_id)
            i += 1
        assert answered == calls, f"calls {calls} answered by {answered}"


def assert_decay_never_covered_the_open_turn(events) -> None:
    """Every message a decay compression replaced was appended before the instruction of the turn
    in which the compression ran."""
    instruction: dict[int, int] = {}  # turn -> seq of its user instruction
    turn = 0
    for e in events:
        if e.type == "turn/start":
            turn = e.data["turn"]
        elif e.type == "user/message" and e.surface["op"] == "append" and turn not in instruction:
            instruction[turn] = e.seq

    def leaves(seq: int) -> set[int]:
        op = events[seq].surface or {}
        return {seq} if op.get("op") == "append" else set().union(*(leaves(c) for c in op.get("cites", ())))

    running = None
    for e in events:
        if e.type == "compaction/start":
            running = e.data if e.data["strategy"] == "decay" else None
        elif e.type == "compaction/end":
            running = None
        elif running is not None and e.type == "user/message" and e.surface["op"] == "replace":
            covered = set().union(*(leaves(c) for c in e.surface["cites"]))
            assert max(covered) < instruction[running["turn"]], (running, sorted(covered))


@pytest.mark.slow
def test_several_hundred_steps_stay_inside_the_window(make_decay_kernel):
    kernel = make_decay_kernel(window=WINDOW, reserve=RESERVE, settings={"growth_tokens": 6_000, "cooldown_steps": 2})
    session = kernel.open_session()
    rng = random.Random(20261129)
    state = {"request": None, "n": 0}

    def script(messages, system, tools):
        calls = actions(session.context, state["request"])  # the model answers a reminder with compress
        state["n"] += 1
        n = state["n"]
        if calls:
            return Message.assistant(
                "Compressing old context.", [ToolCallBlock(f"z{n}", c["name"], c["arguments"]) for c in calls]
            )
        if rng.random() < 0.12:
            return Message.assistant(f"Finished part {n}.")
        k = rng.choice([1, 1, 2])
        return Message.assistant(
            rng.choice(["", f"Reading more ({n})."]),
            [ToolCallBlock(f"c{n}_{i}", "read", {"path": f"src/m{n}_{i}.py"}) for i in range(k)],
        )

    model = ScriptedModel(script, overflow_above=WINDOW - RESERVE)
    requests = 0
    peak = 0.0
    turn = 0
    while requests < 420:
        turn += 1
        session.user(f"Task {turn}: keep going through the code base.")
        for _ in range(25):
            request = session.prepare_request()
            state["request"] = request
            requests += 1
            peak = max(peak, request.pressure.ratio)
            assert request.pressure.tokens <= request.pressure.effective_window, request.pressure
            assert_paired(request.messages)
            reply = model.complete(request.messages, system=request.system, tools=request.tools)  # raises on overflow
            assert reply.usage["input_tokens"] == request.pressure.tokens  # the meter counts what was sent
            session.commit_reply(reply.message, usage=reply.usage)
            for call in session.pending_calls:
                if session.owns_tool(call.name):
                    outcome = session.run_tool(call)
                    assert not outcome.is_error, outcome.content
                    session.tool_result(call.id, outcome)
                else:
                    lines = rng.randint(40, 260)  # about 600 to 4,000 tokens
                    session.tool_result(
                        call.id, "\n".join(f"def f{j}(x): return x * {j}  # {call.id}" for j in range(lines))
                    )
            if not session.wants_another_step:
                break
        session.end_turn()
    starts = [e.data for e in session.events if e.type == "compaction/start"]
    assert sum(s["strategy"] == "decay" for s in starts) >= 10
    guard = [e for e in session.events if e.type == "compaction/summary" and e.data.get("strategy") == "basic"]
    assert [s for s in starts if s["strategy"] == "basic"], "no turn outgrew the window: the guard was not tested"
    assert all(e.data["reason"] == "overflow" for e in guard)  # only the request guard, never a threshold
    assert_decay_never_covered_the_open_turn(session.events)
    assert peak > 0.6, peak  # the run really was under pressure
    assert current_state(session.context).to_dict() == replay(session.events).to_dict()
    # old blocks were compressed again (the guard's later summaries of the head may hold them now)
    tiers = [
        span["tier"]
        for e in session.events
        if e.type == "compaction/summary" and e.data["strategy"] == "decay"
        for span in e.data["spans"]
    ]
    assert max(tiers) >= 2


def test_the_steward_summarises_what_the_request_showed(make_decay_kernel):
    """The steward writes its summary from the messages as the request showed them (decayed, by
    seq), never from the log's originals the model could no longer read."""
    from ctxkernel_decay.steward import plan_spans
    from ctxkernel_decay.strategy import settings_of

    kernel = make_decay_kernel(window=WINDOW, reserve=RESERVE, settings={"growth_tokens": 6_000, "cooldown_steps": 2})
    session = kernel.open_session()
    calls = None
    for turn in range(40):
        session.user(f"Task {turn}: read the module secret_{turn}.py and report.")
        request = session.prepare_request()
        calls = actions(session.context, request)
        if calls:
            break
        session.commit_reply(Message.assistant("", [ToolCallBlock(f"c{turn}", "read", {"path": f"m{turn}.py"})]))
        session.tool_result(f"c{turn}", "\n".join(f"def f{j}(x): return x * {j}" for j in range(220)))
        request = session.prepare_request()
        session.commit_reply(Message.assistant(f"Done with task {turn}."))
        session.end_turn()
    assert calls, "no decay reminder came"
    state, settings = current_state(session.context), settings_of(session.context)
    need = settings.growth_tokens // 2
    as_logged = plan_spans(session.context, state, settings, need)[0]["summary"]
    assert "secret_0.py" in as_logged
    shown = dict(zip(request.seqs, request.messages, strict=True))
    first_user = next(seq for seq, m in shown.items() if m.source.kind == "user")
    shown[first_user] = Message.user("Task 0: (shown decayed)")
    as_shown = plan_spans(session.context, state, settings, need, shown)[0]["summary"]
    assert "secret_0.py" not in as_shown and "(shown decayed)" in as_shown
