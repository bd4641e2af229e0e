"""What the two row-based backends (sqlite, postgres) share: the stored form of events, headers
and key-value values, the chunked read with its gap checks, and the bookkeeping check of
``repair``. Each backend keeps only its SQL dialect and its transaction handling."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson

from ..errors import CorruptionError, EventError, StoreError
from ..events import Event
from .base import BLOB_CHUNK_BYTES, BlobInfo, RepairReport, SessionHeader

#: rows fetched per query while reading, so a long log never sits in memory twice
READ_CHUNK = 5000

#: fetch(from_seq, end, limit) -> [(seq, body), ...] in seq order
FetchChunk = Callable[[int, int, int], Sequence[tuple[int, Any]]]


def encode_event(event: Event) -> str:
    """The stored form of an event."""
    try:
        return orjson.dumps(event.to_dict()).decode()
    except TypeError as exc:
        msg = f"event {event.seq} ({event.type}) is not JSON-serialisable: {exc}; nothing was written"
        raise StoreError(msg) from None


def decode_event(body: str | bytes, where: str) -> Event:
    try:
        return Event.from_dict(orjson.loads(body))
    except (orjson.JSONDecodeError, EventError) as exc:
        msg = f"{where}: stored event is invalid ({exc})"
        raise CorruptionError(msg) from None


def encode_value(namespace: str, key: str, value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        msg = f"key-value {namespace}/{key}: value is not JSON-serialisable ({exc})"
        raise StoreError(msg) from None


def decode_value(body: str, where: str) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        msg = f"{where}: not valid JSON ({exc})"
        raise CorruptionError(msg) from None


def decode_header(body: str, where: str, session_id: str) -> SessionHeader:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        msg = f"{where}: header is not valid JSON ({exc})"
        raise CorruptionError(msg) from None
    return SessionHeader.from_dict(raw, where=where, session_id=session_id)


def read_events(fetch: FetchChunk, start: int, end: int, where: str) -> Iterator[Event]:
    """Events ``start..end-1`` fetched in chunks; a missing or misplaced row is corruption."""
    seq = start
    while seq < end:
        rows = fetch(seq, end, READ_CHUNK)
        if not rows:
            msg = f"{where}: events {seq}..{end - 1} are missing"
            raise CorruptionError(msg)
        for stored_seq, body in rows:
            if stored_seq != seq:
                msg = f"{where}: event {seq} is missing (found {stored_seq}); the log has a gap"
                raise CorruptionError(msg)
            event = decode_event(body, f"{where} seq {seq}")
            if event.seq != seq:
                msg = f"{where}: row {seq} holds an event with seq {event.seq}"
                raise CorruptionError(msg)
            yield event
            seq += 1


def check_bookkeeping(next_seq: int, count: int, top: int | None, where: str) -> RepairReport:
    """Transactions leave no torn tail: ``repair`` only checks the rows agree with ``next_seq``."""
    if count != next_seq or (top if top is not None else -1) != next_seq - 1:
        msg = (
            f"{where} records next seq {next_seq} but holds {count} events (highest seq {top}); "
            "the database is corrupt and was not rewritten"
        )
        raise CorruptionError(msg)
    return RepairReport()


def blob_chunks(data: bytes) -> list[bytes]:
    """A blob's rows: at most :data:`BLOB_CHUNK_BYTES` each (one empty row for an empty blob)."""
    return [data[i : i + BLOB_CHUNK_BYTES] for i in range(0, len(data), BLOB_CHUNK_BYTES)] or [b""]


def join_blob(info: BlobInfo, rows: Sequence[tuple[int, bytes]], where: str) -> bytes:
    """The blob's bytes from its ``(index, chunk)`` rows, after checking none is missing and the
    whole still hashes to the digest recorded by ``blob_put``."""
    if [index for index, _ in rows] != list(range(len(rows))):
        msg = f"{where}: blob {info.key} has missing or misplaced chunks"
        raise CorruptionError(msg)
    if not all(isinstance(chunk, (bytes, memoryview)) for _, chunk in rows):
        msg = f"{where}: blob {info.key} has a chunk that is not bytes (text written outside ctxkernel)"
        raise CorruptionError(msg)
    data = b"".join(bytes(chunk) for _, chunk in rows)
    if len(data) != info.size or BlobInfo.of(info.key, data).sha256 != info.sha256:
        msg = (
            f"{where}: blob {info.key} no longer matches the size and sha256 recorded when it was written; "
            "it was changed outside ctxkernel and is not served"
        )
        raise CorruptionError(msg)
    return data
