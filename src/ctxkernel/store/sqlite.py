"""The ``sqlite`` backend: one database under the kernel home, shared by many processes of a host.

Layout (schema version :data:`SCHEMA_VERSION`, recorded in ``meta``)::

    sessions(id PRIMARY KEY, header TEXT, next_seq INTEGER)
    events(session, seq, type, body TEXT, PRIMARY KEY (session, seq))   -- body: the orjson event
    kv(namespace, key, value TEXT, PRIMARY KEY (namespace, key))
    leases(name PRIMARY KEY, token, holder TEXT, expires REAL)        -- schema 2; this host's clock
    snapshots(session PRIMARY KEY, covers INTEGER, body BLOB)          -- the newest, a verified cache
    blobs(key PRIMARY KEY, size INTEGER, sha256 TEXT, chunks INTEGER)
    blob_chunks(key, idx, data BLOB, PRIMARY KEY (key, idx))        -- at most 1 MiB a row

Opening (connect, the switch to WAL, the schema) is serialised across processes by a lock file
beside the database (``ctxkernel.sqlite3.init.lock``, a :mod:`filelock` lock): SQLite fails one of two connections that
switch a fresh database to WAL at once without waiting.

WAL mode lets readers run beside the one writer; ``synchronous=FULL`` makes every committed batch
durable; the busy timeout makes a second process wait for the write lock instead of failing.
A batch is one ``BEGIN IMMEDIATE`` transaction that checks and bumps ``sessions.next_seq`` and
inserts the events, so a stale writer gets :class:`ConflictError` with nothing written, and a
writer killed mid-batch leaves nothing behind (SQLite rolls the open transaction back).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from filelock import FileLock, Timeout

from ..errors import ConflictError, CorruptionError, SessionExistsError, SessionNotFoundError, StoreError
from ..events import Event
from .base import (
    BlobInfo,
    Lease,
    RepairReport,
    SessionHeader,
    SyncDeferral,
    check_batch,
    check_blob_data,
    check_blob_key,
    check_blob_prefix,
    check_kv_name,
    check_lease_request,
    check_session_id,
)
from .rows import (
    blob_chunks,
    check_bookkeeping,
    decode_header,
    decode_value,
    encode_event,
    encode_value,
    join_blob,
    read_events,
)

SCHEMA_VERSION = 2
DATABASE_NAME = "ctxkernel.sqlite3"
#: the lock file beside the database that serialises opening it
INIT_LOCK_SUFFIX = ".init.lock"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    header TEXT NOT NULL,
    next_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    session TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    holder TEXT NOT NULL,
    expires REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    session TEXT PRIMARY KEY REFERENCES sessions(id),
    covers INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    key TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    chunks INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS blob_chunks (
    key TEXT NOT NULL,
    idx INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (key, idx)
);
"""


#: rows per INSERT statement of an append (powers of two), largest first: a batch goes in as few
#: multi-row statements as these sizes allow (one row of ``executemany`` costs ~2 us of binding and
#: stepping, a row of a multi-row statement about half), and no connection ever prepares more
#: than these seven statements (64 rows bind 130 parameters: under every SQLite's limit)
INSERT_CHUNKS = (64, 32, 16, 8, 4, 2, 1)


@functools.cache
def _insert_events_sql(rows: int) -> str:
    """``rows`` events in one INSERT: ``?1`` the session, ``?2`` the first seq (check_batch has
    made the batch's seqs run on from it), then each event's type and body."""
    values = ", ".join(f"(?1, ?2 + {i}, ?{3 + 2 * i}, ?{4 + 2 * i})" for i in range(rows))
    return f"INSERT INTO events (session, seq, type, body) VALUES {values}"


#: SQLite's primary result codes for a lock another connection holds, and for a damaged file
_BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED
_CORRUPT_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB


