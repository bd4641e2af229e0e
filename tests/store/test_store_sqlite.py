"""The sqlite backend beyond the conformance suite: WAL, busy timeout, schema version, processes."""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import subprocess
import sys
import threading

import orjson
import pytest

from ctxkernel import Kernel
from ctxkernel.errors import CorruptionError, StoreError
from ctxkernel.profile import StoreSettings
from ctxkernel.store import store_from_settings
from ctxkernel.store.sqlite import DATABASE_NAME, INIT_LOCK_SUFFIX, SqliteStore
from ctxkernel.testing import make_profile
from ctxkernel.testing.store import batch, header


def test_one_database_under_the_home_in_wal_mode(tmp_path):
    store = store_from_settings(StoreSettings(backend="sqlite"), tmp_path)
    assert isinstance(store, SqliteStore) and store.path == tmp_path / DATABASE_NAME
    store.create(header("s"))
    with sqlite3.connect(tmp_path / DATABASE_NAME) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: durable commits
    assert store._db.execute("PRAGMA busy_timeout").fetchone()[0] == 60_000


def test_kernel_uses_it_from_a_profile(tmp_path):
    profile = make_profile(store={"backend": "sqlite", "path": str(tmp_path)})
    kernel = Kernel(profile, entry_points=False)
    assert kernel.store.backend == "sqlite"
    session = kernel.open_session()
    session.user("hello")
    again = Kernel(profile, entry_points=False).open_session(session.id)
    assert [e.to_dict() for e in again.events] == [e.to_dict() for e in session.events]


def test_a_writer_waits_for_another_process_holding_the_lock(tmp_path):
    store = SqliteStore(tmp_path)
    store.create(header("s"))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            f"db = sqlite3.connect({str(tmp_path / DATABASE_NAME)!r}, isolation_level=None)\n"
            "db.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(1); db.execute('COMMIT')\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    store.append("s", batch(0, 3), 0)  # waits for the lock instead of failing
    assert holder.wait(30) == 0
    assert store.next_seq("s") == 3


def test_lock_held_past_the_busy_timeout_is_a_store_error(tmp_path):
    store = SqliteStore(tmp_path, busy_timeout=0.05)
    store.create(header("s"))
    other = sqlite3.connect(tmp_path / DATABASE_NAME, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreError, match="another process holds the lock"):
        store.append("s", batch(0, 1), 0)
    other.execute("ROLLBACK")
    store.append("s", batch(0, 1), 0)
    assert store.next_seq("s") == 1


def test_newer_schema_is_refused(tmp_path):
    SqliteStore(tmp_path).close()
    with sqlite3.connect(tmp_path / DATABASE_NAME) as db:
        db.execute("UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99 is newer"):
        SqliteStore(tmp_path)


def test_a_missing_row_is_corruption_not_a_short_log(tmp_path):
    store = SqliteStore(tmp_path)
    store.create(header("s"))
    store.append("s", batch(0, 5), 0)
    with sqlite3.connect(tmp_path / DATABASE_NAME) as db:
        db.execute("DELETE FROM events WHERE seq = 2")
    with pytest.raises(CorruptionError, match="missing"):
        list(store.read("s"))
    with pytest.raises(CorruptionError, match="holds 4 events"):
        store.repair("s")


@pytest.mark.parametrize(
    ("change", "calls"),
    [
        ("UPDATE sessions SET next_seq = 'x'", ("next_seq", "read", "repair", "append")),
        ("UPDATE sessions SET next_seq = 2.5", ("next_seq", "read", "repair", "append")),
        ("UPDATE blobs SET size = 'x'", ("blob_get", "blob_stat", "blob_list")),
        ("UPDATE blob_chunks SET data = CAST(data AS TEXT)", ("blob_get",)),
    ],
)
def test_a_row_of_another_type_is_corruption(tmp_path, change, calls):
    # int() and bytes() of what the row held: a bare ValueError or TypeError, or a next seq of
    # 2.5 read as 2 while every append met a conflict "at 2.5"
    store = SqliteStore(tmp_path)
    store.create(header("s"))
    store.append("s", batch(0, 3), 0)
    store.blob_put("b/k", b"bytes")
    with sqlite3.connect(tmp_path / DATABASE_NAME) as db:
        db.execute(change)
    run = {
        "next_seq": lambda: store.next_seq("s"),
        "read": lambda: list(store.read("s")),
        "repair": lambda: store.repair("s"),
        "append": lambda: store.append("s", batch(3, 1), 3),
        "blob_get": lambda: store.blob_get("b/k"),
        "blob_stat": lambda: store.blob_stat("b/k"),
        "blob_list": lambda: store.blob_list("b/"),
    }
    for call in calls:
        with pytest.raises(CorruptionError, match="accepted: an integer|not bytes"):
            run[call]()


def test_a_header_row_naming_another_session_is_corruption(tmp_path):
    # opening "a" through a header that names "b" worked on session b: read it, wrote to it
    store = SqliteStore(tmp_path)
    for session_id in ("a", "b"):
        store.create(header(session_id))
    with sqlite3.connect(tmp_path / DATABASE_NAME) as db:
        db.execute("UPDATE sessions SET header = (SELECT header FROM sessions WHERE id = 'b') WHERE id = 'a'")
    with pytest.raises(CorruptionError, match="header of session 'a' names session 'b'"):
        store.header("a")


def test_a_header_row_with_a_field_of_another_type_is_corruption(tmp_path):
    # "created": 5, "extra": [1], "format_version": true (taken as 1) were accepted
    store = SqliteStore(tmp_path)
    store.create(header("s"))
    for change, accepted in (
        ("'$.created', 5", "'created' is 5; accepted: a string"),
        ("'$.extra', json('[1]')", "'extra' is \\[1\\]; accepted: an object or null"),
        ("'$.format_version', json('true')", "unsupported session format_version True"),
    ):
        with sqlite3.connect(tmp_path / DATABASE_NAME) as db:
            db.execute(f"UPDATE sessions SET header = json_set(header, {change})")
        with pytest.raises(CorruptionError, match=accepted):
            SqliteStore(tmp_path).header("s")
        with sqlite3.connect(tmp_path / DATABASE_NAME) as db:
            db.execute("UPDATE sessions SET header = ?", (orjson.dumps(header("s").to_dict()).decode(),))


@contextlib.contextmanager
def held_init_lock(home):
    """Another opener's lock: an exclusive flock on the lock file beside the database."""
    with open(home / (DATABASE_NAME + INIT_LOCK_SUFFIX), "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


def test_opening_waits_for_another_opener_holding_the_init_lock(tmp_path):
    # two connections switching a fresh database to WAL at once: SQLite fails one of them at once
    # with "database is locked" (deadlock avoidance, no busy handler; reproduced with 8 threads on
    # fresh databases: 4-8 failures in 300 rounds), which killed a two-worker test's worker as it
    # opened its store. Opening is serialised by a lock file beside the database.
    opened = threading.Event()
    with held_init_lock(tmp_path):
        thread = threading.Thread(target=lambda: (SqliteStore(tmp_path).close(), opened.set()))
        thread.start()
        assert not opened.wait(0.5)  # blocked: the database is not touched meanwhile
        assert not (tmp_path / DATABASE_NAME).exists()
    thread.join(30)
    assert opened.is_set()


def test_an_init_lock_held_past_the_busy_timeout_is_a_store_error(tmp_path):
    with held_init_lock(tmp_path), pytest.raises(StoreError, match="init.lock"):
        SqliteStore(tmp_path, busy_timeout=0.2)
