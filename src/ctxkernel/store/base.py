"""The ``EventStore`` protocol every backend implements.

A store keeps, per session, a header and an append-only list of events with contiguous seqs, and
a small key-value table shared by all sessions (chapter lineage, notes, registries). It is the
only layer that touches disk or a database. Semantic repair (closing open tool calls and turns
after a crash) belongs to the session; a store only guarantees that what it returns is a prefix
of acknowledged batches, and that a defect it cannot explain raises :class:`CorruptionError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
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


#: the store whose appends on this thread currently defer their sync (see :func:`deferred_sync`)
_deferring = threading.local()


@contextlib.contextmanager
def _defer(store: Any) -> Iterator[None]:
    before = getattr(_deferring, "store", None)
    _deferring.store = store
    try:
        yield
    finally:
        _deferring.store = before


class SyncDeferral:
    """Mixin of the shipped backends: ``with store.deferred_sync(): store.append(...)`` appends
    without waiting for the disk (no fsync; sqlite ``synchronous=NORMAL``; PostgreSQL
    ``synchronous_commit=off``). The batch is written, ordered and visible to every reader at
    once, and a process crash keeps it; a power loss may take it, but only together with what
    followed it, because the next durable append syncs everything before it. The kernel uses it
    for a compaction's ``compaction/start`` (the lock in the log): losing it loses nothing
    acknowledged, as a crash before the lock would, and the commit batch stays durable, so a
    transaction costs one durable write."""

    def deferred_sync(self) -> contextlib.AbstractContextManager[None]:
        return _defer(self)

    def sync_deferred(self) -> bool:
        """True inside :meth:`deferred_sync` of this store on this thread."""
        return getattr(_deferring, "store", None) is self


def deferred_sync(store: Any) -> contextlib.AbstractContextManager[None]:
    """``store.deferred_sync()``, or a plain durable append for a store without it (a custom
    backend keeps its own durability; wrappers that delegate reach their inner store's)."""
    defer = getattr(store, "deferred_sync", None)
    return defer() if callable(defer) else contextlib.nullcontext()


def default_home() -> Path:
    """``$CTXKERNEL_HOME``, else the user's data directory (``$XDG_DATA_HOME/ctxkernel``)."""
    if env := os.environ.get("CTXKERNEL_HOME"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "ctxkernel"


#: the type each optional field of a stored header may have (null for an optional one reads as
#: absent), and how an error names it; ``id`` and ``format_version`` are checked on their own
_HEADER_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "created": ((str,), "a string (a UTC timestamp)"),
    "parent": ((str, type(None)), "a session id string or null"),
    "origin": ((str, type(None)), "a string or null"),
    "profile": ((str, type(None)), "a profile name string or null"),
    "extra": ((dict, type(None)), "an object or null"),
}


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
    def from_dict(cls, raw: Any, where: str = "header", session_id: str | None = None) -> SessionHeader:
        """The header read back from a store; ``session_id``: the session it was read for, which
        it must name (a header of another session would open, and write to, that session)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            msg = f"{where}: session header must be an object with an 'id', got {raw!r:.120}"
            raise CorruptionError(msg)
        if session_id is not None and raw["id"] != session_id:
            msg = (
                f"{where}: the header of session {session_id!r} names session {raw['id']!r:.140}; the store is corrupt"
            )
            raise CorruptionError(msg)
        version = raw.get("format_version")
        if type(version) is not int or version != FORMAT_VERSION:  # exact: true equals 1
            msg = f"{where}: unsupported session format_version {version!r}; this ctxkernel reads {FORMAT_VERSION}"
            raise CorruptionError(msg)
        known = {"format_version", "id", "created", "parent", "origin", "profile", "extra"}
        if unknown := set(raw) - known:
            msg = f"{where}: session header has unknown keys {sorted(unknown)}; accepted: {sorted(known)}"
            raise CorruptionError(msg)
        for name, (types, accepted) in _HEADER_FIELDS.items():
            if name in raw and type(raw[name]) not in types:
                msg = f"{where}: session header field {name!r} is {raw[name]!r:.60}; accepted: {accepted}"
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

    def snapshot_put(self, session_id: str, covers: int, body: bytes | bytearray) -> None:
        """Keep ``body`` as the session's snapshot of its first ``covers`` events, replacing an
        older one. Not durable by design: the kernel verifies a snapshot on load and replays the
        whole log when it is missing, stale or damaged."""

    def snapshot_get(self, session_id: str) -> tuple[int, bytes] | None:
        """``(covers, body)`` of the newest snapshot, or None; :class:`CorruptionError` when the
        store can tell it is damaged. A store may use it to start reading at ``covers``."""

    def snapshot_delete(self, session_id: str) -> None: ...

    def kv_get(self, namespace: str, key: str) -> Any | None: ...

    def kv_put(self, namespace: str, key: str, value: Any) -> None: ...

    def kv_delete(self, namespace: str, key: str) -> None: ...

    def kv_list(self, namespace: str, prefix: str = "") -> dict[str, Any]: ...

    def lease_acquire(self, name: str, holder: dict[str, Any], seconds: float, *, replace: str | None = None) -> Lease:
        """Take the lease ``name`` for ``holder`` (whose ``token`` names it) for ``seconds``.

        It is taken when nobody holds it, when its holder's expiry has passed (judged by the
        store's clock: the database server's for postgres), when ``holder`` already holds it
        (a retried call), or when its holder's token is ``replace`` (a holder known dead). The
        answer says who holds it now and, when an expired or replaced holder lost it, who."""

    def lease_renew(self, name: str, token: str, seconds: float) -> bool:
        """Move the expiry ``seconds`` ahead; False when ``token`` no longer holds the lease."""

    def lease_release(self, name: str, token: str) -> None:
        """Give the lease up if ``token`` holds it (a no-op otherwise)."""

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


@dataclass(frozen=True, slots=True)
class Lease:
    """A store's answer to :meth:`EventStore.lease_acquire`."""

    name: str
    #: the holder now (``host``, ``pid``, ``started``, ``token``): the caller when ``acquired``
    holder: dict[str, Any]
    acquired: bool
    #: seconds until the holder's lease expires, by the store's clock
    remaining: float
    #: the holder that lost the lease to this call (its expiry had passed, or it was replaced)
    previous: dict[str, Any] | None = None


def check_lease_request(name: str, holder: dict[str, Any], seconds: float) -> str:
    """Shared pre-write check of a lease request; returns the holder's token."""
    check_kv_name("lease name", name)
    token = holder.get("token") if isinstance(holder, dict) else None
    if not isinstance(token, str) or not token:
        msg = f"lease {name}: the holder must be a dict with a non-empty 'token', got {holder!r:.200}"
        raise StoreError(msg)
    if not isinstance(seconds, int | float) or not 0 < seconds <= 86_400:
        msg = f"lease {name}: seconds must be a number in (0, 86400], got {seconds!r}"
        raise StoreError(msg)
    return token


def check_batch(events: Sequence[Event], expected_seq: int) -> None:
    """Shared pre-write check: a batch is non-empty and its seqs run on from ``expected_seq``."""
    if not events:
        msg = "append needs at least one event"
        raise StoreError(msg)
    for offset, event in enumerate(events):
        if event.seq != expected_seq + offset:
            msg = f"batch seqs must run on from {expected_seq}: event {offset} has seq {event.seq}"
            raise StoreError(msg)
