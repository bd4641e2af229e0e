"""One switch, four entry points (Part 1)."""

from __future__ import annotations

import re

import ctxkernel_handoff
from ctxkernel import ContextOverflowError, Message, ScriptedModel, ToolCallBlock
from ctxkernel.recall.history import History
from ctxkernel.recall.notes import Notes
from ctxkernel_handoff.engine import REMINDER_TAG, state_for


def window_events(session):
    return [e for e in session.events if e.type == "compaction/summary" and e.data.get("kind") == "window"]


def fill(agent_obj, turns: int) -> None:
    for t in range(turns):
        agent_obj.turn(f"instruction {t}: keep going with part {t} " + "detail " * 20)


def test_pressure_switch_keeps_the_retained_tail_verbatim(handoff_kernel, agent, paired):
    kernel = handoff_kernel()
    session = kernel.open_session()
    a = agent(session)
    fill(a, 12)
    switches = window_events(session)
    assert switches, "the threshold was crossed, so the window must have switched"
    first = switches[0]
    assert first.data["reason"] == "threshold" and first.data["window"] == 2
    # the replacement is the handoff, and what follows it on the surface was never rewritten
    handoff_seq = first.seq + 1
    assert session.events[handoff_seq].data["message"]["source"] == {
        "kind": "plugin",
        "plugin": "handoff",
        "form": "handoff",
    }
    effective = session.pressure().effective_window
    cited = set(first.data["cites"])
    kept_after = [
        e
        for e in session.events[: first.seq]
        if e.type in ("user/message", "assistant/message", "tool/result") and e.seq not in cited
    ]
    assert kept_after, "the pressure switch keeps a verbatim tail"
    # the tail is at least the retain share (16% of the window), measured as the transaction saw it
    kept_tokens = sum(
        session.meter.count_message(Message.from_dict(e.data["message"]))
        for e in kept_after
        if e.surface == {"op": "append"}
    )
    assert kept_tokens >= 0.16 * effective * 0.5
    assert paired(session)
    assert History.for_session(session).current_window.number == len(switches) + 1


def test_new_context_in_a_mixed_batch_switches_after_every_result(handoff_kernel, agent, paired):
    kernel = handoff_kernel(window=60_000)
    session = kernel.open_session()
    steps = iter(
        [
            Message.assistant("reading", [ToolCallBlock("r1", "read", {"path": "a.py"})]),
            Message.assistant("done reading"),
            Message.assistant(
                "switching",
                [
                    ToolCallBlock("b1", "read", {"path": "b.py"}),
                    ToolCallBlock("nc", "new_context", {"reason": "phase done"}),
                    ToolCallBlock(
                        "b2", "notes_write_file", {"path": "self/notes/plan.md", "content": "next: write tests"}
                    ),
                    ToolCallBlock("b3", "read", {"path": "c.py"}),
                ],
            ),
            Message.assistant("continuing in the new window"),
        ]
    )
    a = agent(session, lambda m, s, t: next(steps))
    a.turn("read a.py " + "context " * 400)
    session.user("now switch windows please")
    request = session.prepare_request()
    reply = a.model.complete(request.messages, system=request.system, tools=request.tools)
    session.commit_reply(reply.message, usage=reply.usage)
    outcomes = {}
    for call in session.pending_calls:
        outcome = session.run_tool(call) if session.owns_tool(call.name) else "file body\n" * 300
        outcomes[call.id] = outcome
        session.tool_result(call.id, outcome)
        # nothing switched while results of the batch were still being committed
        assert not window_events(session)
    assert outcomes["nc"].content.startswith("requested")
    assert not window_events(session)
    request = session.prepare_request()  # the next safe step boundary
    switches = window_events(session)
    assert len(switches) == 1 and switches[0].data["reason"] == "requested"
    last_result = max(e.seq for e in session.events if e.type == "tool/result" and e.seq < switches[0].seq)
    assert switches[0].seq > last_result
    assert paired(session)
    # only the last message survives: the batch's assistant message with all its results
    roles = [m.role for m in request.messages]
    assert roles[0] == "user" and request.messages[0].source.form == "handoff"
    assert roles[1:] == ["assistant", "tool", "tool", "tool", "tool"]
    assert [m.tool_result.call_id for m in request.messages[2:]] == ["b1", "nc", "b2", "b3"]


def test_new_context_is_honoured_with_automatic_compaction_off(handoff_kernel, agent):
    kernel = handoff_kernel(window=100_000, basic={"auto": False})
    session = kernel.open_session()
    a = agent(session)
    fill(a, 3)
    assert not window_events(session)
    assert ctxkernel_handoff.request_new_context(session.context, "tidy up").startswith("requested")
    session.user("continue")
    session.prepare_request()
    assert [e.data["reason"] for e in window_events(session)] == ["requested"]


