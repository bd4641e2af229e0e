"""The store conformance suite (ctxkernel.testing.store), run unchanged against every backend."""

from __future__ import annotations

import pytest

from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.store.sqlite import SqliteStore
from ctxkernel.testing.store import StoreConformance, postgres_dsn, postgres_schema


class TestJsonlConformance(StoreConformance):
    @pytest.fixture
    def store_factory(self, tmp_path):
        return lambda: JsonlStore(tmp_path / "home")


class TestSqliteConformance(StoreConformance):
    @pytest.fixture
    def store_factory(self, tmp_path):
        return lambda: SqliteStore(tmp_path / "home")


@pytest.mark.postgres
class TestPostgresConformance(StoreConformance):
    @pytest.fixture
    def store_factory(self):
        from ctxkernel.store.postgres import PostgresStore

        with postgres_schema(postgres_dsn()) as dsn:
            yield lambda: PostgresStore(dsn)
