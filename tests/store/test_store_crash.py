"""Crash proof: SIGKILL a writer at random points during appends and compactions, per backend.

A small fixed sample runs here; `make stress` (benchmarks/stress_store.py) runs 100+ per backend.
"""

from __future__ import annotations

import pytest

from ctxkernel.testing.crash import Acks, CrashCheckError, run_trials, verify_session
from ctxkernel.testing.store import batch, header, postgres_dsn, postgres_schema

TRIALS = 4


def test_jsonl_survives_sigkill(tmp_path, proof_line):
    report = run_trials(f"jsonl:{tmp_path}", TRIALS, seed=1)
    proof_line(report.line())
    assert report.trials == TRIALS and report.acknowledged_batches > 0 and report.compactions_committed > 0
    assert report.killed_inside_compaction >= 1  # the held trial dies inside a transaction


def test_sqlite_survives_sigkill(tmp_path, proof_line):
    report = run_trials(f"sqlite:{tmp_path}", TRIALS, seed=2)
    proof_line(report.line())
    assert report.trials == TRIALS and report.acknowledged_batches > 0 and report.compactions_committed > 0
    assert report.killed_inside_compaction >= 1  # the held trial dies inside a transaction


@pytest.mark.postgres
def test_postgres_survives_sigkill(proof_line):
    with postgres_schema(postgres_dsn()) as dsn:
        report = run_trials(f"postgres:{dsn}", TRIALS, seed=3)
    proof_line(report.line())
    assert report.trials == TRIALS and report.acknowledged_batches > 0 and report.compactions_committed > 0
    assert report.killed_inside_compaction >= 1  # the held trial dies inside a transaction


def test_verifier_catches_a_lost_acknowledged_batch(tmp_path):
    """The check can fail: an acknowledged batch that is not in the log is reported."""
    from ctxkernel.store.jsonl import JsonlStore
    from ctxkernel.testing.crash import batch_hash

    store = JsonlStore(tmp_path)
    store.create(header("s"))
    store.append("s", batch(0, 2), 0)
    acks = Acks([(0, 2, batch_hash(batch(0, 2))), (2, 1, batch_hash(batch(2, 1)))])
    with pytest.raises(CrashCheckError, match="lost"):
        verify_session(store, "s", acks)


def test_verifier_catches_a_half_committed_compaction(tmp_path):
    from ctxkernel.events import Event
    from ctxkernel.store.jsonl import JsonlStore

    store = JsonlStore(tmp_path)
    store.create(header("s"))

    t = "2026-01-01T00:00:00.000Z"
    msg = {"role": "user", "content": [{"type": "text", "text": "hello " * 50}]}
    events = [
        Event(0, "turn/start", {"turn": 1}, t),
        Event(1, "user/message", {"message": msg}, t, {"op": "append"}),
        Event(2, "compaction/start", {"compaction_id": "c1", "strategy": "basic"}, t),
        # a replacement that claims the compaction but with no summary: half-committed
        Event(
            3,
            "user/message",
            {"message": {**msg, "content": [{"type": "text", "text": "s"}]}, "compaction_id": "c1"},
            t,
            {"op": "replace", "start": 1, "end": 1, "cites": [1]},
        ),
        Event(4, "compaction/end", {"compaction_id": "c1", "error": "boom"}, t),
    ]
    store.append("s", events, 0)
    with pytest.raises(CrashCheckError, match="without committing"):
        verify_session(store, "s", Acks())
