"""The session's log in this process: the events folded so far, and the one write path.

Every event reaches the session through :meth:`SessionLog.fold`, in seq order: the surface applies
it and the tracker tracks it. New events are checked against the surface before anything is
written (:meth:`SessionLog.checked`), so a refused batch leaves the log byte-identical, then
appended all or nothing (:meth:`SessionLog.append`). A proxy's history can be checked and folded
ahead of its write (:meth:`SessionLog.hold`): the next append writes it first, in the same store
write.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import orjson

from .. import events as ev
from ..errors import CorruptionError, EventError, StoreError, SurfaceError
from ..events import Event, EventSpec, validate_shape
from ..meter import message_text_for_count
from ..store.base import deferred_sync
from ..text import storable

if TYPE_CHECKING:
    from ..messages import Message
    from ..meter import Meter
    from ..snapshot import LazyEvents
    from ..store.base import EventStore
    from ..surface import Surface
    from .track import Tracker

#: message counts :meth:`CountsAhead.count` keeps until their message lands (texts are kept): room
#: for the whole history of a request that brings one (a front door counts a client's new
#: messages before they land; a 100k-token coding history is about 900 messages)
COUNTED_ENTRIES = 4096
#: and at most this many characters of counted text (a 100k-token history is about 450,000)
COUNTED_CHARS = 2_000_000


class CountsAhead:
    """Counts of messages taken before they were appended (``Session.count_message``: a reply's
    estimate, a front door's ledger), by the exact text counted: the node that lands with that
    text takes its count instead of counting again. Kept per session, as a count holds for its
    exact text only; at most :data:`COUNTED_ENTRIES`."""

    __slots__ = ("chars", "meter", "pending")

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        #: text counted -> tokens, until a node with that text lands
        self.pending: dict[str, int] = {}
        self.chars = 0  # of the texts in ``pending``, at most: a landed one is not taken off

    def count(self, message: Message) -> int:
        text = message_text_for_count(message)
        tokens = self.pending.get(text)
        if tokens is None:
            tokens = self.meter.count_message(message)
            if len(self.pending) >= COUNTED_ENTRIES or self.chars + len(text) > COUNTED_CHARS:
                # bounded: counts nobody appended are only dropped (a new dict: a cleared one
                # keeps the size it grew to)
                self.pending, self.chars = {}, 0
            self.pending[text] = tokens
            self.chars += len(text)
        return tokens

    def take(self, built: Sequence[Event], surface: Surface) -> None:
        """Give each message node of ``built`` the count taken of its exact text before it landed."""
        for event in built:
            if event.type in ev.MESSAGE_TYPES:
                node = surface.node(event.seq)
                if node is not None and node.tokens is None:
                    tokens = self.pending.pop(message_text_for_count(node.message), None)
                    if tokens is not None:
                        node.tokens = tokens  # the meter's total takes it as if it had counted
        if not self.pending and self.chars:
            self.pending, self.chars = {}, 0  # all taken: the dict a long history grew is let go


class SessionLog:
    """One session's events in this process, folded into its surface and tracker, and appended."""

    def __init__(
        self,
        store: EventStore,
        session_id: str,
        surface: Surface,
        tracker: Tracker,
        counts: CountsAhead,
    ) -> None:
        self.store = store
        self.id = session_id
        self.surface = surface
        self.tracker = tracker
        self.counts = counts
        #: called with every batch once it is durable and folded: the session sets its snapshot
        #: schedule here (made after the log, from it)
        self.after_append: Callable[[Sequence[Event]], None] = _nothing
        #: the whole log in order; opened from a snapshot, a :class:`LazyEvents` that reads the
        #: events before the snapshot from the store on first use
        self.events: list[Event] | LazyEvents = []
        self.lock = threading.RLock()
        #: events validated and folded but not yet written: a proxy's history, held by
        #: ``prepare_request(history=...)`` so that the strategies see it and it is written with
        #: the request's ``step/start`` (or with whatever the strategies append first), one write
        self.held: list[Event] = []
        #: True after a write of held events failed: this object is ahead of its log and must be
        #: reopened (every later append refuses)
        self.stale = False

    def start_from(self, events: LazyEvents) -> None:
        """Start from a snapshot's events (a fresh log: nothing folded yet)."""
        self.events = events

    def refresh(self) -> int:
        """Fold events other writers appended since we last looked; returns how many (held events
        are written first: the log is compared with what it holds, never with what this object
        only holds in memory)."""
        with self.lock:
            if self.held and not self.stale:
                self.append([], durable=False)
            behind = self.store.next_seq(self.id) - len(self.events)
            if behind <= 0:
                return 0
            new = list(self.store.read(self.id, len(self.events)))
            for event in new:
                self.fold(event)
            return len(new)

    def read(self, start: int, end: int) -> list[Event]:
        """Events ``start..end-1`` from the store (a snapshot's events, read when first needed)."""
        return list(self.store.read(self.id, start, end))

    def fold(self, event: Event, message: Message | None = None, *, checked: bool = False) -> None:
        if event.seq != len(self.events):
            msg = f"session {self.id}: event seq {event.seq} does not follow {len(self.events) - 1}"
            raise CorruptionError(msg)
        if event.type not in ev.KERNEL_TYPES and not event.ignorable:
            msg = f"session {self.id}: event {event.seq} has unknown type {event.type!r} and is not ignorable"
            raise CorruptionError(msg)
        try:
            self.surface.apply(event, message, checked=checked)
        except (SurfaceError, EventError) as exc:
            msg = f"session {self.id}: event {event.seq} ({event.type}) cannot be replayed: {exc}"
            raise CorruptionError(msg) from None
        self.events.append(event)
        self.tracker.fold(self.id, event, live=checked)

    def append(
        self,
        batch: Sequence[EventSpec],
        *,
        durable: bool = True,
        parsed: dict[int, Message] | None = None,
        offered: dict[int, Message] | None = None,
    ) -> int:
        """Validate and durably append a batch (all or nothing); returns the first seq.

        Every event is checked against the surface before anything is written, so a refused
        batch leaves the log byte-identical. ``durable=False`` does not wait for the disk
        (:func:`ctxkernel.store.base.deferred_sync`): for a write whose loss in a power cut loses
        nothing acknowledged, such as a compaction's lock, which the commit's sync makes durable.
        ``parsed`` is the kernel's own (compaction.py): by index in ``batch``, a message whose
        ``to_dict()`` that entry's ``data["message"]`` is, so the surface check need not parse it.
        ``offered`` likewise, for messages from outside (a front door's history): parsed and
        checked all the same, and kept in place of their parse when they are equal to it.
        """
        with self.lock:
            built, messages = self.checked(batch, parsed, offered)
            held, start = self.held, (self.held[0].seq if self.held else len(self.events))
            try:
                with contextlib.nullcontext() if durable else deferred_sync(self.store):
                    self.store.append(self.id, [*held, *built] if held else built, start)
            except BaseException:
                if held:
                    self.stale = True  # the held events are folded here and not in the log
                raise
            self.held = []
            for event in built:
                self.fold(event, messages.get(event.seq), checked=True)
            if self.counts.pending:
                self.counts.take(built, self.surface)
            self.after_append([*held, *built] if held else built)
            return built[0].seq if built else len(self.events)

    def checked(
        self,
        batch: Sequence[EventSpec],
        parsed: dict[int, Message] | None = None,
        offered: dict[int, Message] | None = None,
    ) -> tuple[list[Event], dict[int, Message | None]]:
        """The batch as events after the log's (held events included), each checked against the
        surface; raises with nothing changed when one is refused. A message of ``offered`` (by
        index in ``batch``: the message whose ``to_dict()`` that entry's ``data["message"]`` is)
        that equals its event's parse is the one the node keeps: the parse checked that a replay
        reads the same message back, and the node does not hold a second copy of it."""
        if self.stale:
            msg = f"session {self.id}: a write failed after its events were folded; reopen the session"
            raise StoreError(msg)
        with self.lock:
            start = len(self.events)
            time = ev.utc_now()
            built = [Event(start + i, s.type, s.data, time, s.surface, s.ignorable) for i, s in enumerate(batch)]
            for i, event in enumerate(built):
                validate_shape(event)
                try:
                    # as deep as the store writes it: inside its event's record, one level down
                    # (orjson writes 254 levels, so data of 254 would pass alone and fail there)
                    orjson.dumps((event.data,))
                except TypeError as exc:
                    # the one place every text enters the log: a lone surrogate (a non-UTF-8 file
                    # name, a "\ud800" escape from a server) becomes U+FFFD instead of failing the turn;
                    # anything else (data nested too deep for the walk, too) is refused as it is
                    try:
                        if "surrogates" not in str(exc):
                            raise exc
                        cleaned = storable(event.data)
                        orjson.dumps((cleaned,))
                    except (TypeError, RecursionError) as why:
                        reason = "Recursion limit reached" if isinstance(why, RecursionError) else why
                        msg = f"{event.type} event data is not JSON-serialisable: {reason}"
                        raise EventError(msg) from None
                    built[i] = event = Event(event.seq, event.type, cleaned, event.time, event.surface, event.ignorable)
            surface_events = [e for e in built if e.type in ev.MESSAGE_TYPES or e.type == ev.SURFACE_DROP]
            messages: dict[int, Message | None] = {}
            known: dict[int, Message] = {}
            for i, message in (parsed or {}).items():
                if built[i].data is batch[i].data:  # not cleaned by storable(): the dict is the message's
                    known[start + i] = message
            same: dict[int, Message] = {}
            for i, message in (offered or {}).items():
                if built[i].data is batch[i].data:
                    same[start + i] = message
            if len(surface_events) <= 1:
                probe = self.surface
                saved = probe.applied
                probe.applied = start
                try:
                    for event in built:
                        # the surface_events test by type: `in` would compare events field by field
                        if event.type in ev.MESSAGE_TYPES or event.type == ev.SURFACE_DROP:
                            probe.applied = event.seq
                            messages[event.seq] = _kept(probe.check(event, known.get(event.seq)), same, event.seq)
                finally:
                    probe.applied = saved
            else:
                probe = self.surface.probe()
                for event in built:
                    messages[event.seq] = _kept(probe.check(event, known.get(event.seq)), same, event.seq)
                    probe.apply(event, messages[event.seq], checked=True)
            return built, messages

    def hold(self, batch: Sequence[EventSpec], offered: dict[int, Message] | None = None) -> None:
        """Check and fold ``batch`` without writing it: the next append writes it first, in the
        same store write (``prepare_request(history=...)``). Refused with nothing changed, as an
        append is. ``offered``: as for :meth:`checked`."""
        built, messages = self.checked(batch, offered=offered)
        for event in built:
            self.fold(event, messages.get(event.seq), checked=True)
        if self.counts.pending:
            self.counts.take(built, self.surface)
        self.held.extend(built)


def _kept(message: Message | None, offered: dict[int, Message], seq: int) -> Message | None:
    """``message`` (an event's parse), or the offered message it equals."""
    if message is None or not offered:
        return message
    mine = offered.get(seq)
    return mine if mine is not None and mine == message else message


def _nothing(built: Sequence[Event]) -> None:
    """No schedule yet."""


__all__ = ["COUNTED_CHARS", "COUNTED_ENTRIES", "CountsAhead", "SessionLog"]
