"""The compress and drop tools: every refusal names the problem and leaves the log byte-identical."""

from __future__ import annotations

import pytest

from ctxkernel import Message, Span, ToolCallBlock
from ctxkernel_decay import current_state
from ctxkernel_decay.state import Block
from ctxkernel_decay.tools import LISTED_BLOCKS, live_pairs


def _history(driver, turns: int = 3) -> None:
    # per turn: user ⟦a⟧, assistant text+2 calls ⟦a+1⟧, results ⟦a+2⟧ ⟦a+3⟧, a tool-call-only
    # turn (no anchor) with its result ⟦a+4⟧, the final reply ⟦a+5⟧
    for t in range(turns):
        driver.user(f"task {t}")
        driver.calls([f"result {t}a\n" * 30, f"result {t}b\n" * 30], text=f"reading for {t}")
        driver.calls([f"more {t}\n" * 30])
        driver.text(f"finished {t}")
        driver.session.end_turn()


@pytest.fixture
def inflight(driver, session):
    """Three finished turns, the user's new message ⟦p19⟧, and the model's compress call in flight."""
    _history(driver, 3)
    driver.user("now")
    session.prepare_request()
    session.commit_reply(Message.assistant("", [ToolCallBlock("k1", "compress", {})]))
    return driver


def _refused(driver, read_log, name, arguments, *phrases):
    session = driver.session
    before, count = read_log(session), len(session.events)
    out = driver.run_tool(name, arguments)
    assert out.is_error, out.content
    for phrase in phrases:
        assert phrase in out.content, out.content
    assert "Nothing was changed" in out.content
    assert read_log(session) == before and len(session.events) == count
    return out.content


def _span(a, b, summary="what this span held", **extra):
    return {"spans": [{"from": a, "to": b, "summary": summary, **extra}]}


def test_unknown_anchor_is_refused_listing_the_visible_anchors(inflight, read_log):
    text = _refused(
        inflight, read_log, "compress", _span("p2", "p40"), "⟦p40⟧ is stale or unknown", "Visible anchors: ⟦p1⟧ ⟦p2⟧"
    )
    assert "⟦p19⟧" in text


def test_stale_anchor_after_a_compression_is_refused(inflight, read_log):
    out = inflight.run_tool("compress", _span("p2", "p6"))
    assert not out.is_error, out.content
    _refused(inflight, read_log, "compress", _span("p3", "p12"), "⟦p3⟧ is stale", "⟦p2⟧…⟦p6⟧")


@pytest.mark.parametrize("bad", ["q5", "⟦5⟧", "p0", "p", "[p5]", "p" + "9" * 20])
def test_malformed_anchor_is_refused_with_the_accepted_forms(inflight, read_log, bad):
    _refused(inflight, read_log, "compress", _span(bad, "p6"), "is not an anchor", '"⟦p12⟧", "p12" or 12')


@pytest.mark.parametrize("digits", [0, 1, 5_000])
def test_an_anchor_number_outside_the_schema_bounds_is_refused_with_the_bounds(inflight, read_log, digits):
    # the schema the model sees says 1..999999999; a 5,000-digit number is refused, never printed
    bad = -3 if digits == 0 else 0 if digits == 1 else 10**digits
    _refused(inflight, read_log, "compress", _span(bad, "p6"), "integer (1..999999999, 0-32 chars)")


@pytest.mark.parametrize("form", ["⟦p2⟧", "p2", 2, " p2 "])
def test_every_anchor_form_is_accepted(inflight, form):
    out = inflight.run_tool("compress", _span(form, "⟦p6⟧"))
    assert not out.is_error, out.content


def test_tool_group_edge_is_refused_naming_the_group(inflight, read_log):
    # ⟦p3⟧ is the first result of the calls made by ⟦p2⟧; ⟦p4⟧ is the last
    _refused(
        inflight,
        read_log,
        "compress",
        _span("p3", "p6"),
        "its start falls inside the tool-call group (read, read)",
        "starts at ⟦p2⟧",
        "last result is ⟦p4⟧",
    )
    _refused(inflight, read_log, "compress", _span("p1", "p3"), "its end falls inside", "last result is ⟦p4⟧")
    _refused(inflight, read_log, "compress", _span("p1", "p2"), "its end falls inside", "starts at ⟦p2⟧")


def test_an_unanchored_group_is_named_by_its_neighbour(inflight, read_log):
    _refused(
        inflight,
        read_log,
        "compress",
        _span("p5", "p6"),
        "unanchored tool-call turn right after ⟦p4⟧",
        "last result is ⟦p5⟧",
        "next anchor outside any group is ⟦p6⟧",
    )


