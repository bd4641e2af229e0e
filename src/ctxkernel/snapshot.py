"""Session snapshots: opening a session costs its surface plus the tail of its log, not its history.

A snapshot is the folded state of a log prefix: the surface (every visible node's event and its
cached token count), the pairing indexes, the session's turn/step/compaction/header/route/anchor
tracking, each strategy's folded state and the session-wide indexes. The session writes one at each
compaction commit (at the next step boundary, not inside the transaction) and every ``[store]
snapshot_every`` events (:meth:`Session.append`), through
the store's ``snapshot_put`` (only ``store/`` touches disk). Opening a session loads the newest
one and replays only the events after it.

Format: one line ``ctxkernel-snapshot <version> <sha256 of the body>``, then the body (an orjson
object). A snapshot is trusted only when its digest matches its body, its version is
:data:`SNAPSHOT_VERSION`, it names the session, it covers no more events than the log holds, and
the hash of the last event it covers (:func:`event_hash`) equals that event as the log holds it
now. Anything else (missing, stale, corrupt, another version) is set aside with a warning naming
the reason, and the whole log is replayed: the result is the same session either way.

Strategies take part through the ``snapshot_state`` hook: each returns its folded state as a
:class:`StrategySnapshot` (plain JSON with the strategy's own format version, made by
``StrategyHandle.snapshot``), kept under ``strategies`` in the body. On open the parts wait in
``session.snapshot_states`` until each strategy takes its own with ``StrategyHandle.restored``
(which checks the version and rebuilds the state, and answers None, so that the strategy folds the
whole log, for a missing, other-version or malformed part) and folds only the events after it.
A strategy that does not implement the hook rebuilds its state from ``session.events`` as after a
full replay (its ``session.state`` entry is never written as it is: it may hold this process's
transient counters, which a full replay would not have). The history index and the notes take part
as :class:`SnapshotIndex` objects (``session_indexes``). ``session.events`` of a session opened
from a snapshot is a :class:`LazyEvents`: the
events before the snapshot are read from the store the first time something looks at them
(history recall, a strategy's first fold), not at open.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, overload, runtime_checkable

import orjson

from .errors import CorruptionError
from .events import KERNEL_TYPES, Event
from .logging import get_logger
from .messages import Message
from .spec import StrategySnapshot  # a strategy's part of a snapshot: a value the hooks return
from .surface import Node

if TYPE_CHECKING:
    from .ports import SessionPort

#: 2: strategy state only through the ``snapshot_state`` hook (version 1 also restored every plain
#: JSON ``session.state`` entry, this process's transient counters included)
SNAPSHOT_VERSION = 2
_MAGIC = b"ctxkernel-snapshot"

log = get_logger("ctxkernel.snapshot")


class SnapshotRejected(Exception):  # a reason to replay, never raised to a caller
    """Why a stored snapshot cannot be used (the open falls back to a full replay)."""


def event_hash(event: Event) -> str:
    """SHA-256 of the event's canonical JSON: what a snapshot records of the last event it covers."""
    return hashlib.sha256(orjson.dumps(event.to_dict(), option=orjson.OPT_SORT_KEYS)).hexdigest()


