"""The postgres backend beyond the conformance suite: connection string, schema, errors."""

from __future__ import annotations

import threading

import orjson
import psycopg
import pytest

from ctxkernel import Kernel
from ctxkernel.errors import CorruptionError, StoreError
from ctxkernel.profile import StoreSettings, load_profile
from ctxkernel.store import store_from_settings
from ctxkernel.store.postgres import SCHEMA_VERSION, PostgresStore
from ctxkernel.testing import make_profile
from ctxkernel.testing.store import batch, header, postgres_dsn, postgres_schema


def test_missing_connection_string_says_where_to_set_it(monkeypatch):
    monkeypatch.delenv("CTXKERNEL_STORE__DSN", raising=False)
    with pytest.raises(StoreError, match=r"\[store\] dsn.*CTXKERNEL_STORE__DSN"):
        PostgresStore(None)


def test_unreachable_server_is_a_store_error_without_the_password():
    with pytest.raises(StoreError, match="cannot connect") as info:
        PostgresStore("postgresql://someone:s3cret@127.0.0.1:1/db", connect_timeout=2)
    assert "s3cret" not in str(info.value)


def test_ci_requires_the_server(monkeypatch):
    monkeypatch.delenv("CTXKERNEL_TEST_PG_DSN", raising=False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run under CI=true"):
        postgres_dsn()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="CTXKERNEL_TEST_PG_DSN is not set"):
        postgres_dsn()


@pytest.fixture
def dsn():
    with postgres_schema(postgres_dsn()) as schema_dsn:
        yield schema_dsn


def tables(dsn):
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


@pytest.mark.postgres
def test_schema_is_created_and_versioned_on_first_use(dsn):
    assert tables(dsn) == []
    store = PostgresStore(dsn)
    assert tables(dsn) == [
        "ctxkernel_blob_chunks",
        "ctxkernel_blobs",
        "ctxkernel_events",
        "ctxkernel_kv",
        "ctxkernel_leases",
        "ctxkernel_meta",
        "ctxkernel_sessions",
        "ctxkernel_snapshots",
    ]
    assert store.schema_version == SCHEMA_VERSION
    store.close()
    PostgresStore(dsn).close()  # a second start finds it in place


@pytest.mark.postgres
def test_a_version_1_schema_is_upgraded_in_place(dsn):
    store = PostgresStore(dsn)
    store.create(header("s"))
    store.append("s", batch(0, 3), 0)
    store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:  # as ctxkernel 0.2 left it: no lease table
        conn.execute("DROP TABLE ctxkernel_leases")
        conn.execute("UPDATE ctxkernel_meta SET value = '1' WHERE name = 'schema_version'")
    upgraded = PostgresStore(dsn)
    assert upgraded.schema_version == SCHEMA_VERSION == 2
    assert "ctxkernel_leases" in tables(dsn)
    assert [e.seq for e in upgraded.read("s")] == [0, 1, 2]  # the log is untouched
    upgraded.close()


@pytest.mark.postgres
def test_workers_starting_together_create_the_schema_once(dsn):
    errors, stores = [], []

    def start():
        try:
            stores.append(PostgresStore(dsn))
        except Exception as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(stores) == 6
    for store in stores:
        store.close()


@pytest.mark.postgres
def test_newer_schema_is_refused(dsn):
    PostgresStore(dsn).close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE ctxkernel_meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99 is newer"):
        PostgresStore(dsn)


@pytest.mark.postgres
def test_connection_string_from_profile_or_environment(dsn, monkeypatch, tmp_path):
    store = store_from_settings(StoreSettings(backend="postgres", dsn=dsn))
    assert isinstance(store, PostgresStore)
    store.close()
    monkeypatch.setenv("CTXKERNEL_STORE__BACKEND", "postgres")
    monkeypatch.setenv("CTXKERNEL_STORE__DSN", dsn)
    profile = load_profile()
    assert profile.store.dsn == dsn
    kernel = Kernel(profile, home=tmp_path, entry_points=False)
    assert kernel.store.backend == "postgres"
    session = kernel.open_session()
    session.user("stored in postgres")
    assert Kernel(
        make_profile(store={"backend": "postgres", "dsn": dsn}), home=tmp_path, entry_points=False
    ).sessions() == [session.id]


@pytest.mark.postgres
def test_a_missing_row_is_corruption_not_a_short_log(dsn):
    store = PostgresStore(dsn)
    store.create(header("s"))
    store.append("s", batch(0, 5), 0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM ctxkernel_events WHERE seq = 2")
    with pytest.raises(CorruptionError, match="missing"):
        list(store.read("s"))
    with pytest.raises(CorruptionError, match="holds 4 events"):
        store.repair("s")


@pytest.mark.postgres
def test_a_header_row_with_a_field_of_another_type_is_corruption(dsn):
    # "parent": 7 or "format_version": true (taken as 1) were accepted
    store = PostgresStore(dsn)
    store.create(header("s"))
    for field, value, accepted in (("parent", 7, "'parent' is 7"), ("format_version", True, "format_version True")):
        body = orjson.dumps({**header("s").to_dict(), field: value}).decode()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE ctxkernel_sessions SET header = %s WHERE id = 's'", (body,))
        with pytest.raises(CorruptionError, match=accepted):
            PostgresStore(dsn).header("s")


@pytest.mark.postgres
def test_a_dropped_connection_is_replaced_and_the_call_retried(dsn):
    store = PostgresStore(dsn, pool_size=1)
    store.create(header("s"))
    with store._pool.connection() as pooled:  # the pool's only connection
        backend = pooled.info.backend_pid
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
    assert store.next_seq("s") == 0  # the call that finds its connection dead retries on a new one
    assert store.dropped_connections == 1
    store.close()


def test_a_lock_connection_error_hides_the_password(monkeypatch):
    # hold_lock quoted the driver's error as it came; libpq quotes a malformed string whole
    store = PostgresStore.__new__(PostgresStore)
    store._psycopg = psycopg
    store.dsn = "postgresql://app:s3cret-pw@db.invalid/ctx"
    store.where = "postgresql://app:***@db.invalid/ctx"
    store.connect_timeout = 1

    def refuse(dsn, **kwargs):
        raise psycopg.OperationalError(f'missing "=" after "{dsn}" in connection info string')

    monkeypatch.setattr(psycopg, "connect", refuse)
    with pytest.raises(StoreError) as info:
        store.hold_lock("session a", 1)
    assert "s3cret-pw" not in str(info.value)
    assert "cannot connect to the postgres store" in str(info.value)
