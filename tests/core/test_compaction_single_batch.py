"""Compaction with single_batch=True: lock and commit in one durable batch, refusals write nothing."""

from __future__ import annotations

import pytest

from ctxkernel import CompactionError, Message, ShrinkCheckError, Source, Span
from ctxkernel.testing import build_kernel


@pytest.fixture
def session(tmp_path):
    session = build_kernel(tmp_path).open_session()
    for i in range(4):
        session.user(f"message number {i} " * 20)
        session.end_turn()
    return session


def test_one_store_append_for_the_whole_transaction(session, monkeypatch):
    calls = []
    original = session.store.append

    def counting(session_id, events, expected_seq):
        calls.append([e.type for e in events])
        return original(session_id, events, expected_seq)

    monkeypatch.setattr(session.store, "append", counting)
    nodes = session.surface.nodes
    result = session.compact(
        Span(nodes[0].seq, nodes[-1].seq, message=Message.user("seed", Source.plugin_form("t", "seed"))),
        strategy="t",
        kind="window",
        single_batch=True,
    )
    assert calls == [["compaction/start", "compaction/summary", "user/message", "compaction/end"]]
    assert result.start_seq == session.events[-4].seq and result.spans[0].replacement_seq == session.events[-2].seq
    assert session.open_compaction is None
    # the seed, with the user's instructions it replaced kept after it (the kernel's budget)
    assert [n.message.content[0].text for n in session.surface.nodes] == ["seed"]


def test_a_refused_single_batch_writes_nothing(session):
    path = session.store.path(session.id)
    before = path.read_bytes()
    nodes = session.surface.nodes
    with pytest.raises(ShrinkCheckError):
        session.compact(
            Span(nodes[0].seq, nodes[0].seq, message=Message.user("long " * 500)), strategy="t", single_batch=True
        )
    with pytest.raises(CompactionError, match="single_batch"):
        session.compact(Span(nodes[0].seq, nodes[-1].seq), strategy="t", single_batch=True)
    assert path.read_bytes() == before
    assert session.open_compaction is None