def test_current_turn_edge_is_refused_naming_the_protected_turn(driver, session, read_log):
    _history(driver, 3)
    driver.user("now")
    session.prepare_request()
    session.commit_reply(Message.assistant("compressing first", [ToolCallBlock("k1", "compress", {})]))  # ⟦p20⟧
    _refused(
        driver,
        read_log,
        "compress",
        _span("p1", "p20"),
        "reaches into the current turn (from ⟦p19⟧)",
        "compressible: ⟦p1⟧ through ⟦p18⟧",
    )
    _refused(driver, read_log, "compress", _span("p19", "p20"), "starts inside the current turn (from ⟦p19⟧)")


def test_to_naming_the_current_turns_first_anchor_clips_before_the_turn(inflight, session):
    now = session.surface.nodes[-2]
    out = inflight.run_tool("compress", _span("p1", "p19"))
    assert not out.is_error and "clipped before the current turn" in out.content, out.content
    state = current_state(session.context)
    (block,) = state.blocks.values()
    assert (block.left, block.right) == (1, 18)
    assert session.surface.nodes[-2].seq == now.seq  # the user's message in this turn stays verbatim


def test_clipping_keeps_the_unanchored_prefix_of_the_turn_in_progress(driver, session):
    """A turn a proxy's client opened with the model's own tool-call-only message (no anchor):
    `to` naming the turn's first visible anchor clips the span before the turn, and the
    unanchored call message stays with its result."""
    _history(driver, 2)  # ⟦p1⟧..⟦p12⟧
    session.append_history(
        [Message.assistant("", [ToolCallBlock("k0", "read", {"path": "x"})]), Message.tool("k0", "file x")]
    )  # a new turn: the unanchored call, its result ⟦p13⟧
    call_seq, result_seq = session.surface.nodes[-2].seq, session.surface.nodes[-1].seq
    out = driver.run_tool("compress", _span("p7", "p13"))
    assert not out.is_error and "clipped" in out.content, out.content
    (block,) = current_state(session.context).blocks.values()
    assert (block.left, block.right) == (7, 12)
    assert [n.seq for n in session.surface][-2:] == [call_seq, result_seq]


def test_the_current_turn_is_never_compressed_across_steps(driver, session, read_log):
    """Issue #15 and seed §7: after tool steps the newest assistant message no longer follows the
    user's instruction; the instruction and every step since belong to the current turn and are
    never compressed. The refusal names the range a span may cover."""
    _history(driver, 2)  # ⟦p1⟧..⟦p12⟧
    driver.user("the instruction of this turn")  # ⟦p13⟧
    driver.calls(["partial\n" * 20], text="first step")  # ⟦p14⟧ ⟦p15⟧
    driver.calls(["more\n" * 20], text="second step")  # ⟦p16⟧ ⟦p17⟧
    for span in (_span("p1", "p15"), _span("p12", "p14"), _span("p7", "p17")):
        _refused(
            driver,
            read_log,
            "compress",
            span,
            "reaches into the current turn (from ⟦p13⟧)",
            "compressible: ⟦p1⟧ through ⟦p12⟧",
        )
    for span in (_span("p13", "p15"), _span("p14", "p15"), _span("p16", "p17")):
        _refused(driver, read_log, "compress", span, "starts inside the current turn (from ⟦p13⟧)")
    turn = [n.seq for n in session.surface][-5:]
    out = driver.run_tool("compress", _span("p1", "p12"))
    assert not out.is_error, out.content
    assert [n.seq for n in session.surface][-5:] == turn  # the whole turn stays verbatim


def test_a_turn_the_guard_summarised_in_part_stays_protected(make_decay_kernel, make_driver, read_log):
    """A foreign compaction (the guard's basic summary) that covered part of the open turn holds
    that turn's content: decay does not compress it further while the turn is open."""
    session = make_decay_kernel().open_session()
    driver = make_driver(session)
    _history(driver, 2)
    driver.user("the instruction of this turn")  # ⟦p13⟧
    driver.calls(["partial\n" * 20], text="first step")  # ⟦p14⟧ ⟦p15⟧
    driver.calls(["more\n" * 20], text="second step")
    first = session.surface.nodes[0].seq
    last = next(n.seq for n in session.surface if n.message.text == "first step")
    session.compact(Span(first, session.surface.nodes[session.surface.position(last) + 1].seq), strategy="basic")
    checkpoint = session.surface.nodes[0]
    assert checkpoint.message.source.plugin == "basic"
    anchor = current_state(session.context).anchor_of
    step = [anchor[n.seq] for n in session.surface.nodes[-2:]]  # the second step and its result
    for span in (_span(anchor[checkpoint.seq], step[0]), _span(*step)):
        _refused(
            driver,
            read_log,
            "compress",
            span,
            "the current turn",
            "nothing before the current turn is left to compress",
        )


