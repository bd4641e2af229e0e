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

The schema is created (and its version checked) on first use, under an advisory lock so that
workers starting together do not race. Event bodies are stored as JSON *text*, not ``jsonb``:
``jsonb`` refuses ``\\u0000`` and reorders keys, and a store must return any Unicode exactly.

Optimistic concurrency across hosts: a batch is one transaction that first moves
``ctxkernel_sessions.next_seq`` from the expected value (``UPDATE ... WHERE next_seq = expected``:
the row lock orders concurrent writers, and the loser sees the new value and matches nothing),
then inserts the events; the primary key on ``(session, seq)`` backs this up. A stale writer gets
:class:`ConflictError` with nothing written; a writer that dies mid-batch has its transaction
rolled back by the server.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from ..errors import ConflictError, CorruptionError, SessionExistsError, SessionNotFoundError, StoreError
from ..events import Event
from ..redact import redact
from .base import (
    BlobInfo,
    RepairReport,
    SessionHeader,
    check_batch,
    check_blob_data,
    check_blob_key,
    check_blob_prefix,
    check_kv_name,
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

SCHEMA_VERSION = 1
DSN_ENV = "CTXKERNEL_STORE__DSN"

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


class PostgresStore:
    backend = "postgres"

    def __init__(self, dsn: str | None = None, *, connect_timeout: int = 10) -> None:
        dsn = dsn or os.environ.get(DSN_ENV)
        if not dsn:
            msg = (
                "the postgres store needs a connection string: set [store] dsn in the profile or "
                f"{DSN_ENV} (e.g. postgresql://user@host:5432/dbname)"
            )
            raise StoreError(msg)
        try:
            import psycopg
        except ImportError:
            msg = "the postgres store needs psycopg 3: pip install 'ctxkernel[postgres]'"
            raise StoreError(msg) from None
        self._psycopg = psycopg
        self.dsn = dsn
        self.where = redact_dsn(dsn)
        self.connect_timeout = connect_timeout
        self._mutex = threading.RLock()
        self._conn: Any = None
        self._connect()
        self._migrate()

    # -- connection ------------------------------------------------------------------------------
    def _connect(self) -> Any:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        try:
            # autocommit: reads never leave a transaction open; writes use explicit transactions
            self._conn = self._psycopg.connect(self.dsn, autocommit=True, connect_timeout=self.connect_timeout)
        except self._psycopg.Error as exc:
            # libpq quotes a malformed connection string in its error: redact that too
            msg = f"cannot connect to the postgres store {self.where}: {redact(str(exc).strip())}"
            raise StoreError(msg) from None
        return self._conn

    def _error(self, exc: Exception) -> StoreError:
        return StoreError(f"postgres store {self.where}: {redact(str(exc).strip())}")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._mutex:
            conn = self._connect()
            try:
                return conn.execute(sql, params).fetchall()
            except self._psycopg.Error as exc:
                raise self._error(exc) from None

    def _migrate(self) -> None:
        with self._mutex:
            conn = self._connect()
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
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    row = conn.execute("SELECT value FROM ctxkernel_meta WHERE name = 'schema_version'").fetchone()
                    if row is None:
                        conn.execute("INSERT INTO ctxkernel_meta VALUES ('schema_version', %s)", (str(SCHEMA_VERSION),))
                    elif int(row[0]) > SCHEMA_VERSION:
                        msg = (
                            f"postgres store {self.where}: schema version {row[0]} is newer than this ctxkernel "
                            f"reads ({SCHEMA_VERSION}); upgrade ctxkernel"
                        )
                        raise StoreError(msg)
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
        with self._mutex:
            conn = self._connect()
            try:
                cur = conn.execute(
                    "INSERT INTO ctxkernel_sessions (id, header) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
                    (header.id, body),
                )
            except self._psycopg.Error as exc:
                raise self._error(exc) from None
            if cur.rowcount != 1:
                msg = f"session {header.id} already exists in the postgres store {self.where}"
                raise SessionExistsError(msg)

    def exists(self, session_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM ctxkernel_sessions WHERE id = %s", (check_session_id(session_id),)))

    def header(self, session_id: str) -> SessionHeader:
        rows = self._query("SELECT header FROM ctxkernel_sessions WHERE id = %s", (check_session_id(session_id),))
        if not rows:
            raise self._not_found(session_id)
        return decode_header(rows[0][0], f"postgres store {self.where}: session {session_id}")

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
        with self._mutex:
            conn = self._connect()
            try:
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute(
                        "UPDATE ctxkernel_sessions SET next_seq = %s WHERE id = %s AND next_seq = %s RETURNING 1",
                        (expected_seq + len(rows), session_id, expected_seq),
                    )
                    if cur.fetchone() is None:
                        found = cur.execute(
                            "SELECT next_seq FROM ctxkernel_sessions WHERE id = %s", (session_id,)
                        ).fetchone()
                        if found is None:
                            raise self._not_found(session_id)
                        raise ConflictError(session_id, expected_seq, int(found[0]))
                    cur.executemany(
                        "INSERT INTO ctxkernel_events (session, seq, type, body) VALUES (%s, %s, %s, %s)", rows
                    )
            except psycopg.errors.UniqueViolation as exc:
                msg = (
                    f"postgres store {self.where}: session {session_id} already holds seqs from {expected_seq} "
                    f"although its next seq said otherwise ({str(exc).strip()}); corrupt"
                )
                raise CorruptionError(msg) from None
            except psycopg.Error as exc:
                raise self._error(exc) from None

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

    # -- blobs -------------------------------------------------------------------------------------
    def blob_put(self, key: str, data: bytes) -> BlobInfo:
        check_blob_key(key)
        data = check_blob_data(key, data)
        info = BlobInfo.of(key, data)
        chunks = blob_chunks(data)
        with self._mutex:
            conn = self._connect()
            try:
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
            except self._psycopg.Error as exc:
                raise self._error(exc) from None
        return info

    def blob_stat(self, key: str) -> BlobInfo | None:
        rows = self._query("SELECT size, sha256 FROM ctxkernel_blobs WHERE key = %s", (check_blob_key(key),))
        return BlobInfo(key, int(rows[0][0]), rows[0][1]) if rows else None

    def blob_get(self, key: str) -> bytes | None:
        check_blob_key(key)
        with self._mutex:
            conn = self._connect()
            try:
                # one repeatable-read snapshot: the row and its chunks come from the same write
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    row = conn.execute("SELECT size, sha256 FROM ctxkernel_blobs WHERE key = %s", (key,)).fetchone()
                    chunks = conn.execute(
                        "SELECT idx, data FROM ctxkernel_blob_chunks WHERE key = %s ORDER BY idx", (key,)
                    ).fetchall()
            except self._psycopg.Error as exc:
                raise self._error(exc) from None
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
        with self._mutex:
            conn = self._connect()
            try:
                with conn.transaction():
                    conn.execute("DELETE FROM ctxkernel_blobs WHERE key = %s", (key,))
                    conn.execute("DELETE FROM ctxkernel_blob_chunks WHERE key = %s", (key,))
            except self._psycopg.Error as exc:
                raise self._error(exc) from None

    # -- cross-process locks ---------------------------------------------------------------------
    def hold_lock(self, name: str, timeout: float) -> AdvisoryLock | None:
        """Take the advisory lock ``name`` (any text) on a connection of its own, waiting at
        most ``timeout`` seconds; None when another holder still has it then.

        Front doors use it to order the requests of one session across processes and hosts
        (``ctxkernel serve`` with several workers). The lock is the server's: it is released by
        :meth:`AdvisoryLock.release`, when its connection closes, and when its holder dies."""
        try:
            conn = self._psycopg.connect(self.dsn, autocommit=True, connect_timeout=self.connect_timeout)
        except self._psycopg.Error as exc:
            msg = f"cannot connect to the postgres store {self.where}: {str(exc).strip()}"
            raise StoreError(msg) from None
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
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


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
        except Exception:  # noqa: BLE001, S110 - closing the connection below releases the lock anyway
            pass
        finally:
            conn.close()
