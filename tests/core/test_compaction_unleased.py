"""A single-batch transaction takes the compaction lease only when a compaction is open (issue 21,
item 2): otherwise the commit's expected-seq check is its lock. And ``basic`` without a
summarizer model summarises before the transaction and commits in one write, with the same
outcome as the summary written under the lock; with a summarizer model the lock comes first.

Across processes the same is proven by tests/store/test_store_two_workers.py (busy refusal of
``basic`` while another worker holds a compaction) and the fleet (tests/store/test_store_fleet.py).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ctxkernel import CompactionBusyError, Message, Span, SurfaceChangedError, head_region
from ctxkernel.compaction import checkpoint_message
from ctxkernel.default_plugins import basic
from ctxkernel.models import ScriptedModel
from ctxkernel.testing import build_kernel

WINDOW = {"context_window": 6000, "reserved_output_tokens": 500}


def chat(session: Any, n: int) -> None:
    session.user(f"instruction {n}: keep the parser strict " + "and tidy " * 10)
    session.prepare_request()
    session.commit_reply(Message.assistant(" ".join(f"w{n}x{i}" for i in range(40))))
    session.end_turn()


def grown(tmp_path: Any, name: str = "a") -> Any:
    session = build_kernel(tmp_path / name, model=WINDOW).open_session()
    for n in range(6):
        chat(session, n)
    return session


def given_span(session: Any) -> Span:
    start, end = head_region(session.surface, session.meter, 60, min_nodes=2) or (0, 0)
    return Span(start, end, message=checkpoint_message("the head, in short", "t"))


class Spy:
    """Records the store's appends (their event types) and lease acquisitions."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.appends: list[list[str]] = []
        self.leases: list[str] = []
        append, acquire = store.append, store.lease_acquire

        def counting_append(session_id: str, events: Any, expected_seq: int) -> Any:
            self.appends.append([e.type for e in events])
            return append(session_id, events, expected_seq)

        def counting_acquire(name: str, *args: Any, **kwargs: Any) -> Any:
            self.leases.append(name)
            return acquire(name, *args, **kwargs)

        monkeypatch.setattr(store, "append", counting_append)
        monkeypatch.setattr(store, "lease_acquire", counting_acquire)


def test_a_single_batch_with_no_compaction_open_takes_no_lease(tmp_path, monkeypatch):
    session = grown(tmp_path)
    spy = Spy(session.store, monkeypatch)
    session.compact(given_span(session), strategy="t", single_batch=True)
    assert spy.leases == []
    assert spy.appends == [["compaction/start", "compaction/summary", "user/message", "compaction/end"]]
    assert not (tmp_path / "a" / "leases").exists() or not any((tmp_path / "a" / "leases").iterdir())


def test_a_writer_appending_before_the_commit_refuses_it_with_nothing_written(tmp_path, monkeypatch):
    """The expected-seq check is the lock: another writer's append that lands after the
    transaction's last refresh makes its commit fail, and the log holds only that append."""
    session = grown(tmp_path)
    other = session.kernel.open_session(session.id)  # another writer of the same log
    store = session.store
    append = store.append
    raced: list[int] = []

    def racing(session_id: str, events: Any, expected_seq: int) -> Any:
        if events[0].type == "compaction/start" and not raced:
            raced.append(other.user("meanwhile, from another writer"))
        return append(session_id, events, expected_seq)

    monkeypatch.setattr(store, "append", racing)
    with pytest.raises(SurfaceChangedError, match="another writer appended"):
        session.compact(given_span(session), strategy="t", single_batch=True)
    session.refresh()
    assert [e.type for e in session.events[raced[0] :]] == ["user/message"]
    assert session.open_compaction is None and not any(e.type == "compaction/summary" for e in session.events)


def test_a_compaction_opened_by_another_worker_meanwhile_refuses_the_single_batch_as_busy(tmp_path, monkeypatch):
    """The unleased path starts while nothing is open; a live holder opens a compaction before its
    commit: the last refresh finds it, the transaction takes the lease path, and the live lease
    refuses it as busy, naming the open compaction. Nothing of it is written."""
    session = grown(tmp_path)
    holder = session.kernel.open_session(session.id)
    entered, release = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def render(summary: Any, region: Any) -> Message:
        entered.set()  # the holder's compaction/start is in the log and its lease is held
        release.wait(30)
        return checkpoint_message(summary, "holder")

    def hold() -> None:
        start, end = head_region(holder.surface, holder.meter, 60, min_nodes=2) or (0, 0)
        outcome["result"] = holder.compact(Span(start, end, summary="held"), strategy="holder", render=render)

    thread = threading.Thread(target=hold)
    refresh, calls = session.refresh, []

    def refresh_with_a_holder_arriving() -> Any:
        calls.append(1)
        if len(calls) == 2:  # the transaction's last refresh before its commit
            thread.start()
            assert entered.wait(30)
        return refresh()

    monkeypatch.setattr(session, "refresh", refresh_with_a_holder_arriving)
    try:
        with pytest.raises(CompactionBusyError) as refused:
            session.compact(given_span(session), strategy="t", single_batch=True)
        opened = session.open_compaction
        assert opened is not None and opened["strategy"] == "holder"
        assert opened["compaction_id"] in str(refused.value) and "pid" in str(refused.value)
        assert [e.type for e in session.events if e.data.get("strategy") == "t"] == []
    finally:
        release.set()
        thread.join(30)
    assert outcome["result"].strategy == "holder"  # the holder commits undisturbed
    session.refresh()
    assert session.open_compaction is None


def test_basic_without_a_summarizer_commits_in_one_write_with_the_locked_outcome(tmp_path, monkeypatch):
    fast, locked = grown(tmp_path, "fast"), grown(tmp_path, "locked")
    spy = Spy(fast.store, monkeypatch)
    keep = fast.meter.surface_tokens() // 4
    assert basic.compact(fast.context, keep, reason="manual")
    assert spy.appends == [["compaction/start", "compaction/summary", "user/message", "compaction/end"]]
    assert spy.leases == []
    # the same region summarised under the lock (the path a summarizer model takes)
    region = head_region(locked.surface, locked.meter, keep, min_nodes=2)
    assert region is not None
    locked.compact(Span(*region), strategy="basic", kind="summary", data={"reason": "manual", "attempt": 0})

    def outcome(session: Any) -> Any:
        summary = next(e for e in session.events if e.type == "compaction/summary").data
        return {k: v for k, v in summary.items() if k != "compaction_id"}, [n.message for n in session.surface]

    assert outcome(fast) == outcome(locked)
    assert [e.type for e in fast.events] == [e.type for e in locked.events]


def test_basic_with_a_summarizer_model_asks_it_under_the_lock(tmp_path, monkeypatch):
    session = grown(tmp_path)
    seen: list[Any] = []

    def script(messages: Any, system: str, tools: Any) -> Message:
        seen.append(session.open_compaction)  # the lock is in the log while the model writes
        return Message.assistant("## Primary Request and Intent\nkeep the parser strict")

    session.kernel.summarizer = ScriptedModel(script)
    spy = Spy(session.store, monkeypatch)
    assert basic.compact(session.context, session.meter.surface_tokens() // 4, reason="manual")
    assert len(seen) == 1 and seen[0] is not None and seen[0]["strategy"] == "basic"
    assert spy.appends == [["compaction/start"], ["compaction/summary", "user/message", "compaction/end"]]
    assert spy.leases == [f"compaction/{session.id}"]
