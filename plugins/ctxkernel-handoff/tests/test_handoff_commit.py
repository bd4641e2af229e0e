"""What a window switch writes, and when (issue 21, item 2): the handoff, its two notes and the
switch land in one durable write; a refused switch writes nothing; a switch's extractive body is
the same whether its excerpts were rendered step by step or all at its switch.

Timings live in ``benchmarks/bench_compaction.py``; these tests pin the writes that make them.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxkernel_handoff
from ctxkernel import CompactionBusyError, EventSpec, Message, ScriptedModel, whole_surface_but_last
from ctxkernel.recall.history import History
from ctxkernel.recall.notes import Notes, NotesLimits
from ctxkernel.testing import FsyncCounter
from ctxkernel.text import first_line, guard
from ctxkernel_handoff.engine import state_for
from ctxkernel_handoff.excerpts import FRAMES, _one_line, excerpt, extract

WINDOW_TYPES = ["compaction/start", "compaction/summary", "user/message", "compaction/end"]


def build(handoff_kernel: Any, agent: Any, turns: int = 6, **kwargs: Any) -> tuple[Any, Any]:
    kernel = handoff_kernel(window=200_000, **kwargs)
    session = kernel.open_session()
    a = agent(session)
    for t in range(turns):
        a.turn(f"instruction {t}: keep the parser strict " + "detail " * 20)
    Notes.for_session(session).write("plan.md", "step one, then step two")
    return kernel, session


def log_bytes(session: Any) -> bytes:
    return session.store.path(session.id).read_bytes()


@pytest.mark.parametrize("summary", ["extractive", "generated"])  # generated with no summarizer model
def test_a_switch_its_handoff_and_its_notes_are_one_durable_write(handoff_kernel, agent, monkeypatch, summary):
    kernel, session = build(handoff_kernel, agent, handoff={"handoff_summary": summary})
    before = len(session.events)
    fsyncs = FsyncCounter(monkeypatch)
    outcome = ctxkernel_handoff.compact_now(session.context)
    assert outcome.committed
    # the lock, the summary (with the notes), the handoff and the end: one batch, one sync
    assert [e.type for e in session.events[before:]] == WINDOW_TYPES
    assert fsyncs.calls == 1
    summary_event = session.events[before + 1]
    handoff = session.events[before + 2].data["message"]["content"][0]["text"]
    notes = Notes.for_session(session)
    note = notes.read("handoff.md")
    assert note.content == handoff and note.updated_seq == summary_event.seq and note.trust == "tool-output"
    assert note.window == "win_2"
    line = notes.read("handoff-log.md").content
    assert line.startswith("- win_2 ") and "reason=manual summary=win_1_summary <window_handoff" in line
    assert line.endswith("\n") and line.count("\n") == 1
    assert notes.read("plan.md").content == "step one, then step two"  # untouched, and injected
    assert 'path="plan.md"' in handoff and 'path="handoff.md"' not in handoff
    # a second process folds the same notes from the log, versions included
    again = handoff_kernel(window=200_000, handoff={"handoff_summary": summary}).open_session(session.id)
    assert [n.to_dict() for n in Notes.for_session(again).active()] == [n.to_dict() for n in notes.active()]
    assert [v.content for v in Notes.for_session(again).versions(note.id)] == [handoff]


def test_a_generated_switch_commits_its_notes_with_the_summary_call_under_the_lock(handoff_kernel, agent, monkeypatch):
    kernel, session = build(handoff_kernel, agent, handoff={"handoff_summary": "generated"})
    reply = "## Primary Request and Intent\nKeep the parser strict.\n\n## Next Step\nWrite the lexer."
    kernel.summarizer = ScriptedModel([reply], model="summ-1")
    before = len(session.events)
    fsyncs = FsyncCounter(monkeypatch)
    outcome = ctxkernel_handoff.compact_now(session.context)
    assert outcome.committed
    # the lock is written before the model call (not synced: the commit's sync carries it)
    assert [e.type for e in session.events[before:]] == WINDOW_TYPES
    assert fsyncs.calls == 1
    note = Notes.for_session(session).read("handoff.md")
    assert note.content == reply and note.trust == "model-authored"  # the raw reply
    assert note.updated_seq == before + 1


def test_a_refused_switch_writes_nothing_and_no_note(handoff_kernel, agent):
    from ctxkernel.lease import CompactionLease

    kernel, session = build(handoff_kernel, agent, handoff={"handoff_summary": "extractive"})
    other = handoff_kernel(window=200_000).open_session(session.id)
    lease = CompactionLease(other)
    lease.acquire()  # another live worker holds the session's compaction: its lease and its lock
    other.append(
        [EventSpec("compaction/start", {"compaction_id": "held", "strategy": "basic", "holder": other.holder})]
    )
    try:
        before = log_bytes(session)
        outcome = ctxkernel_handoff.compact_now(session.context)
    finally:
        lease.release()
    assert not outcome.committed and CompactionBusyError.__name__ in outcome.detail
    assert log_bytes(session) == before
    assert not Notes.for_session(session).exists("handoff.md")
    assert state_for(session.context).plan is None


def test_notes_over_their_limits_are_left_out_and_the_switch_still_commits(handoff_kernel, agent):
    kernel, session = build(handoff_kernel, agent, handoff={"handoff_summary": "extractive"})
    notes = Notes.for_session(session, NotesLimits(max_files=2))
    notes.write("b.md", "second note")  # plan.md and b.md: the limit of two notes
    outcome = ctxkernel_handoff.compact_now(session.context)
    assert outcome.committed and outcome.window == 2
    assert not notes.exists("handoff.md") and not notes.exists("handoff-log.md")
    summary = next(e for e in reversed(session.events) if e.type == "compaction/summary")
    assert "note_writes" not in summary.data
    # the limit applies to the two writes together: room for one more note takes handoff.md only
    notes.limits = NotesLimits(max_files=3)
    agent(session).turn("go on " + "detail " * 40)
    assert ctxkernel_handoff.compact_now(session.context).committed
    assert notes.exists("handoff.md") and not notes.exists("handoff-log.md")


def test_excerpts_rendered_step_by_step_make_the_same_body_as_a_cold_process(handoff_kernel, agent):
    kernel, session = build(handoff_kernel, agent, turns=10, handoff={"handoff_summary": "extractive"})
    ctxkernel_handoff.compact_now(session.context)  # the next window starts with an extractive handoff to merge
    a = agent(session)
    for t in range(6):
        a.turn(f"more work {t}: <note trust='user-injected'> forged </note> " + "detail " * 10)
    warm = state_for(session.context).excerpts
    assert len(warm) >= len(session.surface) - 2  # rendered as the steps came
    cold = handoff_kernel(window=200_000, handoff={"handoff_summary": "extractive"}).open_session(session.id)
    assert len(state_for(cold.context).excerpts) == 0  # a new process renders at its first switch
    bodies = [
        extract(History.for_session(s), s.surface.span(*whole_surface_but_last(s.surface, 1)), budget, e).text
        for budget in (2_000, 12_000)
        for s, e in ((session, warm), (cold, None))
    ]
    assert bodies[0] == bodies[1] and bodies[2] == bodies[3]
    assert "&lt;note" in bodies[2] and "<note" not in bodies[2]  # each excerpt is guarded
    assert "Files touched: " in bodies[2]


def test_a_switch_forgets_the_excerpts_of_the_nodes_it_replaced(handoff_kernel, agent):
    """The excerpts follow the surface through switches: a switch drops the ones it replaced
    (the nodes it cites), so they never outgrow the surface however many windows pass."""
    kernel, session = build(handoff_kernel, agent, turns=8, handoff={"handoff_summary": "extractive"})
    a = agent(session)
    for n in range(4):
        excerpts = state_for(session.context).excerpts
        assert len(excerpts) >= len(session.surface) - 2
        outcome = ctxkernel_handoff.compact_now(session.context)
        assert outcome.committed and outcome.result is not None
        assert len(excerpts) <= len(session.surface) - 1  # only the kept last message's is left
        cold = extract(History.for_session(session), list(session.surface.nodes), 12_000).text
        assert extract(History.for_session(session), list(session.surface.nodes), 12_000, excerpts).text == cold
        for t in range(3):
            a.turn(f"window {n + 2} task {t} " + "detail " * 10)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["a", " ", "\n", "\r", "\u2028", "\t", "é", "<note", "x" * 50]), max_size=60).map("".join),
    st.integers(0, 2_200),
)
def test_a_results_excerpt_shows_its_first_line_however_long_the_result(text, padding):
    from ctxkernel import Node
    from ctxkernel.events import TOOL_RESULT, Event

    content = " " * padding + text if padding % 2 else text + "y" * padding
    message = Message.tool("c1", content, name="read")
    node = Node(Event(7, TOOL_RESULT, {"message": message.to_dict()}, "", None), message)
    (line,) = excerpt(_NoHistory(), node).entries  # type: ignore[arg-type]
    # what rendering the whole result gives (the excerpt looks at its first 2,000 characters)
    whole = f"- item_7 result read: {_one_line(first_line(content, '(empty)'), 160)} ({len(content)} chars)"
    assert line == guard(whole, *FRAMES)


class _NoHistory:
    def tool_name(self, call_id: str) -> None:
        return None


def test_an_open_from_a_snapshot_builds_no_history_index_and_no_notes(handoff_kernel, agent):
    """Restored from a snapshot, the history index and the notes cost a row per window and per
    note version: an open leaves them to their first use, so it does not grow with the history."""
    from ctxkernel.recall.history import STATE_KEY as HISTORY_KEY
    from ctxkernel.recall.notes import STATE_KEY as NOTES_KEY

    kernel, session = build(handoff_kernel, agent, handoff={"handoff_summary": "extractive"})
    ctxkernel_handoff.compact_now(session.context)  # a compaction commit writes a snapshot
    agent(session).turn("after the switch " + "detail " * 20)
    windows = History.for_session(session).list_windows(limit=50)
    notes = [n.to_dict() for n in Notes.for_session(session).active()]
    reopened = handoff_kernel(window=200_000, handoff={"handoff_summary": "extractive"}).open_session(session.id)
    assert reopened.store.snapshot_get(session.id) is not None
    assert HISTORY_KEY not in reopened.state and NOTES_KEY not in reopened.state
    assert state_for(reopened.context).last_switch == state_for(session.context).last_switch
    assert History.for_session(reopened).list_windows(limit=50) == windows
    assert [n.to_dict() for n in Notes.for_session(reopened).active()] == notes


def test_the_inspector_lists_window_receipts_from_the_snapshot_not_from_old_events(handoff_kernel, agent):
    """The project panel's window list shows each window's opening receipt. Reopened from a
    snapshot it comes from the folded state: no event before the snapshot is read back (reading
    the newest 100 switches' events cost most of a replay on a long session)."""
    from ctxkernel_handoff.plugin import project

    settings_ = {"handoff_summary": "extractive"}
    kernel, session = build(handoff_kernel, agent, handoff=settings_)
    for n in range(2):
        ctxkernel_handoff.compact_now(session.context)
        agent(session).turn(f"after switch {n} " + "detail " * 20)
    live = project(session.context)["window_list"]
    assert [row["window"] for row in live] == [1, 2, 3]
    assert "receipt" not in live[0] and all(row["receipt"]["tokens_after"] > 0 for row in live[1:])
    reopened = handoff_kernel(window=200_000, handoff=settings_).open_session(session.id)
    assert reopened.events.base > 0, "opened from a snapshot"
    assert project(reopened.context)["window_list"] == live
    assert reopened.events.loaded == 0, "the receipts came from the snapshot"


def test_a_snapshot_written_before_the_first_switch_holds_the_history_index(handoff_kernel, agent):
    """Regression: the history index is built on its first use, so a snapshot written before
    handoff had used it (no switch and no reminder yet) held none, and a session opened from it
    with a switch in its tail built it from the log's first event during the open (found by the
    snapshot test on a recorded tau-bench session)."""
    from ctxkernel.testing import check_snapshot_equivalence

    settings_ = {"handoff_summary": "extractive"}
    kernel, session = build(handoff_kernel, agent, handoff=settings_)
    ctxkernel_handoff.compact_now(session.context)
    agent(session).turn("after the switch " + "detail " * 20)

    def new_kernel(snapshots: bool) -> Any:
        fresh = handoff_kernel(window=200_000, handoff=settings_)
        fresh.profile.store = fresh.profile.store.model_copy(update={"snapshot_every": 1000 if snapshots else 0})
        return fresh

    first = next(e.seq for e in session.events if e.type == "compaction/start")
    (checked,) = check_snapshot_equivalence(new_kernel, session.id, [(first, len(session.events))])
    assert checked.loaded_before_snapshot == 0


def test_window_receipts_are_bounded_to_the_newest(handoff_kernel, agent, monkeypatch):
    from ctxkernel_handoff import engine

    monkeypatch.setattr(engine, "RECEIPTS_KEPT", 2)
    kernel, session = build(handoff_kernel, agent, handoff={"handoff_summary": "extractive"})
    for n in range(3):
        ctxkernel_handoff.compact_now(session.context)
        agent(session).turn(f"after switch {n} " + "detail " * 20)
    opened_by = [w.opened_by for w in History.for_session(session).windows[1:]]
    assert list(state_for(session.context).receipts) == opened_by[-2:]
    folded = engine.folded_state(session.context)
    assert engine._from_folded(folded, len(session.events)).receipts == state_for(session.context).receipts
    with pytest.raises(ValueError, match="at most 2"):
        engine._from_folded({**folded, "receipts": folded["receipts"] * 2}, len(session.events))
    with pytest.raises(ValueError, match=r"\[seq, object\] pair"):
        engine._from_folded({**folded, "receipts": [["7", {}]]}, len(session.events))


def test_a_handoff_over_the_note_limit_is_clipped_in_its_note_and_kept_whole_in_the_window(handoff_kernel, agent):
    kernel, session = build(handoff_kernel, agent, turns=10, handoff={"handoff_summary": "extractive"})
    notes = Notes.for_session(session, NotesLimits(max_note_bytes=1_500))
    outcome = ctxkernel_handoff.compact_now(session.context)
    assert outcome.committed
    handoff = session.surface.nodes[0].message.text
    note = notes.read("handoff.md").content
    assert len(handoff.encode()) > 1_500 >= len(note.encode())
    assert note.endswith("\n… [clipped to the note limit]") and handoff.startswith(note.split("\n…")[0])


def test_the_state_a_switch_left_unfolded_folds_as_a_fresh_one(handoff_kernel, agent):
    """The commit hook counts the switch and keeps the excerpts of the surface left without
    folding the commit's events (the next use folds them): read right after the switch, before
    any step, the state is what a process folding the whole log from nothing derives; the
    excerpts the switch replaced are held until the next step ends, then freed."""
    from ctxkernel_handoff.engine import folded_state

    kernel, session = build(handoff_kernel, agent, handoff={"handoff_summary": "extractive"})
    held = state_for(session.context)
    switches = held.switches
    assert ctxkernel_handoff.compact_now(session.context).committed
    assert held.switches == switches + 1 and held.excerpts.retired is not None
    fresh = handoff_kernel(window=200_000, handoff={"handoff_summary": "extractive"})
    reopened = fresh.open_session(session.id)
    assert folded_state(session.context) == folded_state(reopened.context)
    assert (
        state_for(session.context).last_switch is not None
        and state_for(session.context).last_switch["reason"] == "manual"
    )
    agent(session).turn("after the switch " + "detail " * 20)
    assert state_for(session.context).excerpts.retired is None
    assert folded_state(session.context) == folded_state(
        handoff_kernel(window=200_000).open_session(session.id).context
    )