def test_overlapping_spans_are_refused(inflight, read_log):
    args = {"spans": [{"from": "p1", "to": "p6", "summary": "a"}, {"from": "p6", "to": "p12", "summary": "b"}]}
    _refused(inflight, read_log, "compress", args, "spans 0 and 1 overlap", "Split them")


def test_from_after_to_is_refused(inflight, read_log):
    _refused(inflight, read_log, "compress", _span("p12", "p7"), "comes after `to`", "swap them")


def test_count_and_length_limits(make_decay_kernel, make_driver, read_log):
    session = make_decay_kernel(settings={"max_spans": 2, "summary_max_chars": 100}).open_session()
    driver = make_driver(session)
    _history(driver, 3)
    driver.user("now")
    three = {"spans": [{"from": f"p{a}", "to": f"p{a + 5}", "summary": "s"} for a in (1, 7, 13)]}
    _refused(driver, read_log, "compress", three, "compress takes 1 to 2 spans, got 3")
    _refused(driver, read_log, "compress", _span("p1", "p6", "x" * 101), "101 characters; the limit is 100")
    _refused(driver, read_log, "compress", _span("p1", "p6", " ⟦p3⟧ ⟦p4⟧ "), "empty summary")
    _refused(driver, read_log, "compress", {"spans": []}, "compress takes 1 to 2 spans, got 0")


def test_a_summary_that_does_not_shrink_is_refused_before_any_event(inflight, read_log):
    _refused(
        inflight,
        read_log,
        "compress",
        _span("p6", "p6", "a very long summary " * 30),
        "not fewer than the",
        "shorter summary",
    )


def test_cost_guard_refuses_with_the_suggestion(make_decay_kernel, make_driver, read_log):
    session = make_decay_kernel(window=200_000, settings={"cost_guard": True, "payback_max_requests": 5}).open_session()
    driver = make_driver(session)
    _history(driver, 3)
    driver.user("now")
    text = _refused(
        driver,
        read_log,
        "compress",
        _span("p1", "p6", "tiny"),
        "cost guard refused",
        "Compress a larger span, move `to` later, or drop an old block first",
    )
    assert "pays back" in text or "paying back" in text


def test_cost_guard_stands_aside_under_pressure(make_decay_kernel, make_driver):
    session = make_decay_kernel(
        window=2_600, reserve=100, settings={"cost_guard": True, "payback_max_requests": 1}, strategies=("decay",)
    ).open_session()
    driver = make_driver(session)
    _history(driver, 3)
    driver.user("now")
    assert session.pressure().ratio >= 0.7
    out = driver.run_tool("compress", _span("p1", "p6", "tiny"))
    assert not out.is_error, out.content


def test_all_spans_of_one_call_commit_in_one_transaction(inflight, session):
    start = len(session.events)
    args = {
        "spans": [
            {"from": "p1", "to": "p6", "summary": "turn 0", "topic": "setup ⟦p9⟧"},
            {"from": "p13", "to": "p18", "summary": "turn 2 ⟦p14⟧ done"},
        ]
    }
    out = inflight.run_tool("compress", args)
    assert not out.is_error, out.content
    types = [e.type for e in session.events[start:]]
    assert types == ["compaction/start", "compaction/summary", "user/message", "user/message", "compaction/end"]
    blocks = sorted(current_state(session.context).blocks.values(), key=lambda b: b.left)
    assert [(b.left, b.right, b.topic) for b in blocks] == [(1, 6, "setup"), (13, 18, None)]
    assert blocks[1].summary == "turn 2 done"  # anchors are stripped from summaries
    # the gap between the spans stays live and visible
    assert current_state(session.context).resolve(7) is not None


def test_drop_needs_the_exact_live_pair(inflight, read_log, session):
    assert not inflight.run_tool("compress", _span("p1", "p6")).is_error
    _refused(
        inflight,
        read_log,
        "drop",
        {"left": "p1", "right": "p5"},
        "not the exact left/right pair",
        "Live blocks: ⟦p1⟧…⟦p6⟧",
    )
    _refused(inflight, read_log, "drop", {"left": "p7", "right": "p12"}, "not the exact left/right pair")
    start = len(session.events)
    out = inflight.run_tool("drop", {"left": 1, "right": "⟦p6⟧"})
    assert not out.is_error, out.content
    types = [e.type for e in session.events[start:]]
    # the compressed block carried the user's instruction of p1..p6 (the kernel's budget): the
    # drop leaves that instruction in place of the block, and nothing else (no tombstone)
    assert types == ["compaction/start", "compaction/summary", "user/message", "compaction/end"]
    kept = session.surface.nodes[0].message
    assert kept.source.plugin == "kernel" and kept.text.startswith("<user-instructions>")
    assert session.surface.nodes[1].message.text == "task 1"


