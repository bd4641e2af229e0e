"""Event stores: the only layer that touches disk or databases.

``jsonl`` (default, one file per session), ``sqlite`` (one database per home, many processes)
and ``postgres`` (shared by hosts of a fleet) implement :class:`EventStore`.

The factory lives here, above the backends, so that ``base`` (the protocol every backend
imports) never imports a backend back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import StoreError
from .base import (
    FORMAT_VERSION,
    MAX_BLOB_BYTES,
    BlobInfo,
    EventStore,
    RepairReport,
    SessionHeader,
    default_home,
)
from .jsonl import JsonlStore


def store_from_settings(settings: Any, home: Path | None = None) -> EventStore:
    """Build the backend named by a profile's ``[store]`` settings."""
    backend = getattr(settings, "backend", "jsonl")
    home = Path(getattr(settings, "path", None) or home or default_home())
    if backend == "jsonl":
        return JsonlStore(home)
    if backend == "sqlite":
        # sqlite and postgres load only when chosen: psycopg is an optional dependency
        from .sqlite import SqliteStore

        return SqliteStore(home)
    if backend == "postgres":
        from .postgres import PostgresStore

        return PostgresStore(getattr(settings, "dsn", None))
    msg = f"unknown store backend {backend!r}; accepted: ['jsonl', 'sqlite', 'postgres']"
    raise StoreError(msg)


__all__ = [
    "FORMAT_VERSION",
    "MAX_BLOB_BYTES",
    "BlobInfo",
    "EventStore",
    "JsonlStore",
    "RepairReport",
    "SessionHeader",
    "default_home",
    "store_from_settings",
]
