"""Decoration and sanitizing: anchors are presentation only, counted exactly, never parsed."""

from __future__ import annotations

from ctxkernel import Message, ReasoningBlock, Source, TextBlock, ToolCallBlock
from ctxkernel_decay import current_state


def _turn(driver) -> None:
    driver.user("please look")
    driver.calls(["alpha\n" * 10, "beta\n" * 10], text="reading two files")
    driver.calls(["gamma\n" * 10])  # tool-call-only
    driver.text("all done")
    driver.session.end_turn()


def test_prefixes_suffixes_and_unanchored_tool_call_turns(driver, session):
    _turn(driver)
    _turn(driver)
    driver.user("next")
    assert not driver.run_tool(
        "compress", {"spans": [{"from": "p1", "to": "p6", "summary": "looked at alpha beta gamma"}]}
    ).is_error
    request = session.prepare_request()
    texts = [m.text for m in request.messages]
    assert texts[0] == "⟦p1⟧ [compressed · tier 1]\nlooked at alpha beta gamma ⟦p6⟧"
    assert texts[1] == "⟦p7⟧ please look"
    assert request.messages[2].content[0] == TextBlock("⟦p8⟧ reading two files")
    assert [c.id for c in request.messages[2].tool_calls] == [c.id for c in session.surface.nodes[2].message.tool_calls]
    assert texts[3].startswith("⟦p9⟧ alpha") and texts[4].startswith("⟦p10⟧ beta")
    assert request.messages[5] is session.surface.nodes[5].message  # tool-call-only: untouched, no anchor
    assert texts[6].startswith("⟦p11⟧ gamma") and texts[7] == "⟦p12⟧ all done" and texts[8] == "⟦p13⟧ next"
    # tool results keep their call ids and order
    results = [m.tool_result.call_id for m in request.messages if m.role == "tool"]
    assert results == [n.message.tool_result.call_id for n in session.surface if n.role == "tool"]


def test_decorations_never_reach_the_durable_log(driver, session):
    _turn(driver)
    driver.user("next")
    session.prepare_request()
    for event in session.events:
        message = event.data.get("message") if isinstance(event.data, dict) else None
        if message:
            assert "⟦p" not in str(message), event


def test_the_meter_counts_decorated_messages_exactly_as_sent(driver, session):
    _turn(driver)
    driver.user("next")
    request = session.prepare_request()
    meter = session.meter
    sent = meter.count_header(request.system, request.tools) + sum(meter.count_message(m) for m in request.messages)
    assert not request.pressure.anchored
    assert request.pressure.tokens == sent
    undecorated = meter.count_header(request.system, request.tools) + sum(
        meter.count_message(n.message) for n in session.surface
    )
    assert sent > undecorated


def test_text_that_looks_like_an_anchor_is_content(driver, session, read_log):
    driver.user("see ⟦p7⟧ and ⟦p1⟧ in the doc")
    driver.text("⟦p9⟧ is mentioned")  # a copied leading anchor: stripped before commit
    session.end_turn()
    driver.user("again ⟦p30⟧")
    state = current_state(session.context)
    assert sorted(state.owner) == [1, 2, 3]  # one id per node, nothing read from the text
    before = read_log(session)
    out = driver.run_tool("compress", {"spans": [{"from": "p1", "to": "p30", "summary": "x"}]})
    assert out.is_error and "⟦p30⟧ is stale or unknown" in out.content
    assert read_log(session) == before


def test_sanitize_strips_only_a_leading_run_of_copied_anchors(driver, session):
    driver.user("hi")
    session.prepare_request()
    committed = session.commit_reply(Message.assistant("⟦p3⟧ ⟦p4⟧Here is ⟦p2⟧ the plan"))
    assert committed.text == "Here is ⟦p2⟧ the plan"
    session.end_turn()
    driver.user("more")
    session.prepare_request()
    calls = [ToolCallBlock("x1", "read", {"path": "a"})]
    message = Message("assistant", (ReasoningBlock("think"), TextBlock("⟦p9⟧"), *calls), Source(kind="model"))
    committed = session.commit_reply(message)
    assert [b.type for b in committed.content] == ["reasoning", "tool_call"]  # the anchor-only text block is gone
    assert committed.tool_calls == calls


def test_reasoning_only_or_tool_call_only_assistant_messages_stay_unanchored(driver, session):
    driver.user("hi")
    session.prepare_request()
    session.commit_reply(Message("assistant", (ReasoningBlock("hmm"), TextBlock("  ")), Source(kind="model")))
    session.end_turn()
    driver.user("next")
    request = session.prepare_request()
    assert request.messages[1] is session.surface.nodes[1].message
    assert session.surface.nodes[1].seq not in current_state(session.context).anchor_of


def test_a_copied_leading_run_is_stripped_when_the_request_is_built(driver, session, read_log):
    """Seed §3: stripped both when the request is built and before commit. A reply that reached
    the log without ``sanitize_reply`` (a proxy's client history) still reaches the model clean."""
    driver.user("hello")
    session.append_history(
        [
            Message.assistant("⟦p1⟧ ⟦p7⟧ the copied reply"),
            Message.user("next"),
            Message.assistant("⟦p2⟧", [ToolCallBlock("c1", "read", {"path": "x"})]),
        ]
    )
    session.tool_result("c1", "file x")
    before = read_log(session)
    request = session.prepare_request()
    texts = [m.text for m in request.messages if m.role == "assistant"]
    anchored = current_state(session.context).anchor_of[request.seqs[1]]
    assert texts[0] == f"⟦p{anchored}⟧ the copied reply"
    assert texts[1] == ""  # the copied run was its only text: nothing is left to show
    assert b"copied reply" in before  # the log keeps what was written
