"""``ctxkernel store``: move sessions between backends.

``ctxkernel store copy SOURCE TARGET`` copies every session (or the ``--session`` ids given) with
its header and events, then checks the event count and a per-session hash on both sides. A store
is written ``jsonl:PATH``, ``sqlite:PATH`` or ``postgres:DSN`` (a bare ``postgresql://`` URI works).

The copy is resumable: a session already complete in the target is verified and skipped; one the
target holds only a prefix of (an interrupted copy, or a source that grew since) gets the rest. A
target whose events differ from the source's is refused, naming the session, and is not written.
Events are appended in chunks that end only where no compaction transaction is open, so a
reader of the target never sees half a compaction, even mid-copy.

``--blob-prefix PREFIX`` also copies the blobs whose key starts with it (strategies' files, e.g.
``chapters/`` or ``decay/``): each is put in the target and checked by size and sha256; one the
target already holds with the same digest is skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from ..errors import StoreError
from ..events import COMPACTION_END, COMPACTION_START, Event
from ..redact import redact
from .base import EventStore, SessionHeader

#: a chunk is appended once it holds this many bytes or events (and no compaction is open)
CHUNK_BYTES = 8 << 20
CHUNK_EVENTS = 5000

BACKENDS = ("jsonl", "sqlite", "postgres")


def parse_store_spec(spec: str) -> tuple[str, str]:
    """``(backend, where)`` from ``jsonl:PATH``, ``sqlite:PATH``, ``postgres:DSN`` or a URI."""
    if spec.startswith(("postgresql://", "postgres://")):
        return "postgres", spec
    backend, sep, target = spec.partition(":")
    if not sep or backend not in BACKENDS or not target:
        msg = (
            f"store {redact(spec)!r} is not BACKEND:WHERE; accepted: jsonl:PATH, sqlite:PATH, postgres:DSN "
            "(or a postgresql:// URI)"
        )
        raise StoreError(msg)
    return backend, target


def open_store(spec: str) -> EventStore:
    """A store from ``jsonl:PATH``, ``sqlite:PATH``, ``postgres:DSN`` or a ``postgresql://`` URI."""
    backend, target = parse_store_spec(spec)
    if backend == "jsonl":
        from .jsonl import JsonlStore

        return JsonlStore(Path(target).expanduser())
    if backend == "sqlite":
        from .sqlite import SqliteStore

        return SqliteStore(Path(target).expanduser())
    from .postgres import PostgresStore

    return PostgresStore(target)


def event_bytes(event: Event) -> bytes:
    """Canonical bytes of an event, equal across backends for equal events."""
    return orjson.dumps(event.to_dict(), option=orjson.OPT_SORT_KEYS)


def session_hash(header: SessionHeader, events: Iterable[Event]) -> tuple[int, str]:
    """``(event count, sha256)`` over the canonical header and events of a session."""
    digest = hashlib.sha256(orjson.dumps(header.to_dict(), option=orjson.OPT_SORT_KEYS) + b"\n")
    count = 0
    for event in events:
        digest.update(event_bytes(event) + b"\n")
        count += 1
    return count, digest.hexdigest()


@dataclass
class CopyResult:
    session: str
    status: str  # copied | resumed | verified (already complete)
    events: int
    appended: int
    sha256: str


def _chunks(events: Iterator[Event]) -> Iterator[list[Event]]:
    chunk: list[Event] = []
    size = 0
    open_compactions: set[str] = set()
    for event in events:
        chunk.append(event)
        size += len(event_bytes(event))
        if event.type == COMPACTION_START:
            open_compactions.add(event.data["compaction_id"])
        elif event.type == COMPACTION_END:
            open_compactions.discard(event.data["compaction_id"])
        if not open_compactions and (size >= CHUNK_BYTES or len(chunk) >= CHUNK_EVENTS):
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def copy_session(source: EventStore, target: EventStore, session_id: str) -> CopyResult:
    """Copy one session (or finish an interrupted copy), then verify count and hash."""
    header = source.header(session_id)
    status = "copied"
    have = 0
    if target.exists(session_id):
        theirs = target.header(session_id)
        if theirs.to_dict() != header.to_dict():
            msg = f"session {session_id}: the target's header differs from the source's; not copied"
            raise StoreError(msg)
        have = target.next_seq(session_id)
        if have:
            src_count, src_prefix = session_hash(header, _take(source.read(session_id), have))
            dst_count, dst_prefix = session_hash(header, target.read(session_id))
            if src_count != have or dst_prefix != src_prefix:
                msg = (
                    f"session {session_id}: the target holds {have} events that are not a prefix of the "
                    f"source's ({src_count} compared); not copied"
                )
                raise StoreError(msg)
        status = "resumed"
    else:
        target.create(header)
    appended = 0
    for chunk in _chunks(source.read(session_id, have)):
        target.append(session_id, chunk, chunk[0].seq)
        appended += len(chunk)
    src_count, src_hash = session_hash(header, source.read(session_id))
    dst_count, dst_hash = session_hash(target.header(session_id), target.read(session_id))
    if (src_count, src_hash) != (dst_count, dst_hash):
        msg = (
            f"session {session_id}: after the copy the source has {src_count} events (sha256 {src_hash[:16]}) "
            f"and the target {dst_count} (sha256 {dst_hash[:16]})"
        )
        raise StoreError(msg)
    if status == "resumed" and appended == 0:
        status = "verified"
    return CopyResult(session_id, status, dst_count, appended, dst_hash)


