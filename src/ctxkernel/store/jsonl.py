"""The default ``jsonl`` backend: one file per session under the kernel home.

File format: a header line ``{"format_version", "id", "created", ...}``, then one orjson event
per line. Every event of a batch but the last carries ``"more": true`` so that a crash in the
middle of a batch can be recognised and cut back to the last complete batch on open: a batch is
all or nothing, which is what keeps a half-written compaction off the surface.

Concurrency: a writer holds an exclusive ``flock`` on the log file itself while it checks the seq
and appends, so writers of one session are serialised across processes and threads; the optimistic
``expected_seq`` check turns a stale writer into a :class:`ConflictError` with nothing written.
The lock is on the log, not on a separate lock file: a lock file can be deleted while a writer
holds it, letting a second writer take a fresh one and overwrite an acknowledged batch. Readers
take no lock: they stop at the last complete batch they see.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import os
import stat
import threading
import time
import urllib.parse
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConflictError, CorruptionError, EventError, SessionExistsError, SessionNotFoundError, StoreError
from ..events import Event
from .base import (
    BlobInfo,
    Lease,
    RepairReport,
    SessionHeader,
    SyncDeferral,
    check_batch,
    check_blob_data,
    check_blob_key,
    check_blob_prefix,
    check_kv_name,
    check_lease_request,
    check_session_id,
)
from .files import write_temp

_MORE = "more"
#: a scan that found nothing new repaired nothing (the report is frozen: one instance serves)
_NOTHING_REPAIRED = RepairReport()


@dataclass(slots=True)
class _Index:
    """What this process knows of one file: byte offset of every event line from seq ``base``
    on, and where the last complete batch ends. Lets an unchanged log be re-read without
    scanning anything. ``base`` is 0 after a full scan; a verified snapshot position starts the
    index at the last event the snapshot covers, so opening a session never reads what lies
    before it (a read further back scans the whole file then)."""

    #: 8 bytes an event (a list of ints took 36: one per event of every open session)
    offsets: array[int] = field(default_factory=lambda: array("q"))
    end: int = 0  # byte just after the last complete batch
    base: int = 0  # seq of the event at offsets[0]

    @property
    def count(self) -> int:
        return self.base + len(self.offsets)


#: a batch is written in pieces of about this many bytes: a long history arriving in one request
#: (10,000 messages, 20,000 events) took 18 times its body as one buffer
_PIECE_BYTES = 1 << 18


def _batch_pieces(events: Sequence[Event]) -> Iterator[tuple[bytearray, array[int]]]:
    """The batch's lines in buffers of about :data:`_PIECE_BYTES`, each with the offset of each
    of its lines in it. Lines go one at a time into one buffer: orjson's result for each is at
    least 4 KiB (ctxkernel/jsonbytes.py), so a batch held as a list of lines took 4 KiB per event."""
    payload = bytearray()
    starts = array("q")
    last = len(events) - 1
    for i, event in enumerate(events):
        raw = event.to_dict()
        if i < last:
            raw[_MORE] = True  # every event of the batch but the last: see the module doc
        starts.append(len(payload))
        payload += orjson.dumps(raw, option=orjson.OPT_APPEND_NEWLINE)
        if len(payload) >= _PIECE_BYTES and i < last:
            yield payload, starts
            payload, starts = bytearray(), array("q")
    yield payload, starts


#: session log paths a store keeps joined (``JsonlStore.path``)
PATHS_KEPT = 4096

#: the longest quoted key-value name kept as a file name of its own (with ``.json`` and a
#: temporary file's ``.<name>.<16 hex>.tmp`` it stays under the 255 bytes of a file name)
KV_FILE_NAME_BYTES = 200
#: what marks a file name made of a long name's digest (never in a quoted name)
_KV_DIGEST = "~"
#: the field of such an entry that holds the name
_KV_NAME_FIELD = "~name"


def _kv_file_name(name: str) -> str:
    """The file (or folder) name of a key-value name: the name quoted, or for a long one, the
    first 64 characters of that, ``~`` and the name's sha256."""
    quoted = urllib.parse.quote(name, safe="")
    if len(quoted) <= KV_FILE_NAME_BYTES:
        return quoted
    return quoted[:64] + _KV_DIGEST + hashlib.sha256(name.encode()).hexdigest()


