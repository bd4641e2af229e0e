"""The ``postgres`` backend: one store shared by the harness processes of several hosts.

Needs psycopg 3 (``pip install 'ctxkernel[postgres]'``). The connection string comes from the
profile (``[store] dsn``) or ``CTXKERNEL_STORE__DSN``; any libpq form works (URI or
``key=value``). Tables live in the connection's current schema (choose another one with libpq's
``options=-csearch_path=...``), all prefixed ``ctxkernel_``::

    ctxkernel_meta(name PRIMARY KEY, value)                       -- schema_version
    ctxkernel_sessions(id PRIMARY KEY, header TEXT, next_seq BIGINT)
    ctxkernel_events(session, seq, type, body TEXT, PRIMARY KEY (session, seq))
    ctxkernel_kv(namespace, key, value TEXT, PRIMARY KEY (namespace, key))
    ctxkernel_blobs(key PRIMARY KEY, size BIGINT, sha256 TEXT, chunks INT)
    ctxkernel_blob_chunks(key, idx, data BYTEA, PRIMARY KEY (key, idx))   -- at most 1 MiB a row
    ctxkernel_leases(name PRIMARY KEY, token, holder TEXT, expires TIMESTAMPTZ)  -- schema 2

The schema is created, upgraded (every step is ``IF NOT EXISTS``) and its version checked on first
use, under an advisory lock so that workers starting together do not race; a schema newer than
this ctxkernel is refused. Event bodies are stored as JSON *text*, not ``jsonb``:
``jsonb`` refuses ``\\u0000`` and reorders keys, and a store must return any Unicode exactly.

Optimistic concurrency across hosts: a batch is one transaction that first moves
``ctxkernel_sessions.next_seq`` from the expected value (``UPDATE ... WHERE next_seq = expected``:
the row lock orders concurrent writers, and the loser sees the new value and matches nothing),
then inserts the events; the primary key on ``(session, seq)`` backs this up. A stale writer gets
:class:`ConflictError` with nothing written; a writer that dies mid-batch has its transaction
rolled back by the server.

Connections: each store object keeps a :mod:`psycopg_pool` pool (``pool_size`` connections at
most, one opened eagerly). A call whose connection drops is retried once on a fresh connection;
the server rolled back the dropped transaction, and a drop during COMMIT (outcome unknown) is
settled by comparing what the store holds with the batch. Leases (``lease_*``) expire by the
server's clock.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import orjson

from ..errors import ConflictError, CorruptionError, SessionExistsError, SessionNotFoundError, StoreError
from ..events import Event
from ..redact import redact
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

T = TypeVar("T")
_log = logging.getLogger("ctxkernel.store.postgres")

SCHEMA_VERSION = 2
DSN_ENV = "CTXKERNEL_STORE__DSN"
#: connections each process's pool keeps at most (one per thread working on the store at once)
DEFAULT_POOL_SIZE = 4
#: attempts at a statement or transaction whose connection dropped (the first try included)
ATTEMPTS = 2

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS ctxkernel_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS ctxkernel_sessions (
        id TEXT PRIMARY KEY,
        header TEXT NOT NULL,
        next_seq BIGINT NOT NULL DEFAULT 0,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    """CREATE TABLE IF NOT EXISTS ctxkernel_events (
        session TEXT NOT NULL REFERENCES ctxkernel_sessions(id),
        seq BIGINT NOT NULL,
        type TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (session, seq)
    )""",
    """CREATE TABLE IF NOT EXISTS ctxkernel_kv (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (namespace, key)
    )""",
    # schema 2: leases (expiry by the server's clock; token '' = free)
    """CREATE TABLE IF NOT EXISTS ctxkernel_leases (
        name TEXT PRIMARY KEY,
        token TEXT NOT NULL,
        holder TEXT NOT NULL,
        expires TIMESTAMPTZ NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS ctxkernel_snapshots (
        session TEXT PRIMARY KEY REFERENCES ctxkernel_sessions(id),
        covers BIGINT NOT NULL,
        body BYTEA NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS ctxkernel_blobs (
        key TEXT PRIMARY KEY,
        size BIGINT NOT NULL,
        sha256 TEXT NOT NULL,
        chunks INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS ctxkernel_blob_chunks (
        key TEXT NOT NULL,
        idx INTEGER NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (key, idx)
    )""",
]


def redact_dsn(dsn: str) -> str:
    """The connection string as messages show it: the password masked, whatever the form (URI
    userinfo, ``password=`` pair or query parameter), even when libpq cannot parse it."""
    return redact(dsn)


_POOL_NUMBERS = itertools.count(1)


def _close_pool(pool: Any) -> None:
    """Close ``pool``; from one of its own threads (where the garbage collector may drop it) in a
    new thread, since a pool cannot join the thread that closes it."""
    if threading.current_thread().name.startswith(f"{pool.name}-"):
        threading.Thread(target=pool.close, name=f"{pool.name}-close", daemon=True).start()
    else:
        pool.close()


class _Dropped(Exception):  # internal signal, never raised out of this module
    """The connection broke under a call; carries the driver's error."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class PostgresStore(SyncDeferral):
    backend = "postgres"

    def __init__(
        self, dsn: str | None = None, *, connect_timeout: int = 10, pool_size: int = DEFAULT_POOL_SIZE
    ) -> None:
        dsn = dsn or os.environ.get(DSN_ENV)
        if not dsn:
            msg = (
                "the postgres store needs a connection string: set [store] dsn in the profile or "
                f"{DSN_ENV} (e.g. postgresql://user@host:5432/dbname)"
            )
            raise StoreError(msg)
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            msg = "the postgres store needs psycopg 3 and psycopg-pool: pip install 'ctxkernel[postgres]'"
            raise StoreError(msg) from None
        if not isinstance(pool_size, int) or not 1 <= pool_size <= 1000:
            msg = f"postgres store: pool_size must be an integer from 1 to 1000, got {pool_size!r}"
            raise StoreError(msg)
        self._psycopg = psycopg
        self.dsn = dsn
        self.where = redact_dsn(dsn)
        self.connect_timeout = connect_timeout
        self.pool_size = pool_size
        #: connections that broke under a call (each was retried once on a fresh one)
        self.dropped_connections = 0
        # one direct connection first: it migrates the schema, and a bad connection string or an
        # unreachable server fails here with libpq's own reason (a pool would only time out)
        conn = self._connect()
        try:
            self._migrate(conn)
        finally:
            conn.close()
        # autocommit: reads never leave a transaction open; writes use explicit transactions
        self._pool = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "connect_timeout": connect_timeout},
            timeout=max(connect_timeout, 1) * 3,
            name=f"ctxkernel-pool-{next(_POOL_NUMBERS)}",
            open=True,
        )
        # a store dropped without close() still closes its pool (and its connections)
        weakref.finalize(self, _close_pool, self._pool)

    # -- connection ------------------------------------------------------------------------------
    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(self.dsn, autocommit=True, connect_timeout=self.connect_timeout)
        except self._psycopg.Error as exc:
            # libpq quotes a malformed connection string in its error: redact that too
            msg = f"cannot connect to the postgres store {self.where}: {redact(str(exc).strip())}"
            raise StoreError(msg) from None

    def _error(self, exc: Exception) -> StoreError:
        return StoreError(f"postgres store {self.where}: {redact(str(exc).strip())}")

    def _once(self, work: Callable[[Any], T]) -> T:
        """Run ``work`` on a pooled connection; a connection that broke under it is
        :class:`_Dropped` (the pool discards it), any other driver error a :class:`StoreError`."""
        from psycopg_pool import PoolTimeout

        try:
            with self._pool.connection() as conn:
                try:
                    return work(conn)
                except self._psycopg.Error as exc:
                    if conn.broken or conn.closed:
                        raise _Dropped(exc) from None
                    raise self._error(exc) from None
        except PoolTimeout as exc:
            msg = (
                f"postgres store {self.where}: no connection within {self._pool.timeout:g} s "
                f"(all {self.pool_size} of this process's pool busy, or the server unreachable: {exc})"
            )
            raise StoreError(msg) from None
        except self._psycopg.OperationalError as exc:  # the pool could not hand out a live connection
            raise _Dropped(exc) from None

    def _retrying(self, work: Callable[[Any], T], *, what: str, settle: Callable[[Any], T] | None = None) -> T:
        """Run ``work`` (one statement, or one transaction) and retry it once on a fresh
        connection when its connection dropped. The server rolls back a transaction whose
        connection drops, so a retry never doubles a write; only a drop during COMMIT leaves the
        outcome unknown, and ``settle`` (run instead of ``work`` on the retry) decides it from
        what the store holds. A second drop is a :class:`StoreError` saying so."""
        try:
            return self._once(work)
        except _Dropped as first:
            self.dropped_connections += 1
            _log.warning(
                "postgres store %s: connection dropped during %s (%s); retrying", self.where, what, first.error
            )
        try:
            return self._once(settle or work)
        except _Dropped as second:
            self.dropped_connections += 1
            msg = (
                f"postgres store {self.where}: the connection dropped twice during {what} "
                f"({redact(' '.join(str(second.error).split()))}); a write is applied wholly or not at all, "
                "so read the store to see which"
            )
            raise StoreError(msg) from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._retrying(lambda conn: conn.execute(sql, params).fetchall(), what="query")

    def _migrate(self, conn: Any) -> None:
        try:
            with conn.transaction():
                schema = conn.execute("SELECT current_schema()").fetchone()[0]
                if schema is None:
                    msg = (
                        f"postgres store {self.where}: the connection has no schema to create tables in; "
                        "create the schema named by search_path or fix search_path"
                    )
                    raise StoreError(msg)
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('ctxkernel schema ' || current_schema()))")
                row = conn.execute(
                    "SELECT value FROM ctxkernel_meta WHERE name = 'schema_version'"
                    if conn.execute("SELECT to_regclass('ctxkernel_meta')").fetchone()[0]
                    else "SELECT NULL WHERE false"
                ).fetchone()
                if row is not None and int(row[0]) > SCHEMA_VERSION:
                    msg = (
                        f"postgres store {self.where}: schema version {row[0]} is newer than this ctxkernel "
                        f"reads ({SCHEMA_VERSION}); upgrade ctxkernel"
                    )
                    raise StoreError(msg)
                # every step is idempotent (IF NOT EXISTS): a newer version only adds to the schema
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO ctxkernel_meta VALUES ('schema_version', %s) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (str(SCHEMA_VERSION),),
                )
        except self._psycopg.Error as exc:
            raise self._error(exc) from None
        self.schema = schema

    @property
    def schema_version(self) -> int:
        return int(self._query("SELECT value FROM ctxkernel_meta WHERE name = 'schema_version'")[0][0])

    # -- sessions --------------------------------------------------------------------------------
    def _not_found(self, session_id: str) -> SessionNotFoundError:
        return SessionNotFoundError(f"no session {session_id!r} in the postgres store {self.where} ({self.schema})")

    def create(self, header: SessionHeader) -> None:
        check_session_id(header.id)
        body = orjson.dumps(header.to_dict()).decode()

        def insert(conn: Any) -> bool:
            sql = "INSERT INTO ctxkernel_sessions (id, header) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING"
            inserted: int = conn.execute(sql, (header.id, body)).rowcount
            return inserted == 1

        def settle(conn: Any) -> bool:  # after a drop: our own insert may have committed
            if insert(conn):
                return True
            row = conn.execute("SELECT header FROM ctxkernel_sessions WHERE id = %s", (header.id,)).fetchone()
            return row is not None and row[0] == body

        if not self._retrying(insert, what=f"creating session {header.id}", settle=settle):
            msg = f"session {header.id} already exists in the postgres store {self.where}"
            raise SessionExistsError(msg)

    def exists(self, session_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM ctxkernel_sessions WHERE id = %s", (check_session_id(session_id),)))

    def header(self, session_id: str) -> SessionHeader:
        rows = self._query("SELECT header FROM ctxkernel_sessions WHERE id = %s", (check_session_id(session_id),))
        if not rows:
            raise self._not_found(session_id)
        return decode_header(rows[0][0], f"postgres store {self.where}: session {session_id}", session_id)

    def list_sessions(self) -> list[str]:
        return [row[0] for row in self._query('SELECT id FROM ctxkernel_sessions ORDER BY id COLLATE "C"')]

    # -- reading ---------------------------------------------------------------------------------
    def next_seq(self, session_id: str) -> int:
        rows = self._query("SELECT next_seq FROM ctxkernel_sessions WHERE id = %s", (check_session_id(session_id),))
        if not rows:
            raise self._not_found(session_id)
        return int(rows[0][0])

    def read(self, session_id: str, start: int = 0, end: int | None = None) -> Iterator[Event]:
        # the end is fixed now: the reader sees the batches committed when it asked, never part of one
        last = self.next_seq(session_id)
        return self._read(session_id, max(start, 0), last if end is None else min(end, last))

    def _read(self, session_id: str, start: int, end: int) -> Iterator[Event]:
        def fetch(seq: int, end: int, limit: int) -> list[tuple[int, Any]]:
            return self._query(
                "SELECT seq, body FROM ctxkernel_events WHERE session = %s AND seq >= %s AND seq < %s "
                "ORDER BY seq LIMIT %s",
                (session_id, seq, end, limit),
            )

        return read_events(fetch, start, end, f"postgres store {self.where}: session {session_id}")

    def repair(self, session_id: str) -> RepairReport:
        next_seq = self.next_seq(session_id)
        count, top = self._query("SELECT count(*), max(seq) FROM ctxkernel_events WHERE session = %s", (session_id,))[0]
        return check_bookkeeping(next_seq, count, top, f"postgres store {self.where}: session {session_id}")

    # -- writing ---------------------------------------------------------------------------------
    def append(self, session_id: str, events: Sequence[Event], expected_seq: int) -> None:
        check_batch(events, expected_seq)
        check_session_id(session_id)
        rows = [(session_id, e.seq, e.type, encode_event(e)) for e in events]
        psycopg = self._psycopg
        deferred = self.sync_deferred()  # read on this thread: the retries below may run elsewhere

        def write(conn: Any, *, after_drop: bool = False) -> None:
            with conn.transaction(), conn.cursor() as cur:
                if deferred:  # the next synchronous commit flushes the WAL up to and past this one
                    cur.execute("SET LOCAL synchronous_commit TO OFF")
                cur.execute(
                    "UPDATE ctxkernel_sessions SET next_seq = %s WHERE id = %s AND next_seq = %s RETURNING 1",
                    (expected_seq + len(rows), session_id, expected_seq),
                )
                if cur.fetchone() is not None:
                    try:
                        cur.executemany(
                            "INSERT INTO ctxkernel_events (session, seq, type, body) VALUES (%s, %s, %s, %s)", rows
                        )
                    except psycopg.errors.UniqueViolation as exc:
                        msg = (
                            f"postgres store {self.where}: session {session_id} already holds seqs from "
                            f"{expected_seq} although its next seq said otherwise ({str(exc).strip()}); corrupt"
                        )
                        raise CorruptionError(msg) from None
                    return
                found = cur.execute("SELECT next_seq FROM ctxkernel_sessions WHERE id = %s", (session_id,)).fetchone()
                if found is None:
                    raise self._not_found(session_id)
                if after_drop and self._holds_batch(cur, rows):
                    return  # the first attempt's COMMIT landed before its connection dropped
                raise ConflictError(session_id, expected_seq, int(found[0]))

        self._retrying(
            write,
            what=f"appending seqs {expected_seq}..{expected_seq + len(rows) - 1} to session {session_id}",
            settle=lambda conn: write(conn, after_drop=True),
        )

    @staticmethod
    def _holds_batch(cur: Any, rows: Sequence[tuple[str, int, str, str]]) -> bool:
        """True when the store holds exactly this batch (same seqs, same bytes)."""
        session_id, first, last = rows[0][0], rows[0][1], rows[-1][1]
        stored = cur.execute(
            "SELECT seq, body FROM ctxkernel_events WHERE session = %s AND seq >= %s AND seq <= %s ORDER BY seq",
            (session_id, first, last),
        ).fetchall()
        return [(seq, body) for seq, body in stored] == [(seq, body) for _, seq, _, body in rows]

    # -- snapshots -------------------------------------------------------------------------------
    def snapshot_put(self, session_id: str, covers: int, body: bytes | bytearray) -> None:
        check_session_id(session_id)

        def put(conn: Any) -> None:  # replaces the newer-or-equal snapshot whole: a retry is harmless
            with conn.transaction():
                # a snapshot is a cache verified on load: its commit need not wait for the WAL flush
                conn.execute("SET LOCAL synchronous_commit = off")
                conn.execute(
                    "INSERT INTO ctxkernel_snapshots (session, covers, body) VALUES (%s, %s, %s) "
                    "ON CONFLICT (session) DO UPDATE SET covers = excluded.covers, body = excluded.body "
                    "WHERE excluded.covers >= ctxkernel_snapshots.covers",
                    (session_id, covers, body),
                )

        self._retrying(put, what=f"writing the snapshot of session {session_id}")

    def snapshot_get(self, session_id: str) -> tuple[int, bytes] | None:
        rows = self._query(
            "SELECT covers, body FROM ctxkernel_snapshots WHERE session = %s", (check_session_id(session_id),)
        )
        if not rows:
            return None
        covers, body = rows[0]
        return int(covers), bytes(body)

    def snapshot_delete(self, session_id: str) -> None:
        self._query("DELETE FROM ctxkernel_snapshots WHERE session = %s RETURNING 1", (check_session_id(session_id),))

    # -- key-value table -------------------------------------------------------------------------
    def kv_get(self, namespace: str, key: str) -> Any | None:
        rows = self._query(
            "SELECT value FROM ctxkernel_kv WHERE namespace = %s AND key = %s",
            (check_kv_name("namespace", namespace), check_kv_name("key", key)),
        )
        if not rows:
            return None
        return decode_value(rows[0][0], f"postgres store {self.where}: key-value {namespace}/{key}")

    def kv_put(self, namespace: str, key: str, value: Any) -> None:
        check_kv_name("namespace", namespace)
        check_kv_name("key", key)
        body = encode_value(namespace, key, value)
        self._query(
            "INSERT INTO ctxkernel_kv (namespace, key, value) VALUES (%s, %s, %s) "
            "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value RETURNING 1",
            (namespace, key, body),
        )

    def kv_delete(self, namespace: str, key: str) -> None:
        check_kv_name("namespace", namespace)
        check_kv_name("key", key)
        self._query("DELETE FROM ctxkernel_kv WHERE namespace = %s AND key = %s RETURNING 1", (namespace, key))

    def kv_list(self, namespace: str, prefix: str = "") -> dict[str, Any]:
        rows = self._query(
            'SELECT key, value FROM ctxkernel_kv WHERE namespace = %s AND left(key, %s) = %s ORDER BY key COLLATE "C"',
            (check_kv_name("namespace", namespace), len(prefix), prefix),
        )
        where = f"postgres store {self.where}: key-value {namespace}"
        return {key: decode_value(value, f"{where}/{key}") for key, value in rows}

    # -- leases ------------------------------------------------------------------------------------
    # Expiry is the server's clock_timestamp(), never a worker's clock: workers on hosts whose
    # clocks disagree still agree on whether a lease has expired. Lease writes commit without
    # waiting for the WAL flush (synchronous_commit off, for that transaction only): the WAL is
    # written in order, so the lease is durable before the compaction/start appended after it,
    # and a lease a server crash loses at most lets a worker take over early, which the log's seq
    # check still fences.
    _LEASE_WRITE = "SET LOCAL synchronous_commit = off"

    def _lease_write(self, sql: str, params: Sequence[Any], what: str) -> bool:
        def write(conn: Any) -> bool:
            with conn.transaction():
                conn.execute(self._LEASE_WRITE)
                written: int = conn.execute(sql, params).rowcount
                return written == 1

        return self._retrying(write, what=what)

    def lease_acquire(self, name: str, holder: dict[str, Any], seconds: float, *, replace: str | None = None) -> Lease:
        token = check_lease_request(name, holder, seconds)
        body = orjson.dumps(holder).decode()

        def acquire(conn: Any) -> Lease:
            with conn.transaction():
                conn.execute(self._LEASE_WRITE)
                # the row exists (free: token '') before it is locked, so two first takers queue on it
                conn.execute(
                    "INSERT INTO ctxkernel_leases VALUES (%s, '', '{}', '-infinity') ON CONFLICT (name) DO NOTHING",
                    (name,),
                )
                cur_token, cur_holder, expired, remaining = conn.execute(
                    "SELECT token, holder, expires <= clock_timestamp(), "
                    "extract(epoch FROM greatest(expires, clock_timestamp()) - clock_timestamp()) "
                    "FROM ctxkernel_leases WHERE name = %s FOR UPDATE",
                    (name,),
                ).fetchone()
                if cur_token and cur_token != token and not expired and cur_token != replace:
                    return Lease(name, decode_value(cur_holder, f"lease {name}"), False, float(remaining))
                conn.execute(
                    "UPDATE ctxkernel_leases SET token = %s, holder = %s, "
                    "expires = clock_timestamp() + make_interval(secs => %s) WHERE name = %s",
                    (token, body, float(seconds), name),
                )
                previous = decode_value(cur_holder, f"lease {name}") if cur_token and cur_token != token else None
                return Lease(name, holder, True, float(seconds), previous)

        return self._retrying(acquire, what=f"taking lease {name}")

    def lease_renew(self, name: str, token: str, seconds: float) -> bool:
        check_lease_request(name, {"token": token}, seconds)
        return self._lease_write(
            "UPDATE ctxkernel_leases SET expires = clock_timestamp() + make_interval(secs => %s) "
            "WHERE name = %s AND token = %s",
            (float(seconds), name, token),
            f"renewing lease {name}",
        )

    def lease_release(self, name: str, token: str) -> None:
        check_lease_request(name, {"token": token}, 1)
        self._lease_write(
            "DELETE FROM ctxkernel_leases WHERE name = %s AND token = %s", (name, token), f"releasing lease {name}"
        )

    # -- blobs -------------------------------------------------------------------------------------
    def blob_put(self, key: str, data: bytes) -> BlobInfo:
        check_blob_key(key)
        data = check_blob_data(key, data)
        info = BlobInfo.of(key, data)
        chunks = blob_chunks(data)

        def put(conn: Any) -> None:  # replaces the whole value: a retry after a lost COMMIT is harmless
            with conn.transaction(), conn.cursor() as cur:
                # the upsert locks the key's row first, so two writers of one key take turns
                # and the second replaces the first's chunks whole
                cur.execute(
                    "INSERT INTO ctxkernel_blobs (key, size, sha256, chunks) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET size = excluded.size, sha256 = excluded.sha256, "
                    "chunks = excluded.chunks",
                    (key, info.size, info.sha256, len(chunks)),
                )
                cur.execute("DELETE FROM ctxkernel_blob_chunks WHERE key = %s", (key,))
                cur.executemany(
                    "INSERT INTO ctxkernel_blob_chunks (key, idx, data) VALUES (%s, %s, %s)",
                    [(key, i, chunk) for i, chunk in enumerate(chunks)],
                )

        self._retrying(put, what=f"writing blob {key}")
        return info

    def blob_stat(self, key: str) -> BlobInfo | None:
        rows = self._query("SELECT size, sha256 FROM ctxkernel_blobs WHERE key = %s", (check_blob_key(key),))
        return BlobInfo(key, int(rows[0][0]), rows[0][1]) if rows else None

    def blob_get(self, key: str) -> bytes | None:
        check_blob_key(key)

        def get(conn: Any) -> tuple[Any, list[Any]]:
            # one repeatable-read snapshot: the row and its chunks come from the same write
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                row = conn.execute("SELECT size, sha256 FROM ctxkernel_blobs WHERE key = %s", (key,)).fetchone()
                chunks = conn.execute(
                    "SELECT idx, data FROM ctxkernel_blob_chunks WHERE key = %s ORDER BY idx", (key,)
                ).fetchall()
            return row, chunks

        row, chunks = self._retrying(get, what=f"reading blob {key}")
        if row is None:
            return None
        return join_blob(BlobInfo(key, int(row[0]), row[1]), chunks, f"postgres store {self.where}")

    def blob_list(self, prefix: str = "") -> list[BlobInfo]:
        rows = self._query(
            'SELECT key, size, sha256 FROM ctxkernel_blobs WHERE left(key, %s) = %s ORDER BY key COLLATE "C"',
            (len(check_blob_prefix(prefix)), prefix),
        )
        return [BlobInfo(key, int(size), sha256) for key, size, sha256 in rows]

    def blob_delete(self, key: str) -> None:
        check_blob_key(key)

        def delete(conn: Any) -> None:
            with conn.transaction():
                conn.execute("DELETE FROM ctxkernel_blobs WHERE key = %s", (key,))
                conn.execute("DELETE FROM ctxkernel_blob_chunks WHERE key = %s", (key,))

        self._retrying(delete, what=f"deleting blob {key}")

    # -- cross-process locks ---------------------------------------------------------------------
    def hold_lock(self, name: str, timeout: float) -> AdvisoryLock | None:
        """Take the advisory lock ``name`` (any text) on a connection of its own, waiting at
        most ``timeout`` seconds; None when another holder still has it then.

        Front doors use it to order the requests of one session across processes and hosts
        (``ctxkernel serve`` with several workers). The lock is the server's: it is released by
        :meth:`AdvisoryLock.release`, when its connection closes, and when its holder dies."""
        conn = self._connect()  # its error is redacted: libpq may quote the connection string
        try:
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{max(1, int(timeout * 1000))}ms",))
            conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"ctxkernel lock {name}",))
        except self._psycopg.errors.LockNotAvailable:
            conn.close()
            return None
        except self._psycopg.Error as exc:
            conn.close()
            raise self._error(exc) from None
        return AdvisoryLock(conn, name)

    def close(self) -> None:
        self._pool.close()


class AdvisoryLock:
    """A held :meth:`PostgresStore.hold_lock`; ``release()`` may be called more than once."""

    def __init__(self, conn: Any, name: str) -> None:
        self._conn = conn
        self.name = name

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (f"ctxkernel lock {self.name}",))
        except Exception:  # closing the connection below releases the lock anyway
            pass
        finally:
            conn.close()