def _take(events: Iterator[Event], n: int) -> Iterator[Event]:
    for i, event in enumerate(events):
        if i >= n:
            return
        yield event


def copy_sessions(
    source: EventStore,
    target: EventStore,
    sessions: list[str] | None = None,
    *,
    kv_namespaces: Iterable[str] = (),
    blob_prefixes: Iterable[str] = (),
    progress: Callable[[CopyResult], None] | None = None,
) -> list[CopyResult]:
    """Copy sessions (all by default), the named key-value namespaces and the blobs under the
    given key prefixes."""
    ids = sessions if sessions else source.list_sessions()
    results = []
    for session_id in ids:
        result = copy_session(source, target, session_id)
        results.append(result)
        if progress:
            progress(result)
    for namespace in kv_namespaces:
        for key, value in source.kv_list(namespace).items():
            target.kv_put(namespace, key, value)
    for prefix in blob_prefixes:
        copy_blobs(source, target, prefix)
    return results


def copy_blobs(source: EventStore, target: EventStore, prefix: str) -> int:
    """Copy the blobs under ``prefix``, each verified by sha256 in the target; returns how many
    were written (a blob the target already holds with the same digest is skipped)."""
    written = 0
    for info in source.blob_list(prefix):
        if target.blob_stat(info.key) == info:
            continue
        data = source.blob_get(info.key)
        if data is None:  # deleted in the source since the listing
            continue
        if target.blob_put(info.key, data) != info or target.blob_stat(info.key) != info:
            msg = f"blob {info.key}: the target does not hold the source's {info.size} bytes (sha256 {info.sha256})"
            raise StoreError(msg)
        written += 1
    return written


# -- command line ---------------------------------------------------------------------------------
def register(sub: Any) -> None:
    store = sub.add_parser("store", help="work with session stores (copy between backends)")
    store_sub = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND")
    p = store_sub.add_parser(
        "copy",
        help="copy sessions between stores, verifying counts and hashes (resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", help="jsonl:PATH, sqlite:PATH or postgres:DSN")
    p.add_argument("target", help="jsonl:PATH, sqlite:PATH or postgres:DSN")
    p.add_argument("--session", action="append", default=[], help="copy only this session id (repeatable)")
    p.add_argument("--kv-namespace", action="append", default=[], help="also copy this key-value namespace")
    p.add_argument(
        "--blob-prefix",
        action="append",
        default=[],
        help="also copy the blobs whose key starts with this (e.g. chapters/), each checked by sha256",
    )
    p.set_defaults(func=cmd_copy)


def cmd_copy(args: argparse.Namespace) -> int:
    from ..exits import EXIT_INVALID, EXIT_OK, EXIT_USAGE, dump_json, one_line
    from .base import check_blob_prefix, check_kv_name, check_session_id

    # every argument is checked before either store is opened: a bad one is a usage error
    try:
        for name, spec in (("SOURCE", args.source), ("TARGET", args.target)):
            try:
                parse_store_spec(spec)
            except StoreError as exc:
                raise StoreError(f"{name}: {exc}") from None
        for session_id in args.session:
            check_session_id(session_id)
        for namespace in args.kv_namespace:
            check_kv_name("namespace", namespace)
        for prefix in args.blob_prefix:
            check_blob_prefix(prefix)
    except StoreError as exc:
        sys.stderr.write(f"ctxkernel store copy: error: {redact(str(exc))}\n")
        return EXIT_USAGE
    opened: list[EventStore] = []
    try:
        for spec in (args.source, args.target):
            try:
                opened.append(open_store(spec))
            except StoreError as exc:  # a well-formed store that cannot be opened (missing, refused)
                sys.stderr.write(f"ctxkernel store copy: {one_line(redact(str(exc)))}\n")
                return EXIT_INVALID
    finally:
        if len(opened) < 2:
            for store in opened:
                store.close()
    source, target = opened
    copied: list[CopyResult] = []

    def progress(result: CopyResult) -> None:
        copied.append(result)
        sys.stderr.write(f"{result.session}: {result.status}, {result.events} events\n")

    try:
        copy_sessions(
            source,
            target,
            args.session or None,
            kv_namespaces=args.kv_namespace,
            blob_prefixes=args.blob_prefix,
            progress=progress,
        )
    except StoreError as exc:
        sys.stderr.write(f"ctxkernel store copy: {redact(str(exc))}\n")
        dump_json({"ok": False, "sessions": [asdict(r) for r in copied], "error": redact(str(exc))})
        return EXIT_INVALID
    finally:
        source.close()
        target.close()
    dump_json({"ok": True, "sessions": [asdict(r) for r in copied]})
    return EXIT_OK
