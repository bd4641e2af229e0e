"""Step 9 of the compaction transaction when the store fails: the error end is retried, a failure
to write it is logged (never silent), and the abandoned compaction never leaves the session busy."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ctxkernel import Kernel, Message, ShrinkCheckError, Span, ToolCallBlock
from ctxkernel.compaction import END_ATTEMPTS
from ctxkernel.errors import StoreError
from ctxkernel.events import Event
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile


class FlakyEndStore(JsonlStore):
    """A jsonl store whose next ``fail_ends`` appends of a ``compaction/end`` fail.

    ``mode="store"`` raises a store error with nothing written (a full disk, a lost database);
    ``mode="conflict"`` lets another writer append first, so the real append conflicts."""

    def __init__(self, home: Path, mode: str) -> None:
        super().__init__(home)
        self.mode = mode
        self.fail_ends = 0
        self.failed = 0

    def append(self, session_id: str, events: Sequence[Event], expected_seq: int) -> None:
        if self.fail_ends and any(e.type == "compaction/end" for e in events):
            self.fail_ends -= 1
            self.failed += 1
            if self.mode == "store":
                msg = f"injected: cannot write to {session_id}"
                raise StoreError(msg)
            other = Event(expected_seq, "other/note", {"n": self.failed}, events[0].time, None, True)
            super().append(session_id, [other], expected_seq)
        super().append(session_id, events, expected_seq)


def kernel_on(store: JsonlStore, home: Path) -> Kernel:
    return Kernel(make_profile(), store=store, home=home, entry_points=False)


def conversation(session: Any) -> list[int]:
    session.user("fix the parser " + "please " * 40)
    session.prepare_request()
    session.commit_reply(Message.assistant("looking " * 30, [ToolCallBlock("a", "read", {"path": "p.py"})]))
    session.tool_result("a", "def parse():\n" + "    pass\n" * 80)
    session.prepare_request()
    session.commit_reply(Message.assistant("Fixed it. " * 20))
    session.end_turn()
    session.user("thanks")
    return [n.seq for n in session.surface]


def failing_compaction(session: Any, seqs: list[int]) -> None:
    """A transaction that writes its start and then fails its shrink check."""
    with pytest.raises(ShrinkCheckError):
        session.compact(Span(seqs[-1], seqs[-1], summary="a much longer summary " * 50), strategy="basic")


def ends_of(session: Any, compaction_id: str) -> list[Event]:
    return [e for e in session.events if e.type == "compaction/end" and e.data["compaction_id"] == compaction_id]


def last_start(session: Any) -> Event:
    return [e for e in session.events if e.type == "compaction/start"][-1]


@pytest.mark.parametrize("mode", ["store", "conflict"])
def test_an_end_that_fails_fewer_times_than_the_attempts_is_written_once(tmp_path: Path, mode: str) -> None:
    store = FlakyEndStore(tmp_path, mode)
    session = kernel_on(store, tmp_path).open_session()
    seqs = conversation(session)
    store.fail_ends = END_ATTEMPTS - 1
    with capture_logs() as logs:
        failing_compaction(session, seqs)
    start = last_start(session)
    ends = ends_of(session, start.data["compaction_id"])
    assert len(ends) == 1 and "ShrinkCheckError" in ends[0].data["error"]
    assert session.open_compaction is None
    assert [entry["log_level"] for entry in logs] == ["warning"] * (END_ATTEMPTS - 1)
    assert all(entry["compaction_id"] == start.data["compaction_id"] for entry in logs)


@pytest.mark.parametrize("mode", ["store", "conflict"])
def test_an_end_that_cannot_be_written_is_logged_and_ended_by_the_next_compaction(tmp_path: Path, mode: str) -> None:
    store = FlakyEndStore(tmp_path, mode)
    session = kernel_on(store, tmp_path).open_session()
    seqs = conversation(session)
    store.fail_ends = END_ATTEMPTS
    with capture_logs() as logs:
        failing_compaction(session, seqs)  # the transaction's own error reaches the caller
    assert store.failed == END_ATTEMPTS
    abandoned = last_start(session).data["compaction_id"]
    assert session.open_compaction is not None and session.open_compaction["compaction_id"] == abandoned
    errors = [entry for entry in logs if entry["log_level"] == "error"]
    assert len(errors) == 1
    assert errors[0]["compaction_id"] == abandoned and "ShrinkCheckError" in errors[0]["error"]
    assert ("StoreError" if mode == "store" else "ConflictError") in errors[0]["end_error"]

    # the store works again. The failed transaction gave its lease up, so the first Session object
    # to look (here a compaction of the same object) takes the compaction over, then commits
    seqs = [n.seq for n in session.surface]
    result = session.compact(Span(seqs[0], seqs[-2], summary="they fixed the parser"), strategy="basic")
    (end,) = ends_of(session, abandoned)
    assert end.data["error"].startswith("interrupted: taken over")
    assert end.data["takeover"]["reason"] == "its holder gave up the lease without writing its end"
    assert end.data["takeover"]["holder"]["pid"] == os.getpid()
    other = session.kernel.open_session(session.id)
    assert other.open_compaction is None and result.spans[0].replacement_seq is not None
    # the first Session object sees the same log and is not busy either
    session.refresh()
    assert session.open_compaction is None
    session.compact(Span(result.spans[0].replacement_seq, session.surface.nodes[-1].seq, summary="s"), strategy="basic")
    assert len(ends_of(session, abandoned)) == 1
    reopened = session.kernel.open_session(session.id)
    assert [n.seq for n in reopened.surface] == [n.seq for n in session.surface]