def _unwrap(path: Path, entry: Any) -> tuple[str, Any]:
    """The name and value of an entry stored under a long name's digest."""
    if not isinstance(entry, dict) or not isinstance(entry.get(_KV_NAME_FIELD), str) or "value" not in entry:
        msg = f"{path}: a key-value entry stored under a digest must hold its name and value"
        raise CorruptionError(msg)
    return entry[_KV_NAME_FIELD], entry["value"]


class JsonlStore(SyncDeferral):
    backend = "jsonl"

    def __init__(self, home: str | os.PathLike[str], *, fsync: bool = True, lock_timeout: float = 60.0) -> None:
        self.home = Path(home)
        #: seconds a writer waits for another writer of the same session before a StoreError
        self.lock_timeout = lock_timeout
        self.sessions_dir = self.home / "sessions"
        self.kv_dir = self.home / "kv"
        self.blobs_dir = self.home / "blobs"
        # sha256 of blob files by path, valid while the file's identity (inode, size, mtime,
        # ctime) is unchanged: a stat answers without re-reading an unchanged file
        self._blob_digests: dict[Path, tuple[tuple[int, int, int, int], str]] = {}
        self.fsync = fsync
        self._index: dict[str, _Index] = {}
        self._paths: dict[str, Path] = {}  # each session's log path, by id (``path``)
        # events a file's first scan parsed, kept until read() takes them: opening a session
        # scans (repair) and then reads the same bytes; parsing them once halves a cold replay
        self._fresh: dict[str, tuple[int, list[Event]]] = {}
        self._primed: set[str] = set()  # sessions whose index starts at a snapshot, not yet scanned
        self._mutex = threading.RLock()  # guards _index and _fresh between this process's threads

    # -- paths ---------------------------------------------------------------------------------
    @staticmethod
    def _refuse_outside(path: Path, folder: Path, what: str) -> None:
        """Refuse ``path`` when it resolves outside ``folder`` through a link planted under the
        home: a read would serve a file from elsewhere, a write or a delete change one there."""
        resolved, inside = path.resolve(), folder.resolve()
        if resolved != inside and inside not in resolved.parents:
            msg = f"{what}: {path} resolves outside the store's {folder.name} folder (through a link); refused"
            raise StoreError(msg)

    def path(self, session_id: str) -> Path:
        # every read, refresh and append asks for it: the id checked and the path joined once
        try:
            return self._paths[session_id]
        except (KeyError, TypeError):  # TypeError: an unhashable id, which the check refuses
            path = self.sessions_dir / f"{check_session_id(session_id)}.jsonl"
        if len(self._paths) >= PATHS_KEPT:
            self._paths.clear()  # bounded: a path is only joined again
        self._paths[session_id] = path
        return path

    def snapshot_path(self, session_id: str) -> Path:
        return self.sessions_dir / f"{check_session_id(session_id)}.snapshot"

    @contextlib.contextmanager
    def _locked(self, session_id: str) -> Iterator[Any]:
        """The session's log opened for writing, under an exclusive ``flock`` on that very file.

        Separate ``open()`` calls get separate locks, so threads of one process exclude each
        other as processes do; closing the file releases the lock, also when the process dies.
        """
        path = self._existing(session_id)
        f = open(path, "r+b")  # noqa: SIM115 - closed in finally, which is what releases the lock
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        msg = (
                            f"{path}: another writer held the session's lock for {self.lock_timeout:g} s; "
                            "nothing was written (retry, or find the stuck process)"
                        )
                        raise StoreError(msg) from None
                    time.sleep(0.005)
            try:
                same = os.path.samestat(os.fstat(f.fileno()), os.stat(path))
            except FileNotFoundError:
                same = False
            if not same:
                msg = f"{path}: the log file was deleted or replaced while this writer waited; nothing was written"
                raise CorruptionError(msg)
            yield f
        finally:
            f.close()

    # -- sessions ------------------------------------------------------------------------------
    def create(self, header: SessionHeader) -> None:
        path = self.path(header.id)
        try:
            self.sessions_dir.mkdir(parents=True, exist_ok=True)
            tmp = write_temp(path, orjson.dumps(header.to_dict()) + b"\n", fsync=True)
        except OSError as exc:
            msg = f"cannot create session {header.id} in {self.sessions_dir}: {exc.strerror or exc}"
            raise StoreError(msg) from None
        try:
            # link() publishes the complete file atomically and refuses an existing name
            os.link(tmp, path)
        except FileExistsError:
            msg = f"session {header.id} already exists at {path}"
            raise SessionExistsError(msg) from None
        finally:
            tmp.unlink(missing_ok=True)
        self._fsync_dir(self.sessions_dir)

    def exists(self, session_id: str) -> bool:
        return self.path(session_id).exists()

    def header(self, session_id: str) -> SessionHeader:
        path = self._existing(session_id)
        with open(path, "rb") as f:
            line = f.readline()
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            msg = f"{path}:1: session header is not valid JSON ({exc})"
            raise CorruptionError(msg) from None
        return SessionHeader.from_dict(raw, where=f"{path}:1", session_id=session_id)

    def list_sessions(self) -> list[str]:
        if not self.sessions_dir.exists():
            return []
        return sorted(p.stem for p in self.sessions_dir.glob("*.jsonl") if not p.name.startswith("."))

    def _existing(self, session_id: str) -> Path:
        """The session's log, checked before the store opens it: every open of a log (a header,
        a scan that reads, a write, a snapshot's check) comes through here."""
        path = self.path(session_id)
        self._refuse_outside(path, self.sessions_dir, f"session {session_id}")
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            msg = f"no session {session_id!r} in {self.sessions_dir}"
            raise SessionNotFoundError(msg) from None
        if not stat.S_ISREG(mode):
            msg = (
                f"{path}: the log of session {session_id} is a folder or another thing that is not a file; "
                "accepted: a regular file. The store is corrupt"
            )
            raise CorruptionError(msg)
        return path

    # -- reading -------------------------------------------------------------------------------
    def _scan(
        self, session_id: str, *, repair: bool = False, locked: Any = None
    ) -> tuple[_Index, list[Event], RepairReport]:
        """Bring this process's index up to the end of the file, returning the new events.

        A line without its newline, or a batch without its last event, at the very end is a torn
        tail: ignored by readers, cut off by ``repair``. Any other defect is corruption, including
        a damaged line that ends in its newline, the last one too: a crash mid-write leaves the last
        line without its newline, so a terminated line was written whole and may be acknowledged.
        """
        # a writer passes the log it holds locked: one open (and one existence check) per append
        path = self.path(session_id)
        with self._mutex:
            index = self._index.get(session_id)
            first_scan = index is None or session_id in self._primed
            if not first_scan and not repair:
                # nothing past the last complete batch this process knows of (a poll, a refresh,
                # an append after our own): the size answers without opening and reading the file
                assert index is not None  # not a first scan
                try:
                    size = os.stat(path).st_size if locked is None else os.fstat(locked.fileno()).st_size
                except FileNotFoundError:
                    self._existing(session_id)  # raises SessionNotFoundError, naming the folder
                    raise
                if size <= index.end:
                    return index, [], _NOTHING_REPAIRED
            if locked is None:  # a writer's log was checked as it was opened
                self._existing(session_id)
            self._primed.discard(session_id)
            with open(path, "rb") if locked is None else contextlib.nullcontext(locked) as f:
                if locked is not None:
                    f.seek(0)
                if index is None:
                    first = f.readline()
                    if not first.endswith(b"\n"):
                        msg = f"{path}:1: session header line is incomplete"
                        raise CorruptionError(msg)
                    SessionHeader.from_dict(_loads(first, path, 1), where=f"{path}:1", session_id=session_id)
                    index = _Index(end=len(first))
                f.seek(index.end)
                data = f.read()
            events: list[Event] = []
            offsets = index.offsets
            pending_offsets: list[int] = []
            pending: list[Event] = []
            base = index.end
            first_seq = index.count
            first_line_no = 2 + first_seq  # the header is line 1, event seq k is line k + 2
            committed = 0  # bytes of `data` that belong to complete batches
            defect: str | None = None
            # split once (as the orjson floor does) rather than find() per line: replay is hot
            lines = data.split(b"\n")
            tail = lines.pop()  # the bytes after the last newline: empty when the file ends cleanly
            loads, from_dict = orjson.loads, Event.from_dict
            pos = 0
            for i, raw_line in enumerate(lines):
                try:
                    raw = loads(raw_line)
                    more = raw.pop(_MORE, None) if type(raw) is dict else None
                    event = from_dict(raw)
                except (orjson.JSONDecodeError, EventError) as exc:
                    msg = (
                        f"{path}:{first_line_no + i}: {exc}; a complete (newline-terminated) line is damaged, "
                        "so the log is corrupt, not torn by a crash, and was not rewritten"
                    )
                    raise CorruptionError(msg) from None
                if more is not None and more is not True:
                    raise _bad_more(path, first_line_no + i, more)
                expected = index.count + len(pending)
                if event.seq != expected:
                    msg = f"{path}:{first_line_no + i}: event seq {event.seq} where {expected} was expected"
                    raise CorruptionError(msg)
                if more:
                    pending_offsets.append(base + pos)
                    pending.append(event)
                    pos += len(raw_line) + 1
                    continue
                if pending:
                    offsets.extend(pending_offsets)
                    events.extend(pending)
                    pending_offsets, pending = [], []
                offsets.append(base + pos)
                events.append(event)
                pos += len(raw_line) + 1
                committed = pos
            else:
                if tail:
                    defect = "torn last line (no newline)"
            if pending and defect is None:
                defect = f"incomplete batch of {len(pending)} event(s) at the end"
            index.end = base + committed
            self._index[session_id] = index
            if events and first_scan:
                # only a file's first scan is held (bounded by one log; a poller that never
                # reads cannot make it grow): it is what opening a session reads right after
                self._fresh[session_id] = (first_seq, events)
            report = RepairReport()
            if defect is not None and repair:
                cut = len(data) - committed
                with open(path, "r+b") as f:
                    f.truncate(index.end)
                    f.flush()
                    os.fsync(f.fileno())
                report = RepairReport(truncated_bytes=cut, dropped_events=len(pending), reason=defect)
            return index, events, report

    def read(self, session_id: str, start: int = 0, end: int | None = None) -> Iterator[Event]:
        index, _, _ = self._scan(session_id)
        start = max(start, 0)
        if start < index.base:
            self._extend_back(session_id, index, start)
        count = index.count
        end = count if end is None else min(end, count)
        if start >= end:
            return iter(())
        if end == count:  # only a read to the end is what opening a session does right after a scan
            with self._mutex:
                fresh = self._fresh.pop(session_id, None)
            if fresh is not None and fresh[0] <= start and fresh[0] + len(fresh[1]) == count:
                return iter(fresh[1][start - fresh[0] :])
        first = index.offsets[start - index.base]
        stop = index.end if end == count else index.offsets[end - index.base]
        path = self.path(session_id)
        with open(path, "rb") as f:
            f.seek(first)
            data = f.read(stop - first)
        return self._parse(data, start, path)

    def _extend_back(self, session_id: str, index: _Index, start: int) -> None:
        """Add the offsets of events ``start..base-1`` to an index that starts at a snapshot,
        reading the file backwards from there in growing blocks, each byte once, and looking
        for the ``base - start`` newlines needed only (a last log page across a window switch
        holds lines of 50-150 KB: scanning whole blocks for every newline cost ~1 ms)."""
        path = self.path(session_id)
        with self._mutex, open(path, "rb") as f:
            need = index.base - start
            top = index.offsets[0]  # the byte after the newline that ends event base - 1
            found: list[int] = []  # line starts, the newest first
            low = top  # the file is read back to here
            block = 1 << 16
            while len(found) < need and low > 0:
                block_low = max(0, low - block)
                f.seek(block_low)
                data = f.read(low - block_low)
                # a newline is one byte: each block is searched on its own (not the one ending base - 1)
                at = min(low, top - 1) - block_low
                while len(found) < need:
                    at = data.rfind(b"\n", 0, at)
                    if at == -1:
                        break
                    found.append(block_low + at + 1)
                low = block_low
                block *= 2
            if len(found) != need:
                msg = f"{path}: found {len(found)} event lines before seq {index.base} where {need} were expected"
                raise CorruptionError(msg)
            starts = found[::-1]
            # the first line found must hold `start` (the reader checks every event's seq after)
            f.seek(starts[0])
            first = _loads(f.read((starts[1] if need > 1 else top) - starts[0]), path, start + 2)
            if type(first) is not dict or first.get("seq") != start:
                msg = f"{path}:{start + 2}: the line there is not event seq {start}; the log is corrupt"
                raise CorruptionError(msg)
            index.offsets[:0] = array("q", starts)
            index.base = start

    @staticmethod
    def _parse(data: bytes, first_seq: int, path: Path) -> Iterator[Event]:
        for seq, line in enumerate(data.splitlines(), first_seq):
            try:
                raw = orjson.loads(line)
                more = raw.pop(_MORE, None) if type(raw) is dict else None
                event = Event.from_dict(raw)
            except (orjson.JSONDecodeError, EventError) as exc:
                msg = f"{path}:{seq + 2}: {exc}; a complete (newline-terminated) line is damaged, so the log is corrupt"
                raise CorruptionError(msg) from None
            if more is not None and more is not True:
                raise _bad_more(path, seq + 2, more)
            if event.seq != seq:  # offsets found by a backward read are only as good as the lines
                msg = f"{path}:{seq + 2}: event seq {event.seq} where {seq} was expected"
                raise CorruptionError(msg)
            yield event

    def next_seq(self, session_id: str) -> int:
        index, _, _ = self._scan(session_id)
        return index.count

    def repair(self, session_id: str) -> RepairReport:
        with self._locked(session_id):
            _, _, report = self._scan(session_id, repair=True)
            return report

    # -- writing -------------------------------------------------------------------------------
    def append(self, session_id: str, events: Sequence[Event], expected_seq: int) -> None:
        check_batch(events, expected_seq)
        pieces = _batch_pieces(events)
        first = next(pieces)  # made before the lock: all of any batch but a long history's
        with self._locked(session_id) as f:
            index, _, _ = self._scan(session_id, locked=f)
            actual = index.count
            if actual != expected_seq:
                raise ConflictError(session_id, expected_seq, actual)
            # a torn tail left by a crashed writer is overwritten, never appended after
            f.seek(index.end)
            written = 0
            starts = array("q")  # each line's offset in the file
            try:
                for payload, line_starts in itertools.chain((first,), pieces):
                    at = index.end + written
                    starts.extend([at + start for start in line_starts])
                    f.write(payload)
                    written += len(payload)
                f.truncate()
                f.flush()
                if self.fsync and not self.sync_deferred():
                    os.fsync(f.fileno())
            except BaseException:
                f.truncate(index.end)  # also when a later piece could not be made: nothing of the batch stays
                raise
            with self._mutex:
                index.offsets.extend(starts)
                index.end += written

    # -- snapshots -----------------------------------------------------------------------------
    # ``<id>.snapshot`` beside the log: a position line {"covers", "at", "end", "length"} (the
    # byte range of the last event it covers, the body's length), then the kernel's snapshot body.
    # Written without fsync: it is a cache verified on load, so a lost or torn one costs a replay.
    def snapshot_put(self, session_id: str, covers: int, body: bytes | bytearray) -> None:
        index, _, _ = self._scan(session_id)
        with self._mutex:
            if not index.base < covers <= index.count:
                msg = (
                    f"session {session_id}: cannot place a snapshot of {covers} events "
                    f"(this store knows the offsets of events {index.base}..{index.count - 1})"
                )
                raise StoreError(msg)
            at = index.offsets[covers - 1 - index.base]
            end = index.end if covers == index.count else index.offsets[covers - index.base]
        position = orjson.dumps({"covers": covers, "at": at, "end": end, "length": len(body)}) + b"\n"
        size = len(position) + len(body)
        path = self.snapshot_path(session_id)
        # overwritten in place, not replaced: truncating or renaming a file of a few hundred KB
        # costs 5-6 ms on ext4 against 0.2 ms for a write over its blocks. A reader that meets a
        # half-written snapshot (a crash, or a writer at the same moment) fails its digest and
        # replays; bytes past the recorded length are a longer predecessor's and are ignored.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # never through a planted link
            try:
                # the two parts written from where they are: the body is the largest thing a
                # snapshot allocates, and joining them would copy it
                for offset, part in ((0, memoryview(position)), (len(position), memoryview(body))):
                    written = 0
                    while written < len(part):
                        written += os.pwrite(fd, part[written:], offset + written)
                if os.fstat(fd).st_size > 2 * size:  # bound what a shrunk surface leaves behind
                    os.ftruncate(fd, size)
            finally:
                os.close(fd)
        except OSError as exc:
            msg = f"cannot write the snapshot {path}: {exc.strerror or exc}"
            raise StoreError(msg) from None

    def snapshot_get(self, session_id: str) -> tuple[int, bytes] | None:
        path = self.snapshot_path(session_id)
        log_path = self._existing(session_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:  # a folder or another unreadable thing at its name
            msg = f"{path}: the snapshot cannot be read ({exc.strerror or exc})"
            raise CorruptionError(msg) from None
        line, _, body = data.partition(b"\n")
        try:
            position = orjson.loads(line)
            covers, at, end, length = position["covers"], position["at"], position["end"], position["length"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            msg = f"{path}: the snapshot's position line is damaged"
            raise CorruptionError(msg) from None
        if not all(type(v) is int for v in (covers, at, end, length)) or not (covers >= 1 and 0 < at < end):
            msg = f"{path}: the snapshot's position {position!r:.120} is not a byte range"
            raise CorruptionError(msg)
        if len(body) < length:
            msg = f"{path}: the snapshot is torn ({len(body)} of {length} bytes)"
            raise CorruptionError(msg)
        body = body[:length]
        # the last event it covers must sit whole at that place in the log (the kernel then
        # compares its hash): a snapshot of a log rewritten since is stale, not a crash
        with open(log_path, "rb") as f:
            f.seek(at - 1)
            # a range past the log's end is not read (a huge one could not be allocated)
            last = f.read(end - at + 1) if end <= os.fstat(f.fileno()).st_size else b""
        try:
            raw = orjson.loads(last[1:]) if last[:1] == b"\n" and last.endswith(b"\n") else None
        except orjson.JSONDecodeError:
            raw = None
        if type(raw) is not dict or raw.get("seq") != covers - 1 or _MORE in raw:
            msg = f"{path}: the snapshot's last event (seq {covers - 1}) is not at bytes {at}..{end} of {log_path}"
            raise CorruptionError(msg)
        with self._mutex:
            if session_id not in self._index:
                # later reads and the repair scan start at the snapshot, not at the first event
                self._index[session_id] = _Index(offsets=array("q", [at]), end=end, base=covers - 1)
                self._primed.add(session_id)
        return covers, body

    def snapshot_delete(self, session_id: str) -> None:
        self.snapshot_path(session_id).unlink(missing_ok=True)

    # -- key-value table -----------------------------------------------------------------------
    # A name is its file's name, quoted ('/' becomes %2F). One whose quoted form would not fit a
    # file name (255 bytes, with the temporary file's additions) is stored under its first
    # characters, '~' and its sha256 instead (no quoted name holds '~'), and its entry holds the
    # name itself beside the value ({"~name": ..., "value": ...}) for kv_list: every name the
    # database stores accept is accepted here too.
    def _kv_path(self, namespace: str, key: str) -> Path:
        check_kv_name("namespace", namespace)
        check_kv_name("key", key)
        path = self.kv_dir / _kv_file_name(namespace) / (_kv_file_name(key) + ".json")
        self._refuse_outside(path, self.kv_dir, f"key-value {namespace}/{key}")
        return path

    def _kv_read(self, path: Path) -> tuple[bool, Any]:
        """Whether the entry file ``path`` is there, and the JSON it holds: every read of a
        key-value entry comes through here."""
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return False, None
        except IsADirectoryError:
            msg = f"{path}: a folder where a key-value entry should be; accepted: a file of JSON. The store is corrupt"
            raise CorruptionError(msg) from None
        try:
            return True, orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            msg = f"{path}: key-value entry is not valid JSON ({exc})"
            raise CorruptionError(msg) from None

    def kv_get(self, namespace: str, key: str) -> Any | None:
        path = self._kv_path(namespace, key)
        found, value = self._kv_read(path)
        if found and _KV_DIGEST in path.name:
            stored, value = _unwrap(path, value)
            if stored != key:  # a digest names one name; the entry must be that name's
                msg = f"{path}: holds the entry of another name ({stored[:80]!r}), not of {key[:80]!r}; the store is corrupt"
                raise CorruptionError(msg)
        return value

    def kv_put(self, namespace: str, key: str, value: Any) -> None:
        path = self._kv_path(namespace, key)
        try:
            payload = orjson.dumps({_KV_NAME_FIELD: key, "value": value} if _KV_DIGEST in path.name else value)
        except TypeError as exc:
            msg = f"key-value {namespace}/{key}: value is not JSON-serialisable ({exc})"
            raise StoreError(msg) from None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = write_temp(path, payload, fsync=self.fsync)
            os.replace(tmp, path)
        except OSError as exc:
            msg = f"cannot write key-value {namespace}/{key} to {path}: {exc.strerror or exc}"
            raise StoreError(msg) from None

    def kv_delete(self, namespace: str, key: str) -> None:
        self._kv_path(namespace, key).unlink(missing_ok=True)

    def kv_list(self, namespace: str, prefix: str = "") -> dict[str, Any]:
        folder = self.kv_dir / _kv_file_name(check_kv_name("namespace", namespace))
        self._refuse_outside(folder, self.kv_dir, f"key-value namespace {namespace}")
        if not folder.exists():
            return {}
        out = {}
        for path in sorted(folder.glob("*.json")):
            if path.name.startswith("."):
                continue
            if _KV_DIGEST in path.name:  # a long name, kept in its entry
                self._refuse_outside(path, self.kv_dir, f"key-value namespace {namespace}")
                found, entry = self._kv_read(path)
                if not found:  # deleted since the listing
                    continue
                key, value = _unwrap(path, entry)
                if _kv_file_name(key) + ".json" != path.name:
                    msg = f"{path}: holds the entry of another name ({key[:80]!r}); the store is corrupt"
                    raise CorruptionError(msg)
                if key.startswith(prefix):
                    out[key] = value
                continue
            key = urllib.parse.unquote(path.name[: -len(".json")])
            if key.startswith(prefix):
                out[key] = self.kv_get(namespace, key)
        # by key, like the database backends (file names sort by their quoted form)
        return dict(sorted(out.items()))

    # -- leases ------------------------------------------------------------------------------
    # ``leases/<name>.json`` ({token, holder, expires}) is replaced atomically, read and written
    # under a flock on ``<name>.lock`` beside it (kept for good: deleting a held lock file would
    # let a second taker in). A kernel home serves one host, so expiry is this host's wall clock.
    @contextlib.contextmanager
    def _lease_file(self, name: str) -> Iterator[tuple[Path, dict[str, Any] | None]]:
        check_kv_name("lease name", name)
        path = self.home / "leases" / (urllib.parse.quote(name, safe="") + ".json")
        try:
            lock = open(path.with_suffix(".lock"), "a+b")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:  # the folder is made on first use, not checked on every call
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(path.with_suffix(".lock"), "a+b")  # noqa: SIM115 - closed by the with below
        with lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # held for one read-modify-write: never long
            try:
                current = orjson.loads(path.read_bytes())
            except FileNotFoundError:
                current = None
            except orjson.JSONDecodeError as exc:
                msg = f"{path}: lease entry is not valid JSON ({exc})"
                raise CorruptionError(msg) from None
            yield path, current

    def _write_lease(self, path: Path, entry: dict[str, Any]) -> None:
        # atomic (rename) but not fsynced: a lease only matters while its holder lives, and a
        # power loss that could lose it ends every holder on this host too
        os.replace(write_temp(path, orjson.dumps(entry), fsync=False), path)

    def lease_acquire(self, name: str, holder: dict[str, Any], seconds: float, *, replace: str | None = None) -> Lease:
        token = check_lease_request(name, holder, seconds)
        with self._lease_file(name) as (path, current):
            now = time.time()
            held = current is not None and current["token"] != token
            if held and current["expires"] > now and current["token"] != replace:  # type: ignore[index]
                return Lease(name, current["holder"], False, current["expires"] - now)  # type: ignore[index]
            self._write_lease(path, {"token": token, "holder": holder, "expires": now + seconds})
        return Lease(name, holder, True, float(seconds), current["holder"] if held else None)  # type: ignore[index]

    def lease_renew(self, name: str, token: str, seconds: float) -> bool:
        check_lease_request(name, {"token": token}, seconds)
        with self._lease_file(name) as (path, current):
            if current is None or current["token"] != token:
                return False
            self._write_lease(path, {**current, "expires": time.time() + seconds})
            return True

    def lease_release(self, name: str, token: str) -> None:
        check_lease_request(name, {"token": token}, 1)
        with self._lease_file(name) as (path, current):
            if current is not None and current["token"] == token:
                path.unlink()

    # -- blobs: plain files under <home>/blobs, named by their key ---------------------------------
    def blob_path(self, key: str) -> Path:
        """The file holding blob ``key`` (keys are checked, so it is always inside the home)."""
        return self.blobs_dir / check_blob_key(key)

    def blob_put(self, key: str, data: bytes) -> BlobInfo:
        path = self.blob_path(key)
        data = check_blob_data(key, data)
        self._refuse_outside(path.parent, self.blobs_dir, f"blob {key}")
        self._check_blob_nesting(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = write_temp(path, data, fsync=self.fsync)
            os.replace(tmp, path)  # readers see the old file or the whole new one
            if self.fsync:
                self._fsync_dir(path.parent)
        except OSError as exc:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            msg = f"cannot write blob {key} to {path}: {exc.strerror or exc}; the old value (if any) is unchanged"
            raise StoreError(msg) from None
        return BlobInfo.of(key, data)

    def _check_blob_nesting(self, key: str) -> None:
        """Refuse, naming both keys, a blob key whose folder is another blob's file or whose
        file would be another blob's folder: the jsonl store keeps blobs as files under their
        keys, so ``a`` and ``a/b`` cannot both be (the database stores keep both)."""
        parts = key.split("/")
        for end in range(1, len(parts)):
            if (self.blobs_dir.joinpath(*parts[:end])).is_file():
                taken = "/".join(parts[:end])
                msg = (
                    f"blob {key}: the jsonl store keeps blobs as files and {taken!r} is a blob, so it cannot "
                    f"also be the folder of {key!r}; accepted: keys where no key is the folder of another "
                    "(the sqlite and postgres stores accept both)"
                )
                raise StoreError(msg)
        if self.blob_path(key).is_dir():
            msg = (
                f"blob {key}: the jsonl store keeps blobs as files and {key!r} is the folder of other blobs "
                f"({key}/...); accepted: keys where no key is the folder of another (the sqlite and postgres "
                "stores accept both)"
            )
            raise StoreError(msg)

    def blob_get(self, key: str) -> bytes | None:
        path = self.blob_path(key)
        try:
            self._refuse_outside(path, self.blobs_dir, f"blob {key}")
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IsADirectoryError:
            return None  # a folder of other keys, not a value
        except OSError as exc:
            msg = f"cannot read blob {key} from {path}: {exc.strerror or exc}"
            raise StoreError(msg) from None

    def blob_stat(self, key: str) -> BlobInfo | None:
        return self._stat_file(key, self.blob_path(key))

    def _stat_file(self, key: str, path: Path) -> BlobInfo | None:
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not path.is_file():
            return None
        identity = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with self._mutex:
            cached = self._blob_digests.get(path)
        if cached is not None and cached[0] == identity:
            return BlobInfo(key, st.st_size, cached[1])
        data = self.blob_get(key)
        if data is None:
            return None
        info = BlobInfo.of(key, data)
        with self._mutex:
            self._blob_digests[path] = (identity, info.sha256)
        return info

    def blob_list(self, prefix: str = "") -> list[BlobInfo]:
        check_blob_prefix(prefix)
        # walk only the deepest folder the prefix names
        folder = self.blobs_dir / prefix.rsplit("/", 1)[0] if "/" in prefix else self.blobs_dir
        if not folder.is_dir():
            return []
        out = []
        for path in folder.rglob("*"):
            key = path.relative_to(self.blobs_dir).as_posix()
            if any(part.startswith(".") for part in key.split("/")) or not key.startswith(prefix):
                continue  # a writer's temporary file, or outside the prefix
            if (info := self._stat_file(key, path)) is not None:
                out.append(info)
        return sorted(out, key=lambda info: info.key)

    def blob_delete(self, key: str) -> None:
        path = self.blob_path(key)
        self._refuse_outside(path.parent, self.blobs_dir, f"blob {key}")
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except OSError as exc:
            msg = f"cannot delete blob {key} at {path}: {exc.strerror or exc}"
            raise StoreError(msg) from None
        with self._mutex:
            self._blob_digests.pop(path, None)
        if self.fsync:
            self._fsync_dir(path.parent)

    def close(self) -> None:
        self._index.clear()
        self._fresh.clear()
        self._primed.clear()
        self._blob_digests.clear()

    @staticmethod
    def _fsync_dir(folder: Path) -> None:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _loads(line: bytes, path: Path, line_no: int) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        msg = f"{path}:{line_no}: not valid JSON ({exc})"
        raise CorruptionError(msg) from None


def _bad_more(path: Path, line_no: int, more: Any) -> CorruptionError:
    """A line whose ``"more"`` is not ``true``: a writer puts ``true`` on every event of a batch
    but the last, and nothing on the last, so any other value (``false``, ``0``, ``"no"``) would
    end or extend a batch where no writer did."""
    msg = (
        f'{path}:{line_no}: "more" is {more!r:.40}; accepted: true, or no "more" on a batch\'s last event. '
        "The log is corrupt and was not rewritten"
    )
    return CorruptionError(msg)