def test_compact_now_keeps_only_the_last_message(handoff_kernel, agent, paired):
    kernel = handoff_kernel(window=100_000)
    session = kernel.open_session()
    a = agent(session)
    fill(a, 4)
    last = session.surface.nodes[-1]
    outcome = ctxkernel_handoff.compact_now(session.context)
    assert outcome.committed and outcome.window == 2 and outcome.reason == "manual"
    nodes = session.surface.nodes
    assert len(nodes) == 2 and nodes[1] is last and nodes[0].message.source.form == "handoff"
    assert paired(session)


def test_nothing_to_compact_never_reports_a_switch(handoff_kernel):
    kernel = handoff_kernel()
    session = kernel.open_session()
    session.user("hello")
    before = len(session.events)
    outcome = ctxkernel_handoff.compact_now(session.context)
    assert not outcome.committed and outcome.window is None and "nothing to compact" in outcome.detail
    assert len(session.events) == before
    assert History.for_session(session).current_window.number == 1


def test_a_failed_switch_does_not_advance_the_window_and_tells_the_model(handoff_kernel, agent):
    kernel = handoff_kernel(window=100_000)
    session = kernel.open_session()
    a = agent(session)
    fill(a, 3)
    # another live writer's compaction is open (it holds the session's compaction lease): the
    # transaction must refuse, and nothing switches
    holder = {"host": "elsewhere", "pid": 1, "started": "2026-01-01T00:00:00Z", "token": "other"}
    assert session.kernel.store.lease_acquire(f"compaction/{session.id}", holder, 600).acquired
    session.append_one("compaction/start", {"compaction_id": "other", "strategy": "someone", "holder": holder})
    ctxkernel_handoff.request_new_context(session.context, "try")
    session.user("go on")
    request = session.prepare_request()
    assert not window_events(session)
    assert History.for_session(session).current_window.number == 1
    notice = request.messages[-1]
    assert notice.source.plugin == "handoff" and "did not happen" in notice.text and "win_1" in notice.text
    assert state_for(session.context).requested is None  # not retried forever


def test_overflow_switches_keeping_the_last_message_then_gives_up_once(handoff_kernel, agent):
    kernel = handoff_kernel(window=100_000)
    session = kernel.open_session()
    a = agent(session)
    fill(a, 4)
    session.user("one more " * 50)
    session.prepare_request()
    assert session.request_failed(ContextOverflowError("too long", prompt_tokens=99_999, limit=90_000)) is True
    switches = window_events(session)
    assert [e.data["reason"] for e in switches] == ["overflow"]
    assert session.surface.nodes[-1].message.text.startswith("one more")
    assert len(session.surface.nodes) == 2
    # the retry overflows again before any reply: one retry per overflow, then give up
    session.prepare_request()
    assert session.request_failed(ContextOverflowError("still too long")) is False
    assert len(window_events(session)) == 1


def test_overflow_from_the_scripted_provider_is_recovered(handoff_kernel, agent):
    kernel = handoff_kernel(window=200_000, basic={"auto": False})
    session = kernel.open_session()
    model = ScriptedModel(lambda m, s, t: Message.assistant("ok " * 5), overflow_above=6_000)
    # the provider's real window, which the user's instruction budget is a share of (the profile
    # says 200,000: a budget of that size would keep more instructions than this provider takes)
    session.set_route(session.model_settings().provider, session.model_settings().name, context_window=12_000)
    session.user("big " * 3000)
    retried = False
    for _ in range(3):
        request = session.prepare_request()
        try:
            reply = model.complete(request.messages, system=request.system, tools=request.tools)
        except ContextOverflowError as exc:
            assert session.request_failed(exc) is not True or not retried
            retried = True
            continue
        session.commit_reply(reply.message, usage=reply.usage)
        break
    session.end_turn()
    for i in range(6):
        session.user(f"part {i} " + "words " * 600)
        request = session.prepare_request()
        try:
            reply = model.complete(request.messages, system=request.system, tools=request.tools)
        except ContextOverflowError as exc:
            assert session.request_failed(exc) is True
            request = session.prepare_request()
            reply = model.complete(request.messages, system=request.system, tools=request.tools)
        session.commit_reply(reply.message, usage=reply.usage)
        session.end_turn()
    assert any(e.data["reason"] == "overflow" for e in window_events(session))


