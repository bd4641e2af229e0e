"""``deferred_sync`` skips the disk wait of the appends made inside it, on that thread and that
store only, and leaves the store durable afterwards (the compaction lock, issue 21)."""

from __future__ import annotations

import os
import threading

from ctxkernel.store import jsonl as jsonl_module
from ctxkernel.store.base import deferred_sync
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.store.sqlite import SqliteStore
from ctxkernel.testing.store import batch, header


def test_jsonl_skips_fsync_only_inside_and_only_on_its_thread(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(jsonl_module.os, "fsync", counting)
    store, elsewhere = JsonlStore(tmp_path / "a"), JsonlStore(tmp_path / "b")
    store.create(header("s"))
    elsewhere.create(header("s"))
    synced.clear()
    with deferred_sync(store):
        store.append("s", batch(0, 1), 0)
        assert synced == []
        elsewhere.append("s", batch(0, 1), 0)  # another store: durable as always
        assert len(synced) == 1
        worker = threading.Thread(target=store.append, args=("s", batch(1, 1), 1), name="other-thread")
        worker.start()
        worker.join()
        assert synced[-1] == "other-thread"  # another thread: durable as always
    store.append("s", batch(2, 1), 2)
    assert len(synced) == 3


def test_sqlite_commits_deferred_appends_with_normal_sync_and_restores_full(tmp_path):
    store = SqliteStore(tmp_path)
    store.create(header("s"))
    seen: list[str] = []
    store._db.set_trace_callback(lambda sql: seen.append(sql) if "synchronous" in sql else None)
    with deferred_sync(store):
        store.append("s", batch(0, 2), 0)
    assert any("NORMAL" in sql for sql in seen)
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    seen.clear()
    store.append("s", batch(2, 1), 2)
    assert seen == []  # a plain append keeps FULL
    assert [e.seq for e in SqliteStore(tmp_path).read("s")] == [0, 1, 2]