def test_a_refused_drop_lists_the_newest_live_blocks_only():
    # a long session may hold hundreds of blocks: the refusal stays short and names the newest
    live = [
        Block(
            seq=1000 + i,
            left=10 * i + 1,
            right=10 * i + 6,
            tier=1,
            summary="s",
            topic=None,
            sources=[],
            compaction_id="c",
        )
        for i in range(300)
    ]
    listed = live_pairs(live)
    assert listed.startswith(f"({300 - LISTED_BLOCKS} older not listed) ⟦p{10 * (300 - LISTED_BLOCKS) + 1}⟧…")
    assert listed.endswith("⟦p2991⟧…⟦p2996⟧") and len(listed) < 1_500
    assert live_pairs(live[:2]) == "⟦p1⟧…⟦p6⟧ ⟦p11⟧…⟦p16⟧" and live_pairs([]) == "(none)"


def test_bad_argument_shapes_are_refused_by_the_schema(inflight, read_log):
    session = inflight.session
    before = read_log(session)
    out = inflight.run_tool("compress", {"spans": [{"from": "p1", "to": "p6"}]})
    assert out.is_error and "summary" in out.content
    out = inflight.run_tool("compress", {"spans": [{"start": "p1", "to": "p6", "summary": "x"}]})
    assert out.is_error and "start" in out.content
    out = inflight.run_tool("compress", _span(True, "p6"))  # JSON true is not the anchor 1
    assert out.is_error and "from" in out.content
    assert read_log(session) == before


# -- cost of a compression (issue 21) ---------------------------------------------------------------
class _Appends:
    """Counts the store writes of one session (the real store underneath)."""

    def __init__(self, monkeypatch, store):
        self.batches: list[list[str]] = []
        real = type(store).append

        def append(this, session_id, events, *args, **kwargs):
            self.batches.append([e.type for e in events])
            return real(this, session_id, events, *args, **kwargs)

        monkeypatch.setattr(type(store), "append", append)


def test_a_compress_call_is_one_store_write_lock_and_commit_together(inflight, session, monkeypatch):
    appends = _Appends(monkeypatch, session.store)
    out = inflight.run_tool("compress", _span("p1", "p6", "turn 0"))
    assert not out.is_error, out.content
    assert appends.batches == [["compaction/start", "compaction/summary", "user/message", "compaction/end"]]


def test_a_drop_is_one_store_write(inflight, session, monkeypatch):
    assert not inflight.run_tool("compress", _span("p1", "p6")).is_error
    appends = _Appends(monkeypatch, session.store)
    out = inflight.run_tool("drop", {"left": "p1", "right": "p6"})
    assert not out.is_error, out.content
    assert len(appends.batches) == 1 and appends.batches[0][0] == "compaction/start"


def test_a_summary_is_tokenised_once_from_the_call_to_the_surface(inflight, session, monkeypatch):
    # short summaries are below the meter's memo of large texts: before issue 21 the tool counted
    # its block for the shrink check and the kernel's transaction counted it again. The span
    # leaves the user's instruction (p1) out: a block carrying one is the kernel's to count again
    summary = "the setup turn: read f1.py and f2.py, nothing to fix"
    tokenizer, counted = session.meter.tokenizer, []
    real = tokenizer.count
    monkeypatch.setattr(tokenizer, "count", lambda text: counted.append(text) or real(text))
    out = inflight.run_tool("compress", _span("p2", "p6", summary))
    assert not out.is_error, out.content
    assert sum(summary in text for text in counted) == 1
    block = next(n for n in session.surface.nodes if summary in n.message.text)
    assert block.tokens == real(block.message.text) + 4  # the count the kernel kept


def test_a_summary_longer_in_bytes_than_the_span_in_tokens_is_counted_exactly(inflight, session):
    # the byte bound cannot prove this one shrinks; the exact count does, so it is accepted
    state = current_state(session.context)
    nodes = session.surface.span(state.resolve(2), state.resolve(4))  # a call and its two results
    before = sum(session.meter.node_tokens(n) for n in nodes)
    summary = " ".join(["ok"] * (before // 2))  # three bytes but one token per word
    assert len(summary.encode()) > before
    out = inflight.run_tool("compress", _span("p2", "p4", summary))
    assert not out.is_error, out.content
