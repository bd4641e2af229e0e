"""Blob table, per backend: what the conformance suite cannot say for every store (where the bytes
live, tamper detection, a writer SIGKILLed in the middle of a put)."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from ctxkernel.errors import CorruptionError, StoreError
from ctxkernel.store.base import BLOB_CHUNK_BYTES, BlobInfo, EventStore
from ctxkernel.store.cli import open_store
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.store.sqlite import SqliteStore
from ctxkernel.testing.store import postgres_dsn, postgres_schema

# two values of two chunks each: a torn write would show as a mix of the two
VALUES = [bytes([n]) * (BLOB_CHUNK_BYTES + 4096 * n) for n in (1, 2)]

WRITER = """
import sys
from ctxkernel.store.cli import open_store
store = open_store(sys.argv[1])
values = [bytes([n]) * (int(sys.argv[2]) + 4096 * n) for n in (1, 2)]
print("ready", flush=True)
i = 0
while True:
    store.blob_put("crash/hot", values[i % 2])
    i += 1
"""


def test_jsonl_blobs_are_plain_files_under_the_home(tmp_path):
    store = JsonlStore(tmp_path)
    store.blob_put("decay/audit.jsonl", b'{"a": 1}\n')
    assert (tmp_path / "blobs" / "decay" / "audit.jsonl").read_bytes() == b'{"a": 1}\n'
    # a writer's leftover temporary file is never a blob
    (tmp_path / "blobs" / "decay" / ".audit.jsonl.123.456.tmp").write_bytes(b"partial")
    assert [i.key for i in store.blob_list()] == ["decay/audit.jsonl"]


@pytest.mark.parametrize(("first", "second"), [("fa", "fa/b"), ("fa/b", "fa"), ("x/y", "x/y/z/w")])
def test_jsonl_refuses_a_blob_key_nested_in_another_naming_both(tmp_path, first, second):
    # a blob is a file named by its key: "fa" and "fa/b" cannot both be (it raised a bare
    # NotADirectoryError); the database stores keep both
    store = JsonlStore(tmp_path)
    store.blob_put(first, b"one")
    with pytest.raises(StoreError, match="jsonl store keeps blobs as files") as info:
        store.blob_put(second, b"two")
    assert repr(first.split("/")[0]) in str(info.value) or repr(first) in str(info.value)
    assert store.blob_get(first) == b"one" and store.blob_get(second) is None
    assert [i.key for i in store.blob_list()] == [first]


def test_jsonl_never_writes_or_deletes_through_a_linked_blob_folder(tmp_path):
    # a get through a link planted under the home was refused, a put and a delete were not:
    # they wrote and removed files wherever the link pointed
    store = JsonlStore(tmp_path / "home")
    store.blob_put("chapters/keep", b"mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim").write_bytes(b"keep me")
    (tmp_path / "home" / "blobs" / "linked").symlink_to(elsewhere)
    for call in (lambda: store.blob_put("linked/new", b"x"), lambda: store.blob_delete("linked/victim")):
        with pytest.raises(StoreError, match="resolves outside the store's blobs folder"):
            call()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim"]
    assert (elsewhere / "victim").read_bytes() == b"keep me"
    store.blob_delete("chapters/keep")  # a folder inside the store still works
    assert store.blob_get("chapters/keep") is None


def test_jsonl_stat_sees_a_file_changed_behind_its_back(tmp_path):
    store = JsonlStore(tmp_path)
    store.blob_put("k", b"first")
    assert store.blob_stat("k") == BlobInfo.of("k", b"first")
    path = tmp_path / "blobs" / "k"
    path.write_bytes(b"edited by hand")
    assert store.blob_stat("k") == BlobInfo.of("k", b"edited by hand")
    assert store.blob_list()[0] == BlobInfo.of("k", b"edited by hand")


def test_sqlite_detects_a_changed_or_missing_chunk(tmp_path):
    store = SqliteStore(tmp_path)
    store.blob_put("k", VALUES[0])
    db = sqlite3.connect(tmp_path / "ctxkernel.sqlite3")
    db.execute("UPDATE blob_chunks SET data = ? WHERE key = 'k' AND idx = 1", (b"tampered",))
    db.commit()
    with pytest.raises(CorruptionError, match="no longer matches"):
        store.blob_get("k")
    db.execute("DELETE FROM blob_chunks WHERE key = 'k' AND idx = 0")
    db.commit()
    db.close()
    with pytest.raises(CorruptionError, match="missing or misplaced"):
        store.blob_get("k")


@pytest.mark.postgres
def test_postgres_detects_a_changed_chunk():
    import psycopg

    from ctxkernel.store.postgres import PostgresStore

    with postgres_schema(postgres_dsn()) as dsn:
        store = PostgresStore(dsn)
        store.blob_put("k", VALUES[0])
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE ctxkernel_blob_chunks SET data = %s WHERE key = 'k' AND idx = 1", (b"x",))
        with pytest.raises(CorruptionError, match="no longer matches"):
            store.blob_get("k")
        store.close()


def _settled(store: EventStore, key: str) -> tuple[bytes | None, BlobInfo | None]:
    """The blob and its stat read while nothing changes them. On PostgreSQL a COMMIT the killed
    writer sent just before dying still lands on the server after the kill, so a read before it
    and a stat after it describe two different, whole values: read until two reads agree."""
    for _ in range(100):
        first, info, again = store.blob_get(key), store.blob_stat(key), store.blob_get(key)
        if first == again:
            return first, info
        time.sleep(0.01)
    raise AssertionError(f"{key} kept changing after its writer was killed")


def _kill_writers(spec: str, trials: int, seed: int) -> int:
    """SIGKILL a process that rewrites one two-chunk blob in a loop, at random moments; after
    each kill the blob must be one whole value. Returns the number of kills."""
    rng = random.Random(seed)
    check = open_store(spec)
    for _ in range(trials):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, spec, str(BLOB_CHUNK_BYTES)],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.05, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        got, info = _settled(check, "crash/hot")
        assert got is None or got in VALUES, "a killed writer left a torn blob"
        assert got is None or info == BlobInfo.of("crash/hot", got)
    check.close()
    return trials


def test_jsonl_blob_put_survives_sigkill(tmp_path, proof_line):
    kills = _kill_writers(f"jsonl:{tmp_path}", 4, seed=1)
    proof_line(f"blobs jsonl: {kills} writers killed mid-put, every blob whole")


def test_sqlite_blob_put_survives_sigkill(tmp_path, proof_line):
    kills = _kill_writers(f"sqlite:{tmp_path}", 4, seed=2)
    proof_line(f"blobs sqlite: {kills} writers killed mid-put, every blob whole")


@pytest.mark.postgres
def test_postgres_blob_put_survives_sigkill(proof_line):
    with postgres_schema(postgres_dsn()) as dsn:
        kills = _kill_writers(f"postgres:{dsn}", 4, seed=3)
    proof_line(f"blobs postgres: {kills} writers killed mid-put, every blob whole")
