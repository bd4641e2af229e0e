"""The ``EventStore`` protocol every backend implements.

A store keeps, per session, a header and an append-only list of events with contiguous seqs, and
a small key-value table shared by all sessions (chapter lineage, notes, registries). It is the
only layer that touches disk or a database. Semantic repair (closing open tool calls and turns
after a crash) belongs to the session; a store only guarantees that what it returns is a prefix
of acknowledged batches, and that a defect it cannot explain raises :class:`CorruptionError`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import CorruptionError, StoreError
from ..events import Event

FORMAT_VERSION = 1
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_KV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,255}")


def check_session_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id) or ".." in session_id:
        msg = (
            f"invalid session id {session_id!r}: use 1-128 characters of letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
        raise StoreError(msg)
    return session_id


def check_kv_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _KV_NAME.fullmatch(value) or ".." in value.split("/"):
        msg = f"invalid key-value {kind} {value!r}: letters, digits and . _ / - only, no '..' part"
        raise StoreError(msg)
    return value


#: the largest value one blob may hold (a chapter, an artifact, an audit file): 64 MiB
MAX_BLOB_BYTES = 64 << 20
#: database backends store a blob as rows of at most this many bytes
BLOB_CHUNK_BYTES = 1 << 20
#: the longest blob key
MAX_BLOB_KEY = 512
_BLOB_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_blob_key(key: str) -> str:
    """A blob key is a relative, slash-separated name: every part starts with a letter or digit
    (so no '..', no hidden or temporary names), no empty part, no absolute path."""
    parts = key.split("/") if isinstance(key, str) else []
    if (
        not isinstance(key, str)
        or not 0 < len(key) <= MAX_BLOB_KEY
        or not all(_BLOB_PART.fullmatch(part) and ".." not in part for part in parts)
    ):
        msg = (
            f"invalid blob key {key!r:.200}: use 1-{MAX_BLOB_KEY} characters of '/'-separated parts, each "
            "1-128 letters, digits, '.', '_' or '-' starting with a letter or digit (no '..', no leading '/')"
        )
        raise StoreError(msg)
    return key


def check_blob_data(key: str, data: bytes) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        msg = f"blob {key}: the value must be bytes, got {type(data).__name__}; nothing was written"
        raise StoreError(msg)
    data = bytes(data)
    if len(data) > MAX_BLOB_BYTES:
        msg = f"blob {key}: {len(data)} bytes is over the limit of {MAX_BLOB_BYTES} bytes; nothing was written"
        raise StoreError(msg)
    return data


def check_blob_prefix(prefix: str) -> str:
    """A listing prefix: empty, or the start of a valid key (a folder ``a/b/`` or a name start)."""
    if prefix == "":
        return prefix
    check_blob_key(prefix.rstrip("/") if prefix.endswith("/") else prefix)
    return prefix


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """A stored blob: its key, its size in bytes and the sha256 (hex) of its content."""

    key: str
    size: int
    sha256: str

    @classmethod
    def of(cls, key: str, data: bytes) -> BlobInfo:
        return cls(key, len(data), hashlib.sha256(data).hexdigest())


def default_home() -> Path:
    """``$CTXKERNEL_HOME``, else the user's data directory (``$XDG_DATA_HOME/ctxkernel``)."""
    if env := os.environ.get("CTXKERNEL_HOME"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "ctxkernel"


@dataclass(frozen=True, slots=True)
class SessionHeader:
    id: str
    created: str
    format_version: int = FORMAT_VERSION
    parent: str | None = None
    origin: str | None = None
    profile: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format_version": self.format_version, "id": self.id, "created": self.created}
        for key in ("parent", "origin", "profile"):
            if (value := getattr(self, key)) is not None:
                out[key] = value
        if self.extra:
            out["extra"] = self.extra
        return out

    @classmethod
    def from_dict(cls, raw: Any, where: str = "header") -> SessionHeader:
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            msg = f"{where}: session header must be an object with an 'id', got {raw!r:.120}"
            raise CorruptionError(msg)
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            msg = f"{where}: unsupported session format_version {version!r}; this ctxkernel reads {FORMAT_VERSION}"
            raise CorruptionError(msg)
        known = {"format_version", "id", "created", "parent", "origin", "profile", "extra"}
        if unknown := set(raw) - known:
            msg = f"{where}: session header has unknown keys {sorted(unknown)}; accepted: {sorted(known)}"
            raise CorruptionError(msg)
        return cls(
            id=raw["id"],
            created=raw.get("created", ""),
            parent=raw.get("parent"),
            origin=raw.get("origin"),
            profile=raw.get("profile"),
            extra=raw.get("extra") or {},
        )


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What a store cut off when it opened a session after a crash."""

    truncated_bytes: int = 0
    dropped_events: int = 0
    reason: str = ""

    @property
    def repaired(self) -> bool:
        return self.truncated_bytes > 0 or self.dropped_events > 0


@runtime_checkable
class EventStore(Protocol):
    """Append-only session logs plus a key-value table. Backends: jsonl, sqlite, postgres."""

    #: backend name as written in profiles (``[store] backend = ...``)
    backend: str

    def create(self, header: SessionHeader) -> None:
        """Create a session atomically; :class:`SessionExistsError` if the id is taken."""

    def exists(self, session_id: str) -> bool: ...

    def header(self, session_id: str) -> SessionHeader: ...

    def append(self, session_id: str, events: Sequence[Event], expected_seq: int) -> None:
        """Durably append one batch, all or nothing.

        ``expected_seq`` is the seq the caller believes comes next; when another writer appended
        first, :class:`ConflictError` is raised and nothing is written.
        """

    def read(self, session_id: str, start: int = 0, end: int | None = None) -> Iterator[Event]:
        """Yield validated events with ``start <= seq < end`` (``end`` None: to the last) in order.

        A bounded read touches only the events it returns (the inspector pages a long log this way)."""

    def next_seq(self, session_id: str) -> int:
        """The seq the next appended event must have (cheap: used to detect new events)."""

    def list_sessions(self) -> list[str]: ...

    def repair(self, session_id: str) -> RepairReport:
        """Cut a torn tail left by a crash (never anything acknowledged); raise
        :class:`CorruptionError` for any other defect, rewriting nothing."""

    def kv_get(self, namespace: str, key: str) -> Any | None: ...

    def kv_put(self, namespace: str, key: str, value: Any) -> None: ...

    def kv_delete(self, namespace: str, key: str) -> None: ...

    def kv_list(self, namespace: str, prefix: str = "") -> dict[str, Any]: ...

    def blob_put(self, key: str, data: bytes) -> BlobInfo:
        """Store ``data`` under ``key`` (replacing any value) durably and atomically: a reader sees
        the old value or the whole new one, never a part. Keys: :func:`check_blob_key`; at most
        :data:`MAX_BLOB_BYTES`."""

    def blob_get(self, key: str) -> bytes | None:
        """The value under ``key`` (None when absent); :class:`CorruptionError` when the stored
        bytes no longer hash to the digest recorded when they were written."""

    def blob_stat(self, key: str) -> BlobInfo | None:
        """Size and sha256 of the value under ``key`` without reading it (None when absent)."""

    def blob_list(self, prefix: str = "") -> list[BlobInfo]:
        """Every blob whose key starts with ``prefix``, sorted by key."""

    def blob_delete(self, key: str) -> None:
        """Remove ``key`` (nothing when absent)."""

    def close(self) -> None: ...


def check_batch(events: Sequence[Event], expected_seq: int) -> None:
    """Shared pre-write check: a batch is non-empty and its seqs run on from ``expected_seq``."""
    if not events:
        msg = "append needs at least one event"
        raise StoreError(msg)
    for offset, event in enumerate(events):
        if event.seq != expected_seq + offset:
            msg = f"batch seqs must run on from {expected_seq}: event {offset} has seq {event.seq}"
            raise StoreError(msg)
