"""A postgres connection dropped in the middle of a write: retried, or a clear error, never half
applied. The drops are real: the server terminates the worker's own backend from a trigger
(``pg_terminate_backend``) in the middle of the transaction, or a loopback proxy cuts the
connection after forwarding COMMIT and before the server's answer reaches the worker (the worst
moment: the write landed, the worker cannot know)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from ctxkernel import Kernel
from ctxkernel.errors import StoreError
from ctxkernel.store.postgres import PostgresStore
from ctxkernel.testing import make_profile
from ctxkernel.testing.store import batch, dump, header, holder, postgres_dsn, postgres_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn():
    with postgres_schema(postgres_dsn()) as schema_dsn:
        yield schema_dsn


def kill_inside(dsn: str, table: str, times: int) -> None:
    """The next ``times`` writes to ``table`` terminate their own backend mid-transaction (a
    sequence counts them: it is not rolled back with the transaction it kills)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE IF NOT EXISTS test_kills")
        conn.execute(
            f"""CREATE OR REPLACE FUNCTION test_kill() RETURNS trigger AS $$
            BEGIN
                IF nextval('test_kills') <= {int(times)} THEN
                    PERFORM pg_terminate_backend(pg_backend_pid());
                    PERFORM pg_sleep(5);  -- the termination lands here, inside the transaction
                END IF;
                RETURN NULL;
            END $$ LANGUAGE plpgsql"""
        )
        conn.execute(f"CREATE TRIGGER test_kill AFTER INSERT OR UPDATE ON {table} EXECUTE FUNCTION test_kill()")


def test_a_batch_whose_connection_drops_mid_transaction_is_retried_and_applied_once(dsn):
    store = PostgresStore(dsn)
    store.create(header("s"))
    store.append("s", batch(0, 3), 0)
    kill_inside(dsn, "ctxkernel_events", times=1)
    store.append("s", batch(3, 4), 3)
    assert store.dropped_connections == 1
    assert dump(store, "s") == [e.to_dict() for e in batch(0, 7)]
    assert store.next_seq("s") == 7
    store.close()


def test_a_batch_whose_connection_drops_twice_fails_clearly_and_writes_nothing(dsn):
    store = PostgresStore(dsn)
    store.create(header("s"))
    store.append("s", batch(0, 3), 0)
    before = dump(store, "s")
    kill_inside(dsn, "ctxkernel_events", times=2)
    with pytest.raises(StoreError, match="dropped twice during appending seqs 3..6 to session s"):
        store.append("s", batch(3, 4), 3)
    assert dump(store, "s") == before and store.next_seq("s") == 3  # nothing of it landed
    store.append("s", batch(3, 4), 3)  # the same batch again, now that the server lets it through
    assert dump(store, "s") == [e.to_dict() for e in batch(0, 7)]
    store.close()


def test_a_lease_whose_connection_drops_mid_transaction_is_retried(dsn):
    store = PostgresStore(dsn)
    kill_inside(dsn, "ctxkernel_leases", times=1)
    a = holder("a")
    assert store.lease_acquire("compaction/s", a, 30).acquired
    assert store.dropped_connections == 1
    assert not store.lease_acquire("compaction/s", holder("b"), 30).acquired
    store.close()


class CommitCutter:
    """A loopback TCP proxy to the test server that, when armed, forwards a COMMIT and then cuts
    both connections before the server's answer reaches the client."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.cuts_left = 0
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            hold = threading.Event()
            threading.Thread(target=self._to_server, args=(client, server, hold), daemon=True).start()
            threading.Thread(target=self._to_client, args=(server, client, hold), daemon=True).start()

    @staticmethod
    def _read(sock: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError
            data += chunk
        return data

    def _to_server(self, client: socket.socket, server: socket.socket, hold: threading.Event) -> None:
        try:
            (length,) = struct.unpack("!I", self._read(client, 4))  # the startup packet: no type byte
            server.sendall(struct.pack("!I", length) + self._read(client, length - 4))
            while True:
                kind = self._read(client, 1)
                (length,) = struct.unpack("!I", self._read(client, 4))
                body = self._read(client, length - 4)
                commit = kind == b"Q" and body.rstrip(b"\0").strip().upper() == b"COMMIT"
                if commit and self.cuts_left > 0:
                    self.cuts_left -= 1
                    hold.set()  # the server's answer to this COMMIT never reaches the client
                    server.sendall(kind + struct.pack("!I", length) + body)
                    time.sleep(0.3)  # the server commits (and answers into the void)
                    self.cuts += 1
                    raise ConnectionError
                server.sendall(kind + struct.pack("!I", length) + body)
        except (ConnectionError, OSError):
            pass
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    @staticmethod
    def _to_client(server: socket.socket, client: socket.socket, hold: threading.Event) -> None:
        try:
            while chunk := server.recv(65536):
                if hold.is_set():
                    return
                client.sendall(chunk)
        except OSError:
            pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()


@pytest.fixture
def cutter(dsn) -> Iterator[tuple[CommitCutter, str]]:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    proxy = CommitCutter(str(info.get("host", "127.0.0.1")), int(info.get("port", 5432)))
    info.update(host="127.0.0.1", port=str(proxy.port), sslmode="disable", gssencmode="disable")
    yield proxy, psycopg.conninfo.make_conninfo(**info)
    proxy.close()


def test_a_commit_whose_answer_is_lost_is_settled_as_applied(cutter):
    proxy, dsn = cutter
    store = PostgresStore(dsn)
    store.create(header("s"))
    store.append("s", batch(0, 3), 0)
    proxy.cuts_left = 1
    store.append("s", batch(3, 4), 3)  # landed, its answer lost: the retry finds it and returns
    assert proxy.cuts == 1 and store.dropped_connections == 1
    assert dump(store, "s") == [e.to_dict() for e in batch(0, 7)]
    store.append("s", batch(7, 1), 7)
    assert store.next_seq("s") == 8
    store.close()


def test_a_lost_commit_answer_twice_is_a_clear_error_and_the_batch_is_whole(cutter):
    proxy, dsn = cutter
    store = PostgresStore(dsn)
    store.create(header("s"))
    proxy.cuts_left = 2  # the write's COMMIT, then the retry's
    with pytest.raises(StoreError, match="dropped twice.*applied wholly or not at all"):
        store.append("s", batch(0, 5), 0)
    assert proxy.cuts == 2
    assert dump(store, "s") == [e.to_dict() for e in batch(0, 5)]  # wholly: the first COMMIT landed
    store.close()


def test_a_session_survives_a_lost_commit_answer(cutter, tmp_path):
    proxy, dsn = cutter
    kernel = Kernel(make_profile(store={"backend": "postgres", "dsn": dsn}), home=tmp_path, entry_points=False)
    session = kernel.open_session()
    session.user("first")
    proxy.cuts_left = 1
    session.user("second")  # acknowledged although the store never heard its COMMIT's answer
    session.user("third")
    assert proxy.cuts == 1
    reopened = Kernel(
        make_profile(store={"backend": "postgres", "dsn": dsn}), home=tmp_path, entry_points=False
    ).open_session(session.id)
    assert [n.message.text for n in reopened.surface] == ["first", "second", "third"]
    assert [e.to_dict() for e in reopened.events] == [e.to_dict() for e in session.events]
