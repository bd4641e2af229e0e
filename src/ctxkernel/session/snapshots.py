"""When a session writes its snapshots, and how it opens from one (the format is
:mod:`ctxkernel.snapshot`): every ``[store] snapshot_every`` events, and at the step boundary after
a compaction commit; between them, the indexes a snapshot carries are folded a step at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import events as ev
from ..errors import StoreError
from ..logging import get_logger
from ..snapshot import SnapshotIndex, SnapshotRejected, SnapshotWriter
from ..snapshot import decode as decode_snapshot
from ..snapshot import restore as restore_snapshot
from ..timeline import Timeline

if TYPE_CHECKING:
    from ..events import Event
    from ..ports import SessionPort
    from ..surface import Surface
    from .log import SessionLog
    from .track import Tracker

log = get_logger("ctxkernel.session")

#: the appends at which a snapshot a compaction commit made due is written (Snapshots.after_append)
_BOUNDARIES = frozenset({ev.STEP_START, ev.STEP_END, ev.TURN_END})

#: per class of a ``session.state`` entry: whether it is a SnapshotIndex with a ``sync()`` that
#: Snapshots.sync_indexes calls. Decided once per class (the isinstance check of a runtime-checkable
#: Protocol costs ~10 us, twice a request): classes are the program's, shared by every session
_INDEX_CLASSES: dict[type, bool] = {}
_INDEX_CLASSES_MAX = 1024


class Snapshots:
    """One session's snapshot schedule, and what the snapshot it opened from handed over."""

    def __init__(self, session: SessionPort, log: SessionLog, tracker: Tracker, surface: Surface) -> None:
        self.session = session
        self.log = log
        self.tracker = tracker
        self.surface = surface
        self.writer = SnapshotWriter()
        self.at = 0  # events covered by the newest snapshot written or loaded
        self.due = False  # a compaction committed since: snapshot at the next step boundary
        #: opened from a snapshot: the state each strategy put into it (``{"version", "data"}`` by
        #: name), until the strategy takes it with ``StrategyHandle.restored``
        self.strategy_states: dict[str, dict[str, Any]] = {}
        #: likewise the session-wide indexes (:class:`ctxkernel.snapshot.SnapshotIndex`: the
        #: history index and the notes), by their ``state`` key, until each is first built
        self.indexes: dict[str, Any] = {}

    def after_append(self, built: Sequence[Event]) -> None:
        """Write a snapshot every ``[store] snapshot_every`` events, and after a compaction commit
        at the next step boundary (``step/start``, ``step/end`` or ``turn/end``, or the return of
        ``request_failed``): not inside the commit, whose cost is one durable
        write, and once for several commits of one step. The snapshot is a cache: a crash before
        it is written costs a longer replay, never an event."""
        every = self.session.kernel.profile.store.snapshot_every
        if not every:
            return
        types = {e.type for e in built}
        if ev.COMPACTION_END in types:
            self.due = True
        if len(self.log.events) - self.at >= every or (self.due and not types.isdisjoint(_BOUNDARIES)):
            self.write()
        elif ev.STEP_END in types or ev.TURN_END in types:
            self.sync_indexes()

    def sync_indexes(self) -> None:
        """Fold the snapshot's indexes (the timeline, and recall's history index once in use) up
        to the end of a step, a few events each time, so that the snapshot a compaction commit
        calls for folds only the events of its own step, not all since the last snapshot."""
        session = self.session
        Timeline.for_session(session)
        strategies = session.kernel.strategies
        for key, value in session.state.items():
            if key not in strategies and _syncs_as_index(value):
                value.sync()

    def write(self) -> None:
        """Write a snapshot of the folded state now. A failed write is logged and only makes the
        next open replay more."""
        session, log_ = self.session, self.log
        with log_.lock:
            if not log_.events:
                return
            if log_.held:  # a snapshot never covers events the log does not hold yet
                self.due = True
                return
            Timeline.for_session(session)  # the inspector's timeline rides in every snapshot (timeline.py)
            covers = len(log_.events)
            self.at = covers
            self.due = False
            try:
                log_.store.snapshot_put(log_.id, covers, self.writer.encode(session, self.tracker.snapshot()))
            except (StoreError, OSError) as exc:
                log.warning("snapshot not written", session=log_.id, seq=covers, error=str(exc))

    def write_if_due(self) -> None:
        with self.log.lock:
            if self.due:
                self.write()

    def open_from(self, covers: int, payload: bytes) -> bool:
        """Install a stored snapshot of the first ``covers`` events into this fresh session (see
        :mod:`ctxkernel.snapshot`); False, with a warning naming the reason, when it cannot be
        trusted, and the session is untouched for a full replay."""
        log_ = self.log
        try:
            body = decode_snapshot(payload, log_.id, covers, log_.store.next_seq(log_.id))
            last = next(iter(log_.store.read(log_.id, covers - 1, covers)), None)
            restored = restore_snapshot(body, last, self.session.meter.tokenizer.name, log_.read)
        except SnapshotRejected as exc:
            log.warning("snapshot set aside; replaying the whole log", session=log_.id, reason=str(exc))
            return False
        self.surface.install(
            restored.nodes, restored.covers, restored.surface_version, restored.place, restored.indexes
        )
        log_.start_from(restored.events)
        self.tracker.restore(restored.track)
        self.strategy_states = restored.strategies
        self.indexes = restored.session_indexes
        self.at = covers
        return True


def _syncs_as_index(value: Any) -> bool:
    """Whether ``value``'s class is a :class:`SnapshotIndex` with a ``sync()`` method (an object
    that has them only as instance attributes is not synced here: the snapshot folds it when written)."""
    cls = type(value)
    decision = _INDEX_CLASSES.get(cls)
    if decision is None:
        decision = issubclass(cls, SnapshotIndex) and callable(getattr(cls, "sync", None))
        if len(_INDEX_CLASSES) >= _INDEX_CLASSES_MAX:
            _INDEX_CLASSES.clear()  # bounded: a program that makes classes at run time
        _INDEX_CLASSES[cls] = decision
    return decision


__all__ = ["Snapshots"]
