"""Crash proof for stores: SIGKILL a writer at random points and check what survives.

A writer process (``python -m ctxkernel.testing.crash SPEC SESSION ACKS SEED HOME``) runs an agent loop
on the ``basic`` strategy with a small window, so it compacts every few steps, and after every
batch the store acknowledges it appends ``first count sha256`` to the ACKS file. Half the writers
(and every held one) have a summarizer model, so their compactions write the lock first and ask
the model under it; the others commit basic's extractive summary in one batch. It sleeps a
random moment inside each locked compaction transaction (right after ``compaction/start``), so
that kills land there too. The parent kills it with SIGKILL after a random delay (and every few trials, for
certain, while it waits inside a compaction transaction opened after it committed one), then checks
(:func:`verify_session`):

* the log reads back as contiguous seqs and replays into a surface (no corruption);
* every acknowledged batch is there, byte for byte (canonical hash);
* every compaction is all or nothing: a ``compaction/summary`` is followed, in the same batch, by
  its replacements and a clean ``compaction/end``; a transaction that never committed put nothing
  on the surface and, once the session is reopened, has exactly one ``compaction/end {error}``;
* the reopened session accepts new turns.

Trials continue the same session, so each also proves resuming a session a crash interrupted.
:func:`run_trials` is what the test suite (a small fixed sample) and ``benchmarks/stress_store.py``
(100+ trials per backend) call.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CtxKernelError
from ..events import COMPACTION_END, COMPACTION_START, COMPACTION_SUMMARY, SURFACE_DROP, USER_MESSAGE, Event
from ..store.base import EventStore
from ..store.cli import event_bytes, open_store

READY = "ready"
INSIDE = "inside"  # written when a compaction transaction is open and the writer waits in it


def batch_hash(events: Sequence[Event]) -> str:
    digest = hashlib.sha256()
    for event in events:
        digest.update(event_bytes(event) + b"\n")
    return digest.hexdigest()


class AckingStore:
    """Wraps a store: records each acknowledged batch, and dawdles inside compactions."""

    def __init__(self, inner: EventStore, acks: Path, rng: random.Random, pause: float, hold: bool = False) -> None:
        self._inner = inner
        self.backend = inner.backend
        self._fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._rng = rng
        self._pause = pause
        self._hold = hold
        self._committed = False  # a held writer holds only once it has committed a compaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def ack(self, line: str) -> None:
        # one write() per line: a kill cannot leave half a line in the page cache
        os.write(self._fd, (line + "\n").encode())

    def append(self, session_id: str, events: Sequence[Event], expected_seq: int) -> None:
        self._inner.append(session_id, events, expected_seq)
        self.ack(f"{events[0].seq} {len(events)} {batch_hash(events)}")
        # so the held trial proves both a committed compaction and one killed open, however few
        # steps the loaded machine let the earlier trials' writers take before their kills
        self._committed = self._committed or any(e.type == COMPACTION_END and not e.data.get("error") for e in events)
        if events[-1].type == COMPACTION_START:
            if self._hold and self._committed:  # the parent kills us here, for sure inside the transaction
                self.ack(INSIDE)
                time.sleep(60)
            time.sleep(self._rng.uniform(0, self._pause))  # inside the transaction: a kill lands here


def writer_main(argv: Sequence[str]) -> int:
    spec, session_id, acks, seed, home = argv[0], argv[1], Path(argv[2]), int(argv[3]), argv[4]
    hold = len(argv) > 5 and argv[5] == "hold"
    from ..kernel import Kernel
    from ..messages import Message, ToolCallBlock
    from .kit import make_profile

    rng = random.Random(seed)
    store = AckingStore(open_store(spec), acks, rng, pause=0.03, hold=hold)
    profile = make_profile(model={"context_window": 3000, "reserved_output_tokens": 500})
    # the home is the parent's scratch folder: a killed writer cleans nothing up
    kernel = Kernel(profile, store=store, home=home, entry_points=False)
    if hold or seed % 2 == 0:
        # a summarizer model: the transaction writes its lock first and summarises under it (the
        # path a kill can land inside); without one, basic commits its summary in one batch
        from ..models import ScriptedModel
        from ..text import extractive_summary

        kernel.summarizer = ScriptedModel(
            lambda messages, system, tools: Message.assistant(extractive_summary(messages[:-1]))
        )
    session = kernel.open_session(session_id, create=not store.exists(session_id))
    store.ack(READY)
    n = 0
    while True:
        session.user(f"task {n}: " + "please " * rng.randint(1, 30))
        for _ in range(rng.randint(1, 4)):
            session.prepare_request()
            n += 1
            call = ToolCallBlock(f"c{os.getpid()}-{n}", "read", {"path": f"f{n}.py"})
            session.commit_reply(Message.assistant(f"reading {n}", [call]), usage=None)
            session.tool_result(call.id, "x = 1\n" * rng.randint(10, 150))
        session.prepare_request()
        session.commit_reply(Message.assistant(f"done {n}"))
        session.end_turn()


@dataclass
class Acks:
    batches: list[tuple[int, int, str]] = field(default_factory=list)

    def read(self, path: Path, marker: str = READY) -> bool:
        """Add the acknowledged batches in ``path``; True when the writer wrote ``marker``."""
        ready = False
        if not path.exists():
            return False
        for line in path.read_text().splitlines():
            if line in (READY, INSIDE):
                ready = ready or line == marker
            elif line:
                first, count, digest = line.split()
                self.batches.append((int(first), int(count), digest))
        return ready


@dataclass
class TrialReport:
    backend: str
    trials: int = 0
    acknowledged_batches: int = 0
    events: int = 0
    killed_inside_compaction: int = 0
    compactions_committed: int = 0
    compactions_interrupted: int = 0

    def line(self) -> str:
        return (
            f"crash trials [{self.backend}]: {self.trials} SIGKILLs, {self.acknowledged_batches} acknowledged "
            f"batches all present, {self.events} events, {self.compactions_committed} compactions committed, "
            f"{self.compactions_interrupted} failed or interrupted ({self.killed_inside_compaction} kills inside an open "
            "compaction transaction)"
        )


class CrashCheckError(AssertionError):
    """A crash trial found a lost acknowledged event or a half-committed compaction."""


def verify_session(store: EventStore, session_id: str, acks: Acks) -> dict[str, int]:
    """Check the invariants listed in the module doc on a reopened store (see :func:`run_trials`)."""
    from ..kernel import Kernel
    from .kit import make_profile

    events = list(store.read(session_id))
    for i, event in enumerate(events):
        if event.seq != i:
            raise CrashCheckError(f"seq {event.seq} at position {i}")
    for first, count, digest in acks.batches:
        got = events[first : first + count]
        if len(got) != count or batch_hash(got) != digest:
            raise CrashCheckError(f"acknowledged batch {first}..{first + count - 1} is lost or changed")
    inside = _open_compaction(events) is not None
    profile = make_profile(model={"context_window": 3000, "reserved_output_tokens": 500})
    with tempfile.TemporaryDirectory() as home:
        kernel = Kernel(profile, store=store, home=home, entry_points=False)
        try:
            session = kernel.open_session(session_id)  # repair + replay: raises on any defect
        except CtxKernelError as exc:
            raise CrashCheckError(f"the session does not reopen: {exc}") from exc
        if session.open_compaction is not None:
            raise CrashCheckError(f"compaction {session.open_compaction} is still open after reopening")
        stats = _check_compactions(session.events)
        surface = {n.seq for n in session.surface}
        for event in session.events:
            cid = event.data.get("compaction_id")
            if event.seq in surface and cid is not None and cid not in stats["committed_ids"]:
                raise CrashCheckError(f"surface node {event.seq} comes from uncommitted compaction {cid}")
        session.user("after the crash")  # the reopened session takes new work
        session.end_turn()
    return {"inside": int(inside), "committed": len(stats["committed_ids"]), "interrupted": stats["interrupted"]}


def _open_compaction(events: Sequence[Event]) -> str | None:
    open_id = None
    for event in events:
        if event.type == COMPACTION_START:
            open_id = event.data["compaction_id"]
        elif event.type == COMPACTION_END and event.data["compaction_id"] == open_id:
            open_id = None
    return open_id


def _check_compactions(events: Sequence[Event]) -> dict[str, Any]:
    by_id: dict[str, list[Event]] = {}
    for event in events:
        cid = event.data.get("compaction_id")
        if isinstance(cid, str):
            by_id.setdefault(cid, []).append(event)
    committed: set[str] = set()
    interrupted = 0
    for cid, group in by_id.items():
        types = [e.type for e in group]
        if types[0] != COMPACTION_START:
            raise CrashCheckError(f"compaction {cid} has events before its start: {types}")
        ends = [e for e in group if e.type == COMPACTION_END]
        if len(ends) != 1:
            raise CrashCheckError(f"compaction {cid} has {len(ends)} ends: {types}")
        if COMPACTION_SUMMARY in types:
            tail = group[1:]
            seqs = [e.seq for e in tail]
            if seqs != list(range(seqs[0], seqs[0] + len(seqs))) or tail[0].type != COMPACTION_SUMMARY:
                raise CrashCheckError(f"compaction {cid} did not commit as one contiguous batch: {types}")
            if any(e.type not in (USER_MESSAGE, SURFACE_DROP) for e in tail[1:-1]) or "error" in ends[0].data:
                raise CrashCheckError(f"compaction {cid} committed with a failure: {types}")
            committed.add(cid)
        else:
            if any(e.type in (USER_MESSAGE, SURFACE_DROP) for e in group):
                raise CrashCheckError(f"compaction {cid} changed the surface without committing: {types}")
            if "error" not in ends[0].data:
                raise CrashCheckError(f"compaction {cid} ended cleanly without a summary: {types}")
            interrupted += 1
    return {"committed_ids": committed, "interrupted": interrupted}


def run_trials(
    spec: str, trials: int, *, seed: int = 0, max_delay: float = 0.4, session_id: str = "crash", hold_every: int = 4
) -> TrialReport:
    """SIGKILL ``trials`` writers on the store ``spec`` and verify after each one.

    Most kills come after a random delay; every ``hold_every``-th trial instead waits until the
    writer is inside a compaction transaction and kills it there, so that case is always covered.
    """
    rng = random.Random(seed)
    store = open_store(spec)
    report = TrialReport(backend=store.backend)
    acks = Acks()
    with tempfile.TemporaryDirectory() as scratch:
        for trial in range(trials):
            ack_path = Path(scratch) / f"acks-{trial}"
            hold = hold_every > 0 and trial % hold_every == hold_every - 1
            err_path = Path(scratch) / f"stderr-{trial}"
            with open(err_path, "wb") as err_file:  # a file, not a pipe: a full pipe would stall the writer
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "ctxkernel.testing.crash",
                        spec,
                        session_id,
                        str(ack_path),
                        str(rng.randrange(2**31)),
                        scratch,
                        "hold" if hold else "random",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=err_file,
                )
            deadline = time.monotonic() + 60
            while not Acks().read(ack_path):
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    err = err_path.read_text(errors="replace")
                    raise CrashCheckError(
                        f"trial {trial}: the writer did not start (exit {proc.returncode}):\n{err[-3000:]}"
                    )
                time.sleep(0.005)
            if hold:
                while not Acks().read(ack_path, INSIDE):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        proc.kill()
                        proc.wait()
                        err = err_path.read_text(errors="replace")
                        raise CrashCheckError(f"trial {trial}: the writer never opened a compaction:\n{err[-3000:]}")
                    time.sleep(0.005)
            else:
                time.sleep(rng.uniform(0, max_delay))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if proc.returncode != -signal.SIGKILL:
                err = err_path.read_text(errors="replace")
                raise CrashCheckError(f"trial {trial}: the writer exited by itself ({proc.returncode}):\n{err[-3000:]}")
            acks.read(ack_path)
            stats = verify_session(store, session_id, acks)
            report.trials += 1
            report.killed_inside_compaction += stats["inside"]
            report.compactions_committed = stats["committed"]
            report.compactions_interrupted = stats["interrupted"]
    report.acknowledged_batches = len(acks.batches)
    report.events = store.next_seq(session_id)
    store.close()
    return report


if __name__ == "__main__":
    sys.exit(writer_main(sys.argv[1:]))