def test_an_unfinished_request_is_not_re_executed_after_a_restart(handoff_kernel, agent):
    kernel = handoff_kernel(window=100_000)
    session = kernel.open_session()
    fill(agent(session), 3)
    ctxkernel_handoff.request_new_context(session.context, "later")
    again = handoff_kernel(window=100_000).open_session(session.id)
    again.user("continue")
    again.prepare_request()
    assert not window_events(again)


def test_restart_replays_windows_and_notes_exactly(handoff_kernel, agent, tmp_path):
    kernel = handoff_kernel()
    session = kernel.open_session()
    a = agent(session)
    for t in range(16):
        a.turn(f"instruction {t} " + "detail " * 20)
        Notes.for_session(session).write(f"log/{t}.md", f"note {t}")
    windows = History.for_session(session).list_windows(limit=50)
    notes = [(n.path, n.content, n.version, n.window) for n in Notes.for_session(session).active()]
    assert windows["current_window"] >= 2
    reopened = handoff_kernel().open_session(session.id)
    assert History.for_session(reopened).list_windows(limit=50) == windows
    assert [(n.path, n.content, n.version, n.window) for n in Notes.for_session(reopened).active()] == notes
    assert [n.seq for n in reopened.surface] == [n.seq for n in session.surface]


def test_handoff_notes_are_written_after_each_committed_switch(handoff_kernel, agent):
    kernel = handoff_kernel()
    session = kernel.open_session()
    fill(agent(session), 24)
    switches = window_events(session)
    assert len(switches) >= 2
    notes = Notes.for_session(session)
    handoff = notes.read("handoff.md")
    latest = session.events[switches[-1].seq + 1].data["message"]["content"][0]["text"]
    assert handoff.content == latest  # extractive: the full handoff itself
    log_lines = notes.read("handoff-log.md").content.splitlines()
    assert len(log_lines) == len(switches)
    assert log_lines[-1].startswith(f"- win_{len(switches) + 1} ") and f"win_{len(switches)}_summary" in log_lines[-1]
    # neither note is injected into the next handoff
    assert "handoff-log.md" not in latest and 'path="handoff.md"' not in latest


def test_the_pressure_reminder_is_single_shot_per_window(handoff_kernel, agent):
    kernel = handoff_kernel(window=30_000, basic={"threshold_ratio": 0.9})
    session = kernel.open_session()
    a = agent(session)
    reminders = []
    for t in range(25):
        a.turn(f"instruction {t} " + "detail " * 20)
        reminders = [e for e in session.events if e.type == "user/message" and REMINDER_TAG in str(e.data)]
        if window_events(session):
            break
    assert reminders, "the reminder shows before the threshold switch"
    history = History.for_session(session)
    by_window = [history.window_of(e.seq) for e in reminders]
    assert len(by_window) == len(set(by_window))
    assert "notes_write_file" in reminders[0].data["message"]["content"][0]["text"]
    # after a restart the reminder is not shown again in the same window
    reopened = handoff_kernel(window=30_000, basic={"threshold_ratio": 0.9}).open_session(session.id)
    assert state_for(reopened.context).reminded_window == state_for(session.context).reminded_window


def test_steward_writes_a_note_and_requests_a_switch_when_reminded(handoff_kernel, agent):
    kernel = handoff_kernel(window=30_000, basic={"threshold_ratio": 0.9})
    session = kernel.open_session()
    a = agent(session)
    calls = []
    for t in range(80):
        session.user(f"instruction {t} " + "detail " * 20)
        request = session.prepare_request()
        calls = kernel.hooks.steward_actions(session, request)
        if calls:
            break
        reply = a.model.complete(request.messages, system=request.system, tools=request.tools)
        session.commit_reply(reply.message, usage=reply.usage)
        for call in session.pending_calls:
            session.tool_result(call.id, "line of code\n" * 150)
        session.end_turn()
    assert [c["name"] for c in calls] == ["notes_write_file", "new_context"]
    # once per window
    assert kernel.hooks.steward_actions(session, request) == []


def test_a_cancelled_summary_call_ends_the_transaction_without_a_switch(handoff_kernel, agent):
    kernel = handoff_kernel(window=100_000, handoff={"handoff_summary": "generated"})
    session = kernel.open_session()
    fill(agent(session), 4)

    def interrupted(messages, system, tools):
        raise KeyboardInterrupt

    kernel.summarizer = ScriptedModel(interrupted)
    try:
        ctxkernel_handoff.compact_now(session.context)
    except KeyboardInterrupt:
        pass
    else:  # pragma: no cover - the interrupt must reach the caller
        raise AssertionError("the cancellation was swallowed")
    ends = [e for e in session.events if e.type == "compaction/end"]
    assert ends and "KeyboardInterrupt" in ends[-1].data["error"]
    assert not window_events(session) and History.for_session(session).current_window.number == 1
    assert session.open_compaction is None
    # the next attempt works and calls the summarizer exactly once
    kernel.summarizer = ScriptedModel(["## Current Work\nstill going"])
    assert ctxkernel_handoff.compact_now(session.context).committed
    assert len(kernel.summarizer.calls) == 1


