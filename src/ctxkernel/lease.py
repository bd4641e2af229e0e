"""The compaction lease: who may run a compaction transaction on a session, across hosts.

The ``compaction/start`` event in the log marks a transaction open (docs/design/host-model.md §3); the lease
``compaction/<session id>`` in the store says whether its holder is still alive. A transaction
takes the lease before it writes its start and gives it up after its end; while it runs, the
process's renewer thread (:class:`Renewals`) renews the lease every third of
``[store] lease_seconds``. A holder that dies stops
renewing, and once its lease has expired (judged by the store's clock: the database server's for
postgres, so workers' clocks never matter) the next transaction or the next opening of the
session takes the lease over and ends the abandoned compaction with an error end that records
the takeover (``compaction/end {error, takeover}``).

The log, not the lease, keeps a stale holder out: every write is appended against the seq its
writer last saw, so of a holder that stalled past its expiry and the worker that took over,
only one can end the compaction.

A holder on this host whose process is gone is taken over at once (its pid is not alive); the
lease of a holder on another host is only ever taken over after its expiry.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from .errors import CompactionBusyError
from .events import COMPACTION_END, EventSpec, utc_now
from .logging import get_logger

if TYPE_CHECKING:
    from .ports import SessionPort
    from .store import Lease

log = get_logger("ctxkernel.lease")


def host_id(settings: Any) -> str:
    """The host id holders carry: ``[store] host_id``, else the machine's host name."""
    return getattr(settings, "host_id", None) or socket.gethostname()