def _plain(value: Any, depth: int = 0) -> bool:
    """True for JSON data that survives a round trip unchanged (no sets, tuples or objects)."""
    if value is None or type(value) in (str, int, float, bool):
        return True
    if depth > 32:
        return False
    if type(value) is list:
        return all(_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    return False


#: where the nodes go in the body's JSON: a byte orjson never writes (it escapes control
#: characters in strings), so it is found exactly once
_NODES_MARK = b"\x00"
#: nodes serialised per ``orjson.dumps``: each call's growing buffer is small, where one call for
#: the whole surface peaked at three times the snapshot's size (``tracemalloc``)
_NODES_PER_CHUNK = 256
#: the first line's length: the magic, the version and a SHA-256 in hex
_HEADER_BYTES = len(b"%s %d %s\n" % (_MAGIC, SNAPSHOT_VERSION, b"0" * 64))


class SnapshotWriter:
    """Builds a session's snapshots. Nothing is kept between them: the nodes are serialised when
    the snapshot is written, a chunk at a time (a node kept serialised between snapshots cost
    about as much memory as its message, for every visible node: docs/performance.md, "Memory per
    session")."""

    @staticmethod
    def _node(node: Node) -> tuple[dict[str, Any], int | None, int, int]:
        return (node.event.to_dict(), node.tokens, node.turn, node.step)

    def encode(self, session: SessionPort, track: dict[str, Any]) -> bytearray:
        """The snapshot of ``session`` as it is now; ``track`` is its tracked state
        (``Tracker.snapshot``). A ``bytearray``, which the stores take as they take bytes: a
        copy to ``bytes`` would hold it twice."""
        surface = session.surface
        strategies = set(session.kernel.strategies)
        parts = strategy_parts(session, strategies)
        body = {
            "version": SNAPSHOT_VERSION,
            "session": session.id,
            "covers": len(session.events),
            "last_hash": event_hash(session.events[-1]),
            "tokenizer": session.meter.tokenizer.name,
            "surface": {
                "applied": surface.applied,
                "version": surface.version,
                "turn": surface.turn,
                "step": surface.step,
                "nodes": orjson.Fragment(_NODES_MARK),
                "pending_calls": surface.pending_calls,
                "call_owner": surface.call_owner,
                "result_of": surface.result_of,
            },
            "track": track,
            "strategies": parts,
            "session_indexes": index_parts(session),
        }
        before, after = orjson.dumps(body).split(_NODES_MARK)
        # one buffer, grown as each chunk is made and let go, with room kept for the first line
        # (written last, once the digest is known): pieces joined at the end were held twice
        out = bytearray(_HEADER_BYTES)
        out += before
        out += b"["
        nodes, node = surface.nodes, self._node
        for at in range(0, len(nodes), _NODES_PER_CHUNK):
            if at:
                out += b","
            out += memoryview(orjson.dumps([node(n) for n in nodes[at : at + _NODES_PER_CHUNK]]))[1:-1]
        out += b"]"
        out += after
        with memoryview(out) as view:
            digest = hashlib.sha256(view[_HEADER_BYTES:]).hexdigest().encode()
        out[:_HEADER_BYTES] = b"%s %d %s\n" % (_MAGIC, SNAPSHOT_VERSION, digest)
        return out


@runtime_checkable
class SnapshotIndex(Protocol):
    """A session-wide index kept in ``session.state`` (not a strategy's: the history index and the
    notes of ``ctxkernel.recall``) that takes part in snapshots. Its ``folded()`` is written under
    its ``session.state`` key; opened from a snapshot, the index takes it back from
    ``session.snapshot_indexes`` (by the same key) when it is first built, and folds on from the
    cursor the data holds."""

    def folded(self) -> dict[str, Any]:
        """The index folded to the end of ``session.events``, as plain JSON with its cursor."""
        ...


def folded_cursor(data: Any, version: int, log_length: int) -> int:
    """The cursor of a :meth:`SnapshotIndex.folded` output, after checking its format version
    and that the cursor lies inside the log (ValueError names what is wrong)."""
    if data["version"] != version:
        msg = f"version {data['version']!r}, this ctxkernel reads {version}"
        raise ValueError(msg)
    cursor = data["cursor"]
    if type(cursor) is not int or not 0 < cursor <= log_length:
        msg = f"cursor {cursor!r} is outside the log (length {log_length})"
        raise ValueError(msg)
    return cursor


def index_parts(session: SessionPort) -> dict[str, Any]:
    """Every :class:`SnapshotIndex` of the session, folded; an index restored from the snapshot
    this session was opened from and not used since is carried over as it was (still valid: it
    holds its own cursor, and folds on from there when it is first used)."""
    out: dict[str, Any] = dict(session.snapshot_indexes)
    strategies = session.kernel.strategies
    for key, value in session.state.items():
        if key not in strategies and isinstance(value, SnapshotIndex):
            out[key] = value.folded()
    return out


def strategy_parts(session: SessionPort, strategies: set[str]) -> dict[str, dict[str, Any]]:
    """``{strategy: {"version", "data"}}`` from the ``snapshot_state`` hook. A part that is not a
    :class:`StrategySnapshot` of a strategy of the profile, or whose data is not plain JSON, is
    left out with a warning (that strategy folds the whole log at the next open); the snapshot
    itself is still written."""
    parts: dict[str, dict[str, Any]] = {}
    try:
        results = session.kernel.hooks.snapshot_state(session)
    except Exception as exc:  # a strategy's defect costs only a longer open, never the append
        log.warning("snapshot written without strategy state", session=session.id, error=f"{type(exc).__name__}: {exc}")
        return parts
    for part in results:
        if not isinstance(part, StrategySnapshot) or part.strategy not in strategies or part.strategy in parts:
            log.warning(
                "snapshot_state result set aside",
                session=session.id,
                reason="not a StrategySnapshot of a strategy of this profile, or a second one from the same strategy",
                result=repr(part)[:120],
            )
            continue
        if type(part.version) is not int or type(part.data) is not dict or not _plain(part.data):
            log.warning(
                "snapshot_state result set aside",
                session=session.id,
                strategy=part.strategy,
                reason="version must be an int and data plain JSON (dicts with str keys, lists, str, numbers, None)",
            )
            continue
        parts[part.strategy] = {"version": part.version, "data": part.data}
    return parts


def decode(payload: bytes, session_id: str, covers: int, log_length: int) -> dict[str, Any]:
    """The checked body of a stored snapshot; :class:`SnapshotRejected` says why it cannot be used."""
    line, newline, data = payload.partition(b"\n")
    parts = line.split(b" ")
    if not newline or len(parts) != 3 or parts[0] != _MAGIC:
        msg = "not a ctxkernel snapshot (damaged first line)"
        raise SnapshotRejected(msg)
    if parts[1] != str(SNAPSHOT_VERSION).encode():
        msg = f"snapshot format version {parts[1][:16]!r}, this ctxkernel reads {SNAPSHOT_VERSION}"
        raise SnapshotRejected(msg)
    if hashlib.sha256(data).hexdigest().encode() != parts[2]:
        msg = "the snapshot's digest does not match its body (damaged or torn)"
        raise SnapshotRejected(msg)
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        msg = f"the snapshot body is not JSON ({exc})"
        raise SnapshotRejected(msg) from None
    if type(body) is not dict or body.get("session") != session_id or body.get("covers") != covers:
        msg = "the snapshot names another session or another length than the store recorded"
        raise SnapshotRejected(msg)
    if not 0 < covers <= log_length:
        msg = f"the snapshot covers {covers} events but the log holds {log_length} (stale)"
        raise SnapshotRejected(msg)
    return body


#: the types each entry of a snapshot's ``track`` (``Tracker.snapshot``) can have after a replay;
#: ``last_decoration_delta`` is whatever the log's last reply recorded
_NONE = type(None)
_TRACK_TYPES: dict[str, tuple[type, ...]] = {
    "turn": (int,),
    "turn_open": (bool,),
    "step": (int,),
    "step_open": (bool,),
    "open_compaction": (dict, _NONE),
    "compaction_summaries": (list,),
    "header_hash": (str, _NONE),
    "header_tools": (list,),
    "route": (dict, _NONE),
    "anchor": (list, _NONE),
    "last_decoration_delta": (object,),
}


def _track_fits(track: Any) -> bool:
    """Whether a snapshot's ``track`` has every entry ``Tracker.restore`` takes, each of a type
    a replay gives it (exact: a bool is not a turn)."""
    return (
        type(track) is dict
        and all(
            key in track and (types == (object,) or type(track[key]) in types) for key, types in _TRACK_TYPES.items()
        )
        and all(type(row) is dict for row in track["compaction_summaries"])
        and (track["anchor"] is None or len(track["anchor"]) == 3)
    )


@dataclass(frozen=True)
class Restored:
    """A checked snapshot, ready to install into a fresh session (:func:`restore` builds it; the
    session's parts each take their own share)."""

    covers: int
    nodes: list[Node]
    #: the surface's version, the turn and step its next node belongs to, and its pairing indexes
    surface_version: int
    place: tuple[int, int]
    indexes: tuple[dict[str, int], dict[str, int], dict[str, int]]
    track: dict[str, Any]
    #: each strategy's part (``{"version", "data"}`` by name) and the session-wide indexes' parts
    strategies: dict[str, dict[str, Any]]
    session_indexes: dict[str, Any]
    events: LazyEvents


def restore(
    body: dict[str, Any], last: Event | None, tokenizer: str, load: Callable[[int, int], Iterable[Event]]
) -> Restored:
    """Everything a decoded snapshot holds, checked and built: ``last`` is the log's event the
    snapshot says it covers last, ``tokenizer`` the meter's (node counts of another are not kept),
    ``load(start, end)`` reads the events before it when they are first needed. Nothing is
    installed here, so a snapshot that fails any check leaves the session untouched for the full
    replay. Raises :class:`SnapshotRejected`."""
    covers = body["covers"]
    if last is None or last.seq != covers - 1 or event_hash(last) != body.get("last_hash"):
        msg = f"the log's event {covers - 1} is not the one the snapshot covers (stale: the log was rewritten)"
        raise SnapshotRejected(msg)
    try:
        surface = body["surface"]
        same_tokenizer = body["tokenizer"] == tokenizer
        nodes = []
        for raw, tokens, turn, step in surface["nodes"]:
            event = Event.from_dict(raw)
            node = Node(event, Message.from_dict(event.data["message"]), int(turn), int(step))
            if same_tokenizer and type(tokens) is int and tokens >= 0:
                node.tokens = tokens
            nodes.append(node)
        indexes = tuple(
            {str(k): int(v) for k, v in surface[name].items()} for name in ("pending_calls", "call_owner", "result_of")
        )
        place = (surface["turn"], surface["step"])
        track = body["track"]
        parts = body.get("strategies", {})  # absent from a snapshot written before strategies took part
        session_indexes = body.get("session_indexes", {})
        if (
            surface["applied"] != covers
            or type(surface["version"]) is not int
            or not all(type(v) is int for v in place)
            or not isinstance(parts, dict)
            or not isinstance(session_indexes, dict)
            or not all(
                isinstance(p, dict) and type(p.get("version")) is int and isinstance(p.get("data"), dict)
                for p in parts.values()
            )
            or not _track_fits(track)
        ):
            msg = "the snapshot's fields do not fit together"
            raise SnapshotRejected(msg)
    except SnapshotRejected:
        raise
    except Exception as exc:  # any defect in a verified-digest body still only costs a replay
        msg = f"the snapshot body is malformed ({type(exc).__name__}: {exc})"
        raise SnapshotRejected(msg) from None
    return Restored(
        covers,
        nodes,
        surface["version"],
        place,
        indexes,  # type: ignore[arg-type]
        track,
        dict(parts),
        dict(session_indexes),
        LazyEvents(load, covers),
    )


class LazyEvents(Sequence[Event]):
    """``session.events`` of a session opened from a snapshot: the events from ``base`` on are held
    as they fold; those before it are read from the store on first use, in aligned chunks back
    from ``base`` (a strategy whose cursor lags the snapshot by a few events reads only those)."""

    #: events before ``base`` are loaded from a multiple of this seq
    CHUNK = 1024

    def __init__(self, load: Callable[[int, int], Iterable[Event]], base: int) -> None:
        self._load = load
        self.base = base
        self._head: list[Event] = []  # events [base - len(_head), base), loaded on demand
        self._tail: list[Event] = []

    @property
    def loaded(self) -> int:
        """How many events before ``base`` have been read from the store."""
        return len(self._head)

    def _head_from(self, start: int) -> list[Event]:
        """The loaded head, extended back to hold seq ``start``."""
        first = self.base - len(self._head)
        if start < first:
            start -= start % self.CHUNK
            more = list(self._load(start, first))
            if len(more) != first - start or any(e.seq != start + i for i, e in enumerate(more)):
                msg = f"the log's events {start}..{first - 1} could not be read back in order (got {len(more)})"
                raise CorruptionError(msg)
            # the check a replay makes of each event (Session._fold), for the events it skipped
            for event in more:
                if event.type not in KERNEL_TYPES and not event.ignorable:
                    msg = f"event {event.seq} has unknown type {event.type!r} and is not ignorable"
                    raise CorruptionError(msg)
            self._head = more + self._head
        return self._head

    def __len__(self) -> int:
        return self.base + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1 and start >= self.base:
                return self._tail[start - self.base : max(start, stop) - self.base]
            if step != 1:
                return (self._head_from(0) + self._tail)[index]
            if stop <= start:
                return []
            head = self._head_from(start)
            offset = self.base - len(head)
            return (head + self._tail)[start - offset : stop - offset]
        if index < 0:
            index += len(self)
        if index >= self.base:
            return self._tail[index - self.base]
        if index < 0:
            raise IndexError("event index out of range")
        head = self._head_from(index)
        return head[index - (self.base - len(head))]

    def __iter__(self) -> Iterator[Event]:
        if self.base:
            yield from self._head_from(0)
        yield from self._tail

    def __reversed__(self) -> Iterator[Event]:
        yield from reversed(self._tail)
        for seq in range(self.base - 1, -1, -1):
            yield self[seq]

    def __bool__(self) -> bool:
        return len(self) > 0

    def append(self, event: Event) -> None:
        self._tail.append(event)

    def __repr__(self) -> str:
        return f"LazyEvents(base={self.base}, loaded={self.loaded}, tail={len(self._tail)})"


__all__ = [
    "SNAPSHOT_VERSION",
    "LazyEvents",
    "Restored",
    "SnapshotRejected",
    "SnapshotIndex",
    "SnapshotWriter",
    "StrategySnapshot",
    "decode",
    "event_hash",
    "index_parts",
    "restore",
    "strategy_parts",
]