def _write_error(path: Path, exc: sqlite3.Error, doing: str, more: str = "") -> StoreError:
    """The error of a write transaction that could not start, run or commit (``doing``): only
    SQLite's busy and locked results blame another process; a damaged file is
    :class:`CorruptionError`; anything else (an I/O error, a read-only or full database) is
    :class:`StoreError` with SQLite's own reason."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in _BUSY_CODES:
        return StoreError(f"sqlite store {path}: cannot {doing} ({exc}); another process holds the lock{more}")
    if primary in _CORRUPT_CODES:
        return CorruptionError(f"sqlite store {path}: cannot {doing}: {exc}{more}")
    return StoreError(f"sqlite store {path}: cannot {doing}: {exc}{more}")


class SqliteStore(SyncDeferral):
    backend = "sqlite"

    def __init__(self, home: str | os.PathLike[str], *, busy_timeout: float = 60.0, durable: bool = True) -> None:
        self.home = Path(home)
        self.path = self.home / DATABASE_NAME
        self.busy_timeout = busy_timeout
        self._mutex = threading.RLock()  # one connection per store, shared by this process's threads
        try:
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = "it is not a folder" if isinstance(exc, FileExistsError) else exc.strerror or exc
            msg = f"cannot create the sqlite store's folder {self.home}: {why}"
            raise StoreError(msg) from None
        self._check_place()
        # Opening is serialised across processes by a lock file beside the database. Two processes
        # switching a fresh database to WAL at once both hold a SHARED lock and both ask for the
        # EXCLUSIVE one; SQLite breaks that deadlock by failing one of them at once with "database
        # is locked", without calling the busy handler, so busy_timeout cannot help (the cause of
        # the two-worker test's broken pipes: a worker died while opening its store).
        with self._opening_lock():
            self._open(durable)

    def _check_place(self) -> None:
        """Refuse at once, naming the path, a home that is no folder, a database that is no regular
        file (a folder, a fifo, a device) and a home in which the lock file cannot be created.

        filelock takes a lock file it cannot create in an existing folder (every file under
        ``/proc/self``) for one being deleted by its holder and polls: opening waited out the busy
        timeout (60 s), then blamed another process for holding the lock."""
        where = f"[store] path must name a folder on a local file system (the database is {DATABASE_NAME} in it)"
        if not self.home.is_dir():
            msg = f"cannot open the sqlite store in {self.home}: it is not a folder; {where}"
            raise StoreError(msg)
        try:
            mode = self.path.stat().st_mode
        except FileNotFoundError:
            mode = stat.S_IFREG  # created by the first opening
        except OSError as exc:
            msg = f"cannot open the sqlite store {self.path}: {exc.strerror or exc}"
            raise StoreError(msg) from None
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a fifo" if stat.S_ISFIFO(mode) else "a special file"
            msg = f"cannot open the sqlite store {self.path}: it is {kind}, not a regular file; {where}"
            raise StoreError(msg)
        lock = Path(str(self.path) + INIT_LOCK_SUFFIX)
        try:
            os.close(os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644))
        except OSError as exc:
            msg = f"cannot open the sqlite store in {self.home}: its lock file {lock} cannot be created ({exc.strerror or exc}); {where}"
            raise StoreError(msg) from None

    @contextlib.contextmanager
    def _opening_lock(self) -> Iterator[None]:
        """An exclusive :class:`filelock.FileLock` on ``<database>.init.lock``, waited for up to
        the busy timeout.

        Each opening makes its own lock object, so threads exclude each other as processes do;
        the operating system releases the lock when its holder dies. The file is kept
        (``preserve_lock_file``): deleting a lock file lets a second holder in."""
        path = Path(str(self.path) + INIT_LOCK_SUFFIX)
        lock = FileLock(path, timeout=self.busy_timeout, poll_interval=0.005, preserve_lock_file=True)
        try:
            lock.acquire()
        except Timeout:
            msg = (
                f"cannot open the sqlite store {self.path}: another process held {path} "
                f"for {self.busy_timeout:g} s while opening it"
            )
            raise StoreError(msg) from None
        except OSError as exc:
            msg = f"cannot open the sqlite store's lock file {path}: {exc.strerror or exc}"
            raise StoreError(msg) from None
        try:
            yield
        finally:
            lock.release()

    def _open(self, durable: bool) -> None:
        try:
            self._db = sqlite3.connect(
                self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
            )
            self._db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            # FULL: a committed batch survives power loss in WAL mode too (NORMAL would not)
            self._synchronous = "FULL" if durable else "OFF"
            self._db.execute(f"PRAGMA synchronous = {self._synchronous}")
            self._db.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            msg = f"cannot open the sqlite store {self.path}: {exc}"
            raise StoreError(msg) from None
        if str(mode).lower() != "wal":
            msg = f"{self.path}: could not switch the database to WAL mode (got {mode!r}); use a local file system"
            raise StoreError(msg)
        self._migrate()

    # -- schema --------------------------------------------------------------------------------
    def _migrate(self) -> None:
        with self._write():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            row = self._db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                msg = (
                    f"{self.path}: schema version {row[0]} is newer than this ctxkernel reads "
                    f"({SCHEMA_VERSION}); upgrade ctxkernel"
                )
                raise StoreError(msg)
            # the statements above are idempotent (IF NOT EXISTS): an older schema is now upgraded
            self._db.execute(
                "INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )

    class _Txn:
        def __init__(self, store: SqliteStore) -> None:
            self.store = store

        def __enter__(self) -> sqlite3.Connection:
            self.store._mutex.acquire()
            try:
                # IMMEDIATE takes the write lock now, so the seq check and the insert see one state
                self.store._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                self.store._mutex.release()
                raise _write_error(self.store.path, exc, "start a write") from None
            except BaseException:
                self.store._mutex.release()
                raise
            return self.store._db

        def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
            # a failed statement or COMMIT is a StoreError, never a raw sqlite3 error, and the
            # transaction is rolled back: a COMMIT that fails leaves it open, and every later
            # write of this connection would fail to begin
            path = self.store.path
            try:
                if exc_type is None:
                    try:
                        self.store._db.execute("COMMIT")
                    except sqlite3.Error as error:
                        raise _write_error(path, error, "commit a write", self._roll_back()) from None
                    return
                more = self._roll_back()
                # a constraint's IntegrityError is left to the caller, which tells what it means
                # (a taken session id, seqs already held)
                if isinstance(exc, sqlite3.Error) and not (isinstance(exc, sqlite3.IntegrityError) and not more):
                    raise _write_error(path, exc, "write", more) from None
                if more:  # the transaction is still open: say so, keeping the error that ended it
                    msg = f"sqlite store {path}: a write ended by {exc_type.__name__} ({exc}){more}"
                    raise StoreError(msg) from exc
            finally:
                self.store._mutex.release()

        def _roll_back(self) -> str:
            """Roll back an open transaction; what went wrong doing so ("" when nothing did)."""
            try:
                if self.store._db.in_transaction:
                    self.store._db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                return f"; rolling the write back failed too ({exc})"
            return ""

    def _write(self) -> SqliteStore._Txn:
        return SqliteStore._Txn(self)

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._mutex:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                msg = f"sqlite store {self.path}: {exc}"
                raise StoreError(msg) from None

    # -- sessions ------------------------------------------------------------------------------
    def create(self, header: SessionHeader) -> None:
        check_session_id(header.id)
        body = orjson.dumps(header.to_dict()).decode()
        try:
            with self._write() as db:
                db.execute("INSERT INTO sessions (id, header, next_seq) VALUES (?, ?, 0)", (header.id, body))
        except sqlite3.IntegrityError:
            msg = f"session {header.id} already exists in {self.path}"
            raise SessionExistsError(msg) from None

    def exists(self, session_id: str) -> bool:
        check_session_id(session_id)
        return bool(self._query("SELECT 1 FROM sessions WHERE id = ?", (session_id,)))

    def header(self, session_id: str) -> SessionHeader:
        rows = self._query("SELECT header FROM sessions WHERE id = ?", (check_session_id(session_id),))
        if not rows:
            raise self._not_found(session_id)
        return decode_header(rows[0][0], f"{self.path}: session {session_id}", session_id)

    def list_sessions(self) -> list[str]:
        return [row[0] for row in self._query("SELECT id FROM sessions ORDER BY id")]

    def _stored_int(self, value: Any, what: str) -> int:
        """An INTEGER column's value; a row changed outside ctxkernel can hold text or a real."""
        if type(value) is not int:
            msg = f"{self.path}: {what} is {value!r:.40}; accepted: an integer. The database is corrupt"
            raise CorruptionError(msg)
        return value

    def _not_found(self, session_id: str) -> SessionNotFoundError:
        return SessionNotFoundError(f"no session {session_id!r} in {self.path}")

    # -- reading -------------------------------------------------------------------------------
    def next_seq(self, session_id: str) -> int:
        rows = self._query("SELECT next_seq FROM sessions WHERE id = ?", (check_session_id(session_id),))
        if not rows:
            raise self._not_found(session_id)
        return self._stored_int(rows[0][0], f"the next seq of session {session_id}")

    def read(self, session_id: str, start: int = 0, end: int | None = None) -> Iterator[Event]:
        # the end is fixed now: a reader sees the batches committed when it asked, never a part of one
        last = self.next_seq(session_id)
        return self._read(session_id, max(start, 0), last if end is None else min(end, last))

    def _read(self, session_id: str, start: int, end: int) -> Iterator[Event]:
        def fetch(seq: int, end: int, limit: int) -> list[tuple[int, Any]]:
            return self._query(
                "SELECT seq, body FROM events WHERE session = ? AND seq >= ? AND seq < ? ORDER BY seq LIMIT ?",
                (session_id, seq, end, limit),
            )

        return read_events(fetch, start, end, f"{self.path}: session {session_id}")

    def repair(self, session_id: str) -> RepairReport:
        next_seq = self.next_seq(session_id)
        count, top = self._query("SELECT count(*), max(seq) FROM events WHERE session = ?", (session_id,))[0]
        return check_bookkeeping(next_seq, count, top, f"{self.path}: session {session_id}")

    # -- writing -------------------------------------------------------------------------------
    def append(self, session_id: str, events: Sequence[Event], expected_seq: int) -> None:
        check_batch(events, expected_seq)
        check_session_id(session_id)
        # each event's type and stored form, flat: the multi-row inserts bind them in pairs
        typed_bodies = [part for e in events for part in (e.type, encode_event(e))]
        with self._relaxed_write() if self.sync_deferred() and self._synchronous == "FULL" else self._write() as db:
            found = db.execute("SELECT next_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if found is None:
                raise self._not_found(session_id)
            if self._stored_int(found[0], f"the next seq of session {session_id}") != expected_seq:
                raise ConflictError(session_id, expected_seq, found[0])
            try:
                offset, count = 0, len(events)
                while offset < count:
                    rows = min(INSERT_CHUNKS[0], 1 << ((count - offset).bit_length() - 1))  # the largest that fits
                    pairs = typed_bodies if rows == count else typed_bodies[2 * offset : 2 * (offset + rows)]
                    db.execute(_insert_events_sql(rows), [session_id, expected_seq + offset, *pairs])
                    offset += rows
            except sqlite3.IntegrityError as exc:
                msg = f"{self.path}: session {session_id} already holds seqs from {expected_seq} ({exc}); corrupt"
                raise CorruptionError(msg) from None
            db.execute("UPDATE sessions SET next_seq = ? WHERE id = ?", (expected_seq + len(events), session_id))

    # -- snapshots -----------------------------------------------------------------------------
    def snapshot_put(self, session_id: str, covers: int, body: bytes | bytearray) -> None:
        check_session_id(session_id)
        with self._mutex:
            # not synchronous: a snapshot is a cache verified on load, and a lost one costs a full
            # replay; the next durable commit's WAL sync carries its pages anyway
            self._db.execute("PRAGMA synchronous = OFF")
            try:
                with self._write() as db:
                    db.execute(
                        "INSERT INTO snapshots (session, covers, body) VALUES (?, ?, ?) "
                        "ON CONFLICT (session) DO UPDATE SET covers = excluded.covers, body = excluded.body "
                        "WHERE excluded.covers >= snapshots.covers",
                        (session_id, covers, body),
                    )
            except sqlite3.Error as exc:
                msg = f"sqlite store {self.path}: cannot write the snapshot of {session_id}: {exc}"
                raise StoreError(msg) from None
            finally:
                self._db.execute(f"PRAGMA synchronous = {self._synchronous}")

    def snapshot_get(self, session_id: str) -> tuple[int, bytes] | None:
        rows = self._query("SELECT covers, body FROM snapshots WHERE session = ?", (check_session_id(session_id),))
        if not rows:
            return None
        covers, body = rows[0]
        if type(covers) is not int or type(body) is not bytes:  # a row changed outside ctxkernel
            msg = (
                f"{self.path}: the snapshot row of session {session_id} holds covers {covers!r:.40} and a body "
                f"of type {type(body).__name__}; accepted: an integer and a BLOB"
            )
            raise CorruptionError(msg)
        return covers, body

    def snapshot_delete(self, session_id: str) -> None:
        check_session_id(session_id)
        with self._write() as db:
            db.execute("DELETE FROM snapshots WHERE session = ?", (session_id,))

    # -- key-value table -----------------------------------------------------------------------
    def kv_get(self, namespace: str, key: str) -> Any | None:
        rows = self._query(
            "SELECT value FROM kv WHERE namespace = ? AND key = ?",
            (check_kv_name("namespace", namespace), check_kv_name("key", key)),
        )
        if not rows:
            return None
        return decode_value(rows[0][0], f"{self.path}: key-value {namespace}/{key}")

    def kv_put(self, namespace: str, key: str, value: Any) -> None:
        check_kv_name("namespace", namespace)
        check_kv_name("key", key)
        body = encode_value(namespace, key, value)
        with self._write() as db:
            db.execute(
                "INSERT INTO kv (namespace, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value",
                (namespace, key, body),
            )

    def kv_delete(self, namespace: str, key: str) -> None:
        check_kv_name("namespace", namespace)
        check_kv_name("key", key)
        with self._write() as db:
            db.execute("DELETE FROM kv WHERE namespace = ? AND key = ?", (namespace, key))

    def kv_list(self, namespace: str, prefix: str = "") -> dict[str, Any]:
        rows = self._query(
            "SELECT key, value FROM kv WHERE namespace = ? AND substr(key, 1, ?) = ? ORDER BY key",
            (check_kv_name("namespace", namespace), len(prefix), prefix),
        )
        return {key: decode_value(value, f"{self.path}: key-value {namespace}/{key}") for key, value in rows}

    # -- leases ------------------------------------------------------------------------------
    # One database serves one host, so expiry is this host's wall clock. Lease writes commit with
    # synchronous=NORMAL (in WAL mode: no fsync at commit, never a corrupt database): a lease
    # only matters while its holder lives, and a power loss that could lose it ends every holder
    # on this host too. A deferred-sync append (base.SyncDeferral) commits the same way.
    @contextlib.contextmanager
    def _relaxed_write(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            self._db.execute("PRAGMA synchronous = NORMAL")
            try:
                with self._write() as db:
                    yield db
            finally:
                self._db.execute(f"PRAGMA synchronous = {self._synchronous}")

    def lease_acquire(self, name: str, holder: dict[str, Any], seconds: float, *, replace: str | None = None) -> Lease:
        token = check_lease_request(name, holder, seconds)
        with self._relaxed_write() as db:
            now = time.time()
            row = db.execute("SELECT token, holder, expires FROM leases WHERE name = ?", (name,)).fetchone()
            if row is not None and row[0] and row[0] != token and row[2] > now and row[0] != replace:
                return Lease(name, decode_value(row[1], f"{self.path}: lease {name}"), False, row[2] - now)
            db.execute(
                "INSERT INTO leases VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET token = excluded.token, "
                "holder = excluded.holder, expires = excluded.expires",
                (name, token, orjson.dumps(holder).decode(), now + seconds),
            )
        previous = None
        if row is not None and row[0] and row[0] != token:
            previous = decode_value(row[1], f"{self.path}: lease {name}")
        return Lease(name, holder, True, float(seconds), previous)

    def lease_renew(self, name: str, token: str, seconds: float) -> bool:
        check_lease_request(name, {"token": token}, seconds)
        with self._relaxed_write() as db:
            cur = db.execute(
                "UPDATE leases SET expires = ? WHERE name = ? AND token = ?", (time.time() + seconds, name, token)
            )
            return cur.rowcount == 1

    def lease_release(self, name: str, token: str) -> None:
        check_lease_request(name, {"token": token}, 1)
        with self._relaxed_write() as db:
            db.execute("DELETE FROM leases WHERE name = ? AND token = ?", (name, token))

    # -- blobs -----------------------------------------------------------------------------------
    def blob_put(self, key: str, data: bytes) -> BlobInfo:
        check_blob_key(key)
        data = check_blob_data(key, data)
        info = BlobInfo.of(key, data)
        chunks = blob_chunks(data)
        with self._write() as db:  # one transaction: a reader sees the old value or the new one
            db.execute("DELETE FROM blob_chunks WHERE key = ?", (key,))
            db.executemany(
                "INSERT INTO blob_chunks (key, idx, data) VALUES (?, ?, ?)",
                [(key, i, chunk) for i, chunk in enumerate(chunks)],
            )
            db.execute(
                "INSERT INTO blobs (key, size, sha256, chunks) VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE "
                "SET size = excluded.size, sha256 = excluded.sha256, chunks = excluded.chunks",
                (key, info.size, info.sha256, len(chunks)),
            )
        return info

    def blob_stat(self, key: str) -> BlobInfo | None:
        rows = self._query("SELECT size, sha256 FROM blobs WHERE key = ?", (check_blob_key(key),))
        return BlobInfo(key, self._stored_int(rows[0][0], f"the size of blob {key}"), rows[0][1]) if rows else None

    def blob_get(self, key: str) -> bytes | None:
        check_blob_key(key)
        with self._mutex:  # the row and its chunks read in one transaction: never a mix of two writes
            try:
                self._db.execute("BEGIN")
                try:
                    row = self._db.execute("SELECT size, sha256 FROM blobs WHERE key = ?", (key,)).fetchone()
                    chunks = self._db.execute(
                        "SELECT idx, data FROM blob_chunks WHERE key = ? ORDER BY idx", (key,)
                    ).fetchall()
                finally:
                    self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                msg = f"sqlite store {self.path}: {exc}"
                raise StoreError(msg) from None
        if row is None:
            return None
        return join_blob(
            BlobInfo(key, self._stored_int(row[0], f"the size of blob {key}"), row[1]),
            chunks,
            f"sqlite store {self.path}",
        )

    def blob_list(self, prefix: str = "") -> list[BlobInfo]:
        rows = self._query(
            "SELECT key, size, sha256 FROM blobs WHERE substr(key, 1, ?) = ? ORDER BY key",
            (len(check_blob_prefix(prefix)), prefix),
        )
        return [BlobInfo(key, self._stored_int(size, f"the size of blob {key}"), sha256) for key, size, sha256 in rows]

    def blob_delete(self, key: str) -> None:
        check_blob_key(key)
        with self._write() as db:
            db.execute("DELETE FROM blob_chunks WHERE key = ?", (key,))
            db.execute("DELETE FROM blobs WHERE key = ?", (key,))

    def close(self) -> None:
        with self._mutex, contextlib.suppress(sqlite3.Error):
            self._db.close()