def _pid_is_dead(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False  # this process's own transactions always give their lease up
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class CompactionLease:
    """The lease of one compaction transaction (or of one takeover) on ``session``."""

    def __init__(self, session: SessionPort) -> None:
        settings = session.kernel.profile.store
        self.session = session
        self.store = session.store
        self.name = f"compaction/{session.id}"
        self.seconds = float(settings.lease_seconds)
        self.holder: dict[str, Any] = {
            "host": session.holder["host"],
            "pid": os.getpid(),
            "started": utc_now(),
            "token": uuid.uuid4().hex,
        }
        #: the holder whose lease this one replaced (expired, or dead on this host), if any
        self.previous: dict[str, Any] | None = None
        #: set when a renewal found the lease taken over: the transaction must not commit
        self.lost = threading.Event()
        self._stop = threading.Event()

    def try_acquire(self) -> Lease:
        """Take the lease if nobody live holds it; the store's answer either way."""
        lease = self.store.lease_acquire(self.name, self.holder, self.seconds)
        other = lease.holder
        if not lease.acquired and other.get("host") == self.holder["host"] and _pid_is_dead(other.get("pid")):
            lease = self.store.lease_acquire(self.name, self.holder, self.seconds, replace=other.get("token"))
        if lease.acquired:
            self.previous = lease.previous
        return lease

    def acquire(self) -> None:
        """Take the lease and start renewing it; :class:`CompactionBusyError` when held."""
        lease = self.try_acquire()
        if not lease.acquired:
            other, busy = lease.holder, self.session.open_compaction
            what = "a compaction is starting"
            if busy is not None:
                what = f"compaction {busy['compaction_id']} by strategy {busy['strategy']!r} is open since seq {busy['seq']}"
            msg = (
                f"session {self.session.id}: {what} (lease holder: host {other.get('host')!r} pid "
                f"{other.get('pid')} since {other.get('started')}, valid {lease.remaining:.1f} s more unless "
                "renewed); wait for it to end"
            )
            raise CompactionBusyError(msg)
        RENEWALS.add(self)

    def renew(self) -> bool:
        """One renewal (the renewer thread's); False once this lease needs no more."""
        if self._stop.is_set():
            return False
        try:
            if not self.store.lease_renew(self.name, self.holder["token"], self.seconds):
                if not self._stop.is_set():  # else: released while this renewal ran
                    self.lost.set()
                    log.error("compaction lease lost: another worker took it over", lease=self.name)
                return False
        except Exception as exc:  # a store error: logged, retried at the next tick
            log.warning("compaction lease not renewed", lease=self.name, error=f"{type(exc).__name__}: {exc}")
        return True

    def release(self) -> None:
        """Stop renewing and give the lease up. A store error is logged, never raised: the
        lease then expires on its own. A renewal already running when the lease is given up
        finds the token gone (every store renews by token), so it neither revives the lease
        nor reports it lost."""
        self._stop.set()
        RENEWALS.discard(self)
        try:
            self.store.lease_release(self.name, self.holder["token"])
        except Exception as exc:  # the lease expires by itself; the caller's outcome stands
            log.warning("compaction lease not released", lease=self.name, error=f"{type(exc).__name__}: {exc}")

    def takeover_end(self, open_compaction: dict[str, Any]) -> EventSpec:
        """The error end of a compaction whose holder no longer holds the lease (this one does)."""
        before = open_compaction.get("holder") or {}
        if self.previous is None:
            why = "its holder gave up the lease without writing its end"
        elif self.previous.get("host") == self.holder["host"] and _pid_is_dead(self.previous.get("pid")):
            why = "its holder's process is gone"
        else:
            why = "its holder's lease expired"
        log.warning(
            "compaction taken over",
            session=self.session.id,
            compaction_id=open_compaction["compaction_id"],
            holder=before,
            reason=why,
        )
        return EventSpec(
            COMPACTION_END,
            {
                "compaction_id": open_compaction["compaction_id"],
                "error": f"interrupted: taken over by host {self.holder['host']!r} pid {self.holder['pid']}; {why}",
                "takeover": {"holder": before, "lease": self.previous, "by": self.holder, "reason": why},
            },
        )


class Renewals:
    """The process's renewer: one daemon thread renews every held lease a third of its term
    after the last renewal. One thread for all rather than one per transaction: starting a
    thread and waiting for it cost 0.2-2 ms of every compaction, a model-free one included.
    A renewal that blocks (a slow store) delays the others by as much, well inside the two
    thirds of a term left before any of them expires. Idle, the thread wakes every third of the
    last lease's term, so the next lease of that term (a process's compactions share one) is
    renewed in time without a notify at ``add``: a notify hands the GIL to the renewer in the
    middle of the transaction."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Start empty: at creation, and in a forked child, which holds none of its parent's
        leases, has no renewer thread, and may have copied a lock that thread held."""
        self._cond = threading.Condition()
        self._due: dict[CompactionLease, float] = {}  # lease -> monotonic time of its next renewal
        self._thread: threading.Thread | None = None
        self._idle = 60.0  # seconds the thread sleeps with no lease due: a third of the last lease's term
        self._wake = 0.0  # monotonic time at which the waiting thread wakes by itself

    def add(self, lease: CompactionLease) -> None:
        with self._cond:
            due = self._due[lease] = time.monotonic() + lease.seconds / 3
            self._idle = lease.seconds / 3
            if self._thread is None or not self._thread.is_alive():  # first use, or a forked child
                self._thread = threading.Thread(target=self._run, name="ctxkernel lease renewer", daemon=True)
                self._thread.start()
            if due < self._wake:  # else the thread wakes in time by itself (see the class doc)
                self._cond.notify()

    def discard(self, lease: CompactionLease) -> None:
        with self._cond:
            self._due.pop(lease, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [lease for lease, at in self._due.items() if at <= now]
                if not due:
                    self._wake = min(self._due.values(), default=now + self._idle)
                    self._cond.wait(self._wake - now)
                    continue
                for lease in due:
                    self._due[lease] = now + lease.seconds / 3
            for lease in due:  # outside the lock: a renewal is a store call
                if not lease.renew():
                    self.discard(lease)


RENEWALS = Renewals()
os.register_at_fork(after_in_child=RENEWALS.forget)