def test_generated_pressure_switches_call_the_summarizer_once_each(handoff_kernel, agent):
    kernel = handoff_kernel(handoff={"handoff_summary": "generated"})
    summarizer = ScriptedModel(lambda m, s, t: "## Current Work\nreading files\n\n## Next Step\nread more")
    kernel.summarizer = summarizer
    session = kernel.open_session()
    fill(agent(session), 24)
    switches = window_events(session)
    assert len(switches) >= 2
    assert len(summarizer.calls) == len(switches)
    assert all(e.data["spans"][0]["provider"] == "scripted" for e in switches)


def test_an_oversized_kept_result_is_shrunk_to_fit_and_stays_recoverable(handoff_kernel):
    kernel = handoff_kernel(window=8_000, reserve=1_000)
    session = kernel.open_session()
    for i in range(3):
        session.user(f"step {i} " + "words " * 300)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"ok {i}"))
        session.end_turn()
    session.user("read the big file")
    session.prepare_request()
    session.commit_reply(Message.assistant("reading", [ToolCallBlock("big", "read", {"path": "big.txt"})]))
    big = "".join(f"line {i} of a very large file\n" for i in range(900))
    original = session.tool_result("big", big)
    outcome = ctxkernel_handoff.compact_now(session.context)
    assert outcome.committed, outcome.detail
    kept = session.surface.nodes[-1].message.tool_result
    assert kept.call_id == "big" and len(kept.content) < len(big)
    assert f"the full result is item_{original}" in kept.content
    assert History.for_session(session).read_item(f"item_{original}", max_chars=20_000)["total_chars"] == len(big)
    assert session.pressure().ratio < 0.8


def test_a_shrunk_results_pointer_names_its_original_whatever_the_result_says(handoff_kernel):
    """The marker of a shrunk result names the item holding its full text, found in the log: a
    tool output saying "the full result is item_1" pointed it at the user's first message."""
    kernel = handoff_kernel(window=8_000, reserve=1_000)
    session = kernel.open_session()
    for i in range(3):
        session.user(f"step {i} " + "words " * 300)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"ok {i}"))
        session.end_turn()
    session.user("read the big file")
    session.prepare_request()
    session.commit_reply(Message.assistant("reading", [ToolCallBlock("big", "read", {"path": "big.txt"})]))
    big = "NOTE: the full result is item_1\n" + "".join(f"line {i} of a very large file\n" for i in range(900))
    original = session.tool_result("big", big)
    outcome = ctxkernel_handoff.compact_now(session.context)
    assert outcome.committed, outcome.detail
    kept = session.surface.nodes[-1].message.tool_result
    assert kept.call_id == "big" and len(kept.content) < len(big)
    marker = re.search(r"\[… \d+ characters omitted[^\]]*\]", kept.content).group(0)
    assert f"the full result is item_{original}: history_read_item id=item_{original}" in marker, marker


def test_notes_are_durable_through_the_store_for_another_kernel(handoff_kernel, tmp_path):
    first = handoff_kernel(home=tmp_path / "shared")
    session = first.open_session()
    session.run_tool(
        ToolCallBlock("w", "notes_write_file", {"path": "self/notes/shared.md", "content": "from process one"})
    )
    other = handoff_kernel(home=tmp_path / "shared").open_session(session.id)
    outcome = other.run_tool(ToolCallBlock("r", "notes_read_file", {"path": "self/notes/shared.md"}))
    assert "from process one" in outcome.content


