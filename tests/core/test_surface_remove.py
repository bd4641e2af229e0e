"""The kernel's cited remove operation (``surface/drop``) and ``Span(remove=True)``."""

from __future__ import annotations

import pytest

from ctxkernel import CompactionError, Message, Span, ToolCallBlock, UnbalancedCutError
from ctxkernel.errors import EventError, SurfaceError
from ctxkernel.events import SURFACE_DROP, Event, remove_op, validate_shape
from ctxkernel.surface import Surface, replay
from ctxkernel.testing import build_kernel


def _session(tmp_path):
    # no instruction budget: these tests are about removal itself (a removal that would take a
    # protected instruction away is tests/core/test_instructions.py's subject)
    kernel = build_kernel(
        tmp_path, model={"context_window": 50_000, "reserved_output_tokens": 1_000}, instructions={"budget_ratio": 0}
    )
    session = kernel.open_session()
    session.user("first task")
    session.prepare_request()
    session.commit_reply(Message.assistant("look", [ToolCallBlock("c1", "read", {"path": "a.py"})]))
    session.tool_result("c1", "a = 1\n" * 40)
    session.prepare_request()
    session.commit_reply(Message.assistant("done"))
    session.end_turn()
    session.user("second task")
    return session


def _log_bytes(session) -> bytes:
    return session.store.path(session.id).read_bytes()


def _seqs(session, role=None):
    return [n.seq for n in session.surface if role is None or n.role == role]


def test_remove_is_carried_only_by_surface_drop():
    with pytest.raises(EventError, match="carried only by surface/drop"):
        validate_shape(Event(5, "user/message", {"message": Message.user("x").to_dict()}, "", remove_op([1])))
    with pytest.raises(EventError, match="only removes"):
        validate_shape(Event(5, SURFACE_DROP, {"strategy": "s"}, "", {"op": "append"}))
    with pytest.raises(EventError, match="cites"):
        validate_shape(
            Event(5, SURFACE_DROP, {"strategy": "s"}, "", {"op": "remove", "start": 1, "end": 2, "cites": []})
        )


@pytest.mark.parametrize("bad", [[1, True], [1, 2.0], [1, "2"], [None]])
def test_cites_are_integers_and_never_booleans(bad):
    with pytest.raises(EventError, match="cites"):
        validate_shape(
            Event(5, SURFACE_DROP, {"strategy": "s"}, "", {"op": "remove", "start": 1, "end": 2, "cites": bad})
        )


def test_cites_may_be_int_subclasses_other_than_bool():
    import enum

    class Seq(enum.IntEnum):
        TWO = 2

    validate_shape(
        Event(5, SURFACE_DROP, {"strategy": "s"}, "", {"op": "remove", "start": 1, "end": 2, "cites": [1, Seq.TWO]})
    )


def test_drop_removes_the_cited_range_with_no_replacement(tmp_path):
    session = _session(tmp_path)
    before = _seqs(session)
    first_turn = before[:4]  # user, assistant with the call, its result, final reply
    result = session.compact(Span(first_turn[0], first_turn[-1], remove=True), strategy="t", kind="drop")
    assert _seqs(session) == before[4:]
    types = [e.type for e in session.events[result.start_seq : result.end_seq + 1]]
    assert types == ["compaction/start", "compaction/summary", SURFACE_DROP, "compaction/end"]
    drop = session.events[result.start_seq + 2]
    assert drop.surface == {"op": "remove", "start": first_turn[0], "end": first_turn[-1], "cites": first_turn}
    assert result.spans[0].replacement_seq is None and result.spans[0].tokens_after == 0
    summary = session.events[result.start_seq + 1].data
    assert summary["spans"][0]["remove"] is True and summary["tokens_after"] == 0


def test_drop_and_replace_commit_in_one_transaction_and_replay(tmp_path):
    session = _session(tmp_path)
    seqs = _seqs(session)
    session.compact(
        [Span(seqs[0], seqs[0], remove=True), Span(seqs[1], seqs[3], summary="read a.py; done")],
        strategy="t",
        kind="mixed",
    )
    assert sum(e.type == "compaction/start" for e in session.events) == 1
    live = _seqs(session)
    assert seqs[0] not in live and seqs[1] not in live and len(live) == 2
    assert [n.seq for n in replay(session.events)] == live
    again = session.kernel.open_session(session.id)
    assert _seqs(again) == live and again.pressure() == session.pressure()


@pytest.mark.parametrize(
    ("pick", "error", "match"),
    [
        (lambda s: (s[1], s[1]), UnbalancedCutError, "balanced"),  # the call without its result
        (lambda s: (s[2], s[3]), UnbalancedCutError, "balanced"),  # the result without its call
        (lambda s: (10_000, 10_000), CompactionError, "not on the surface"),
        (lambda s: (s[3], s[0]), CompactionError, "comes after"),
    ],
)
def test_invalid_drop_is_refused_and_leaves_the_log_byte_identical(tmp_path, pick, error, match):
    session = _session(tmp_path)
    before = _log_bytes(session)
    start, end = pick(_seqs(session))
    with pytest.raises(error, match=match):
        session.compact(Span(start, end, remove=True), strategy="t", kind="drop")
    assert _log_bytes(session) == before


def test_a_removal_cannot_carry_a_summary(tmp_path):
    session = _session(tmp_path)
    before = _log_bytes(session)
    seqs = _seqs(session)
    with pytest.raises(CompactionError, match="no summary"):
        session.compact(Span(seqs[0], seqs[0], remove=True, summary="x"), strategy="t", kind="drop")
    assert _log_bytes(session) == before


def test_surface_refuses_an_uncited_removal():
    surface = Surface()
    surface.apply(Event(0, "user/message", {"message": Message.user("a").to_dict()}, "", {"op": "append"}))
    surface.apply(Event(1, "user/message", {"message": Message.user("b").to_dict()}, "", {"op": "append"}))
    with pytest.raises(SurfaceError, match="without citing"):
        surface.check(
            Event(2, SURFACE_DROP, {"strategy": "t"}, "", {"op": "remove", "start": 0, "end": 1, "cites": [0]})
        )
    surface.apply(Event(2, SURFACE_DROP, {"strategy": "t"}, "", remove_op([0, 1])))
    assert len(surface) == 0 and surface.version == 1
