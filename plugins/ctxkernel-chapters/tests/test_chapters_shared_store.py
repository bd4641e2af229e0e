"""Chapters and artifacts live in the store (#19 item 1): a worker with another kernel home on the
same sqlite or postgres store reads, searches and verifies what the first one archived."""

from __future__ import annotations

import pytest
from helpers_chapters import call_tool, chapters_kernel, registry, run_turns

from ctxkernel.store.sqlite import SqliteStore
from ctxkernel.testing.store import postgres_dsn, postgres_schema
from ctxkernel_chapters import plugin as chapters_plugin


def _archive_on_one_worker_read_on_another(first_store, second_store, tmp_path):
    writer = chapters_kernel(tmp_path / "host-a", window=6_000, reserve=1_000, auto=False, store=first_store)
    session = writer.open_session()
    run_turns(session, 6)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    records = registry(session).records(session.id)
    assert records
    # another host: its own (empty) kernel home, the same store
    reader = chapters_kernel(tmp_path / "host-b", window=6_000, reserve=1_000, auto=False, store=second_store)
    again = reader.open_session(session.id)
    assert not (tmp_path / "host-b").exists() or not any((tmp_path / "host-b").rglob("*.md"))
    for record in records:
        outcome = call_tool(again, "chapters_read", chapter=record["id"])
        assert not outcome.is_error and "sha256 verified" in outcome.content, outcome.content
    found = call_tool(again, "chapters_search", query="task 0")
    assert "match(es)" in found.content and "refused" not in found.content
    panel = reader.plugins.hooks.project(again)["chapters"]
    assert [row["hash"] for row in panel["toc"]] == ["ok"] * len(records)
    return again, records


def test_a_second_worker_reads_the_chapters_on_sqlite(tmp_path):
    store_home = tmp_path / "shared"
    _archive_on_one_worker_read_on_another(SqliteStore(store_home), SqliteStore(store_home), tmp_path)


@pytest.mark.postgres
def test_a_second_worker_reads_the_chapters_on_postgres_and_sees_tampering(tmp_path):
    import psycopg

    from ctxkernel.store.postgres import PostgresStore

    with postgres_schema(postgres_dsn()) as dsn:
        again, records = _archive_on_one_worker_read_on_another(PostgresStore(dsn), PostgresStore(dsn), tmp_path)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE ctxkernel_blob_chunks SET data = %s WHERE key = %s",
                (b"tampered", f"chapters/{records[0]['path']}"),
            )
            # the cached verification is keyed by the stored digest: change it as a rewrite would
            conn.execute(
                "UPDATE ctxkernel_blobs SET sha256 = %s WHERE key = %s", ("0" * 64, f"chapters/{records[0]['path']}")
            )
        outcome = call_tool(again, "chapters_read", chapter=records[0]["id"])
        assert outcome.is_error and "refused" in outcome.content