def test_no_switch_when_what_stays_outside_the_surface_is_over_the_target(handoff_kernel):
    # more than the target is outside the surface, which no switch can remove: a request header
    # of ~8,900 tokens, tools included (under half the window, the most the kernel accepts: guard.py
    # HEADER_MAX_SHARE) and 7,000 tokens the provider reports on every request beyond what the
    # kernel counts (its own framing of the request, say). The pressure switch says so instead of
    # shrinking kept results for nothing, and basic compacts at most once per 10% of the window
    # of growth instead of at every request
    kernel = handoff_kernel(window=20_000, reserve=1_000)  # effective 19,000: threshold 15,200, target 14,250
    kernel.profile.profile.system_prompt = "alpha " * 7_500
    session = kernel.open_session()
    big = "".join(f"line {i} of a large file\n" for i in range(400))

    def reported(request, reply):
        counted = session.meter.count_header(request.system, request.tools) + sum(
            session.meter.count_message(m) for m in request.messages
        )
        return {"prompt_tokens": counted + 7_000, "completion_tokens": session.meter.count_message(reply)}

    for n in range(40):
        session.user(f"request {n}: " + " ".join(f"word{n}_{i}" for i in range(30)))
        request = session.prepare_request()
        if n % 10 == 0:
            reply = Message.assistant("reading", [ToolCallBlock(f"r{n}", "read", {"path": "f.txt"})])
            session.commit_reply(reply, usage=reported(request, reply))
            session.tool_result(f"r{n}", big)
            request = session.prepare_request()
        reply = Message.assistant(f"answer {n}: " + " ".join(f"fact{n}_{i}" for i in range(30)))
        session.commit_reply(reply, usage=reported(request, reply))
        session.end_turn()
    assert session.pressure().ratio >= 0.8
    assert "no room for a new window" in state_for(session.context).last_failure
    assert "provider-reported usage" in state_for(session.context).last_failure
    assert not window_events(session)
    # nor is the model asked for a switch that can only be refused (notes and new_context calls
    # would cost tokens in a window that has none to spare)
    assert not [e for e in session.events if e.type == "user/message" and REMINDER_TAG in str(e.data)]
    assert not [e for e in session.events if e.data.get("strategy") == "handoff" and e.data.get("reason") == "fit"]
    native = [e for e in session.events if e.type == "compaction/summary" and e.data.get("strategy") == "basic"]
    assert 1 <= len(native) <= 10, len(native)


def test_a_failed_overflow_switch_that_shrank_kept_results_asks_for_a_retry(handoff_kernel):
    """On an overflow the switch first shrinks the kept tool result model-free to make room; when
    the switch then fails (one user message is too little to replace with a handoff), that shrink
    already made the request fit: handoff asks for the retry itself, so the kernel's last-resort
    excerpt (1/16 of the window) does not cut the result further."""
    session = handoff_kernel(window=4_000, reserve=500, strategies=["handoff"]).open_session()
    session.user("read the log")
    session.prepare_request()
    session.commit_reply(Message.assistant("", [ToolCallBlock("c1", "read", {"path": "app.log"})]))
    session.tool_result("c1", "".join(f"line {i} of the log\n" for i in range(200)))
    tokens = session.prepare_request().pressure.tokens
    assert session.request_failed(ContextOverflowError("too long", prompt_tokens=tokens + 500, limit=3_500))
    assert not [e for e in session.events if e.type == "compaction/start"]  # no kernel excerpt
    assert not window_events(session)
    result = session.surface.nodes[-1].message.tool_result.content
    assert result.startswith("line 0 of the log") and "history_read_item" in result
    assert session.pressure().tokens < 3_500


def test_the_steward_note_quotes_only_the_request_within_its_cap(handoff_kernel, agent):
    """What the steward writes comes from the request it was shown, each quote at most
    STEWARD_QUOTE_CHARS (a model's notes are short); nothing from the log the model cannot see."""
    import dataclasses

    from ctxkernel_handoff.plugin import STEWARD_QUOTE_CHARS

    kernel = handoff_kernel(window=30_000, basic={"threshold_ratio": 0.9})
    session = kernel.open_session()
    a = agent(session)
    calls = []
    for t in range(80):
        session.user(f"instruction {t} " + "detail " * 200)
        request = session.prepare_request()
        calls = kernel.hooks.steward_actions(session, request)
        if calls:
            break
        reply = a.model.complete(request.messages, system=request.system, tools=request.tools)
        session.commit_reply(reply.message, usage=reply.usage)
        for call in session.pending_calls:
            session.tool_result(call.id, "line of code\n" * 150)
        session.end_turn()
    note = calls[0]["arguments"]["content"]
    (asked,) = [line for line in note.splitlines() if line.startswith("Last instruction: ")]
    assert asked.startswith(f"Last instruction: instruction {t} detail")
    assert len(asked) == len("Last instruction: ") + STEWARD_QUOTE_CHARS
    assert "item_" not in note  # ids the request does not show are not the steward's to quote
    from ctxkernel_handoff.plugin import _progress

    hidden = dataclasses.replace(request, messages=[m for m in request.messages if m.source.kind != "user"])
    from ctxkernel.recall.history import History

    assert "Last instruction" not in _progress(History.for_session(session), hidden)
