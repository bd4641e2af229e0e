"""Fleet proof: several stateless worker processes serve many sessions on one shared store while
one of them is SIGKILLed again and again.

Each worker (``python -m ctxkernel.testing.fleet SPEC HOME HOST ACKS``) has its own kernel home and
host id, standing in for a host, and nothing else of its own: it reads one command per line (a
session to serve one turn of, or a session to report on) and answers one JSON line. The parent
(:func:`run_fleet`) creates the sessions, one per strategy profile in turn (``basic``, ``decay``,
``handoff``, ``rollover``, ``chapters``, each with a small window so that they compact, switch
windows and continue into child sessions within a few turns), and hands each session's next turn
to whichever worker is free next, so a session hops between workers. A turn is driven through the
Session API exactly as a harness would: the user message, steps whose replies come from a
:class:`~ctxkernel.models.ScriptedModel` (a tool call and its result, then a final answer), the
strategies' own context-management tool calls (``steward_actions``) run through
``session.run_tool``, and a ``continue_in`` outcome followed into the child session.

One worker, the victim, is SIGKILLed repeatedly, at random moments and (every other kill) inside
a compaction transaction: right after it wrote a ``compaction/start``, while it holds the
compaction lease, or, for a transaction that writes its lock with its commit (``single_batch``,
which takes no lease while no compaction is open), just before that commit; it is restarted
with the same home and host id. Its unfinished turn is handed to another worker, which must wait
for the dead transaction's lease to expire (and take over its open compaction, if any). Every worker records each batch the store
acknowledged (first seq, count, hash) in its acks file.

Afterwards (:func:`verify_fleet`): every acknowledged batch is in the store byte for byte; every
log's seqs run without gap or duplicate; every compaction has one start and one end, and commits
at most once as one contiguous batch (none applied twice); no surface has a tool call split from
its result; and every worker, the restarted victim included, reopens every session to the same
surface (hash of its messages) as the parent does, and reads the same strategy files (every file
a strategy hands over for export, by sha256, and every chapter through the ``chapters_read`` tool):
nothing a session needs lives in a worker's kernel home.
"""

from __future__ import annotations

import hashlib
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import CompactionBusyError, CtxKernelError
from ..events import COMPACTION_END, COMPACTION_START, COMPACTION_SUMMARY, Event
from ..store.base import EventStore
from ..store.cli import open_store
from .crash import Acks, CrashCheckError, _check_compactions, batch_hash

STRATEGIES = ("basic", "decay", "handoff", "rollover", "chapters")
#: the window every fleet profile runs with: small, so strategies act within a few turns
WINDOW = 3000
#: handoff's request header (its prompt, notes and history tools) takes over a third of that
WINDOWS = {"handoff": 4000}
INSIDE = "inside"

_PROFILE = """\
[profile]
description = "fleet proof: {strategy} in a small window"
strategies = {strategies}
{extra}
[model]
provider = "openai"
name = "gpt-4o"
context_window = {window}
reserved_output_tokens = 400

[store]
lease_seconds = {lease}

# a window this small leaves no room for the default fifth of it for the user's instructions
# next to a handoff or a table of contents: keep a twentieth
[instructions]
budget_ratio = 0.05
{tables}"""

#: per-strategy tables: a continuation lists the parent's turn in progress as a chapter too, and
#: at a 3,000-token window the default quarter for the table of contents leaves no room for it
TABLES = {"chapters": "\n[strategies.chapters]\ncontinuation_budget_ratio = 0.4\n"}


def write_profiles(folder: Path, lease_seconds: float) -> dict[str, Path]:
    """One profile file per strategy (its name is the strategy's); the sessions name them."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for strategy in STRATEGIES:
        strategies = [strategy, "basic"] if strategy == "handoff" else [strategy]
        extra = 'capability_order = ["handoff", "basic"]\n' if strategy == "handoff" else ""
        path = folder / f"{strategy}.toml"
        path.write_text(
            _PROFILE.format(
                strategy=strategy,
                strategies=orjson.dumps(strategies).decode(),
                extra=extra,
                window=WINDOWS.get(strategy, WINDOW),
                lease=lease_seconds,
                tables=TABLES.get(strategy, ""),
            )
        )
        paths[strategy] = path
    return paths


# -- the worker ------------------------------------------------------------------------------------
class _AckingStore:
    """The worker's store: records every acknowledged batch, and tells the parent (then dawdles a
    moment) when it has just opened a compaction transaction, so a kill can land inside one."""

    def __init__(self, inner: EventStore, acks: Path, out: Any, dawdle: float) -> None:
        self._inner = inner
        self.backend = inner.backend
        self._fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._out = out
        self._dawdle = dawdle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def append(self, session_id: str, events: Sequence[Event], expected_seq: int) -> None:
        if len(events) > 1 and events[0].type == COMPACTION_START:
            # a single batch (lock and commit in one write) holds no lease while no compaction is
            # open: the moment before its commit is the one a kill can land inside it
            self._inside(session_id, "commit")
        self._inner.append(session_id, events, expected_seq)
        # one write() per line: a kill cannot leave half a line behind
        os.write(self._fd, f"{session_id} {events[0].seq} {len(events)} {batch_hash(events)}\n".encode())
        if events[-1].type == COMPACTION_START:
            self._inside(session_id, "lock")

    def lease_acquire(self, name: str, holder: dict[str, Any], seconds: float, **kwargs: Any) -> Any:
        lease = self._inner.lease_acquire(name, holder, seconds, **kwargs)
        if name.startswith("compaction/"):
            # a transaction that writes its lock before its commit holds its lease from here on
            self._inside(name.removeprefix("compaction/"), "lease")
        return lease

    def _inside(self, session_id: str, phase: str) -> None:
        if self._dawdle:
            self._out.write(orjson.dumps({INSIDE: session_id, "phase": phase}).decode() + "\n")
            self._out.flush()
            time.sleep(self._dawdle)


#: file reads every turn makes before the scripted model may stop: with this floor every session
#: reaches its strategy's threshold within three turns (at most two reads a turn left some basic and
#: chapters sessions of the quick tier below it, and one run in a few without their compactions)
READS_PER_TURN = 3


def _reply_script(turn_seed: str) -> Any:
    """The scripted model of one turn: a file read on each step but the last, then an answer."""

    replies = iter(range(1_000_000))

    def script(messages: list[Any], system: str, tools: list[dict[str, Any]]) -> Any:
        from ..messages import Message, ToolCallBlock

        step = next(replies)
        digest = hashlib.sha256(f"{turn_seed}/{step}".encode()).hexdigest()
        if step < READS_PER_TURN or int(digest[:2], 16) < 170:  # then two thirds of the steps read a file
            call = ToolCallBlock(f"call_{digest[:12]}", "read", {"path": f"src/{digest[2:8]}.py"})
            return Message.assistant(f"Reading src/{digest[2:8]}.py.", [call])
        return Message.assistant(f"Done with this step ({digest[:8]}).")

    return script


def _serve_turn(kernels: dict[str, Any], store: Any, session_id: str, turn: int) -> dict[str, Any]:
    from ..messages import Message, Source, ToolCallBlock
    from ..models import ScriptedModel

    profile = store.header(session_id).profile
    kernel = kernels[profile]
    session = kernel.open_session(session_id)  # repair: a dead worker's open turn is closed here
    # a turn served again after its worker died makes new call ids, as a real model would
    nonce = os.urandom(6).hex()
    model = ScriptedModel(_reply_script(f"{session_id}/{turn}/{nonce}"))
    touched = [session.id]
    session.user(f"Turn {turn}: continue the refactoring; keep the tests green. " + "Details. " * 20)
    for step in range(8):
        request = session.prepare_request()
        actions = [a for a in kernel.hooks.steward_actions(session, request) or [] if a.get("name")]
        if actions:
            blocks = [
                ToolCallBlock(f"steward_{nonce}_{step}_{i}", str(a["name"]), dict(a.get("arguments") or {}))
                for i, a in enumerate(actions)
            ]
            session.commit_reply(Message("assistant", tuple(blocks), Source(kind="model")))
            child = None
            for block in blocks:
                outcome = session.run_tool(block)
                session.tool_result(block.id, outcome)
                child = getattr(outcome, "continue_in", None) or child
            if child:  # the strategy continues the work in a child session
                session.end_turn()
                session = kernel.open_session(child)
                touched.append(session.id)
                if not session.turn_open:
                    session.user(Message.user("(continuing in a new session)", Source.plugin_form("fleet", "notice")))
            request = session.prepare_request()
        reply = model.complete(request.messages, system=request.system, tools=request.tools)
        session.commit_reply(reply.message, usage=reply.usage)
        if not reply.message.tool_calls:
            break
        for call in reply.message.tool_calls:
            body = f"# {call.arguments.get('path')}\n" + "def handler(x):\n    return x + 1\n" * 25
            session.tool_result(call.id, body)
    else:
        session.prepare_request()
        session.commit_reply(Message.assistant("Stopping here for this turn."))
    session.end_turn()
    return {"session": session.id, "touched": touched, "events": session.next_seq}


def surface_digest(session: Any) -> str:
    digest = hashlib.sha256()
    for node in session.surface:
        digest.update(orjson.dumps([node.seq, node.message.to_dict()], option=orjson.OPT_SORT_KEYS) + b"\n")
    return digest.hexdigest()


def strategy_files(session: Any) -> dict[str, Any]:
    """What a worker reads of a session's strategy files through the public read paths: every
    file each strategy hands over for export (chapters, artifacts, handoff files, decay's audit),
    by sha256, and every chapter of the lineage read with the ``chapters_read`` tool."""
    from ..messages import ToolCallBlock

    files = {
        f"{strategy}/{path}": hashlib.sha256(data).hexdigest()
        for strategy, found in session.kernel.hooks.export_files(session).items()
        for path, data in found.items()
    }
    reads = {}
    panel = session.kernel.hooks.project(session).get("chapters") or {}
    for row in panel.get("toc", []):
        call = ToolCallBlock(f"fleet_read_{row['id']}", "chapters_read", {"chapter": row["id"]})
        # a read: nothing is appended to the log. Through every tool the session may offer: a
        # parent that wrote chapters for a continuation still shows what they hold, and is
        # offered no read tool for them
        outcome = session.offerable_tools.run(session, call)
        reads[row["id"]] = (
            "error: " + outcome.content if outcome.is_error else hashlib.sha256(outcome.content.encode()).hexdigest()
        )
    return {"files": files, "chapter_reads": reads}


def worker_main(argv: Sequence[str]) -> int:
    spec, home, host, acks, profiles_dir = argv[0], Path(argv[1]), argv[2], Path(argv[3]), Path(argv[4])
    dawdle = float(argv[5]) if len(argv) > 5 else 0.0
    from ..kernel import Kernel
    from ..profile import load_profile

    out = os.fdopen(os.dup(1), "w")  # answers on the real stdout; logs go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    store = _AckingStore(open_store(spec), acks, out, dawdle)
    kernels = {}
    for strategy in STRATEGIES:
        profile = load_profile(profiles_dir / f"{strategy}.toml")
        profile.store.host_id = host
        kernels[strategy] = Kernel(profile, store=store, home=home / strategy)
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        cmd = orjson.loads(line)
        try:
            if cmd["op"] == "turn":  # one turn of a session, whichever worker served it before
                answer = {"ok": True, **_serve_turn(kernels, store, cmd["session"], cmd["turn"])}
            else:  # "view": reopen a session and describe what every worker must agree on
                session = kernels[store.header(cmd["session"]).profile].open_session(cmd["session"])
                answer = {"ok": True, "surface": surface_digest(session), "events": session.next_seq}
                answer.update(strategy_files(session))
        except CompactionBusyError as exc:  # a dead worker's lease has not expired yet: retried later
            answer = {"ok": False, "busy": True, "error": str(exc)}
        except CtxKernelError as exc:
            answer = {"ok": False, "busy": False, "error": f"{type(exc).__name__}: {exc}"}
        out.write(orjson.dumps(answer).decode() + "\n")
        out.flush()
    return 0


# -- the parent ------------------------------------------------------------------------------------
@dataclass
class FleetReport:
    backend: str
    workers: int = 0
    sessions: int = 0
    turns: int = 0
    events: int = 0
    acknowledged_batches: int = 0
    kills: int = 0
    kills_inside_compaction: int = 0
    kills_after_lock: int = 0  # of those, after its lock event (the rest: lease held, or single batch not yet written)
    takeovers: int = 0
    takeovers_after_expiry: int = 0  # by another host; the others found the holder's process gone
    busy_retries: int = 0
    compactions: dict[str, int] = field(default_factory=dict)
    continuations: int = 0
    strategy_files: int = 0  # files the strategies hand over for export, per session, read on every worker
    chapter_reads: int = 0  # chapters read with chapters_read on every worker
    seconds: float = 0.0

    def line(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.compactions.items()))
        return (
            f"fleet [{self.backend}]: {self.workers} workers, {self.sessions} sessions ({self.continuations} "
            f"continued into children), {self.turns} turns, {self.events} events ({self.acknowledged_batches} "
            f"acknowledged batches all present), {self.kills} SIGKILLs "
            f"({self.kills_inside_compaction} inside a compaction transaction, {self.kills_after_lock} after its "
            f"lock event), {self.takeovers} lease takeovers "
            f"({self.takeovers_after_expiry} by another host after expiry), "
            f"{self.busy_retries} turns retried while a lease was live; compactions committed: {kinds}; "
            f"{self.strategy_files} strategy files and {self.chapter_reads} chapter reads identical on every worker; "
            f"{self.seconds:.1f} s"
        )


class _Worker:
    def __init__(self, index: int, spec: str, scratch: Path, profiles: Path, dawdle: float) -> None:
        self.index = index
        self.host = f"host-{index}"
        self.args = [
            spec,
            str(scratch / self.host),
            self.host,
            str(scratch / f"acks-{index}"),
            str(profiles),
            str(dawdle),
        ]
        self.job: dict[str, Any] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ctxkernel.testing.fleet", *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.job = None
        self.ready = False  # workers start side by side; the first send waits for this one's

    def send(self, job: dict[str, Any]) -> None:
        if not self.ready:
            line = self.proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise CrashCheckError(f"fleet worker {self.host} exited with {self.proc.wait()} before it was ready")
            self.ready = True
        self.job = job
        self.proc.stdin.write(orjson.dumps(job).decode() + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def recv(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise CrashCheckError(f"fleet worker {self.host} exited with {self.proc.wait()}")
        return dict(orjson.loads(line))

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.stdout.close()  # type: ignore[union-attr]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(60)


def run_fleet(
    spec: str,
    *,
    workers: int = 3,
    sessions: int = 20,
    turns: int = 4,
    kills: int = 6,
    seed: int = 0,
    lease_seconds: float = 1.0,
) -> FleetReport:
    """Run the fleet on the store ``spec`` and verify it (raises :class:`CrashCheckError`)."""
    rng = random.Random(seed)
    started = time.monotonic()
    store = open_store(spec)
    report = FleetReport(backend=store.backend, workers=workers)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        profiles = scratch / "profiles"
        write_profiles(profiles, lease_seconds)
        from ..kernel import Kernel
        from ..profile import load_profile

        parent = {
            s: Kernel(load_profile(profiles / f"{s}.toml"), store=store, home=scratch / "parent") for s in STRATEGIES
        }
        current = {}  # conversation -> the session its next turn goes to (a continuation moves it)
        for i in range(sessions):
            strategy = STRATEGIES[i % len(STRATEGIES)]
            current[i] = parent[strategy].open_session(f"fleet-{seed}-{i:03d}", create=True).id
        pending = [(i, t) for t in range(turns) for i in range(sessions)]  # round after round
        pending.sort(key=lambda job: (job[1], rng.random()))
        busy: set[int] = set()  # conversations with a turn in flight
        pool = [_Worker(i, spec, scratch, profiles, dawdle=0.15 if i == 0 else 0.0) for i in range(workers)]
        victim = pool[0]
        kill_at = sorted(rng.uniform(0.05, 0.7) for _ in range(kills))  # as fractions of the turns
        total = len(pending)
        done = 0
        try:
            while pending or any(w.job for w in pool):
                # hand out work, the next turn of a conversation not in flight, to the free workers in
                # random order: a session a dead worker left goes to another host as often as not
                for worker in rng.sample(pool, len(pool)):
                    if worker.job is None:
                        free = next((j for j in pending if j[0] not in busy), None)
                        if free is not None:
                            pending.remove(free)
                            busy.add(free[0])
                            worker.send({"op": "turn", "session": current[free[0]], "turn": free[1], "job": list(free)})
                streams: dict[Any, _Worker] = {w.proc.stdout: w for w in pool if w.job is not None}
                ready, _, _ = select.select(list(streams), [], [], 5.0)
                for stream in ready:
                    worker = streams[stream]
                    answer = worker.recv()
                    if INSIDE in answer:  # a worker holds a compaction lease, has just written its lock,
                        # or is about to write a single batch. A kill after the lock event leaves an open
                        # compaction another host takes over; one holding only the lease leaves a lease to
                        # expire; one before a single batch's commit leaves nothing
                        due = worker is victim and kill_at and done >= kill_at[0] * total and report.kills % 2 == 0
                        if due and (answer["phase"] == "lock" or done >= (kill_at[0] + 0.1) * total):
                            report.kills_inside_compaction += 1
                            report.kills_after_lock += answer["phase"] == "lock"
                            _kill(victim, report, kill_at, pending, busy)
                        continue
                    job = worker.job
                    assert job is not None
                    worker.job = None
                    conversation, turn = job["job"]
                    busy.discard(conversation)
                    if answer["ok"]:
                        done += 1
                        current[conversation] = answer["session"]
                    elif answer["busy"]:
                        report.busy_retries += 1
                        pending.insert(0, (conversation, turn))
                    else:
                        raise CrashCheckError(f"worker {worker.host}, session {job['session']}: {answer['error']}")
                # every other kill lands at a random moment of the victim's turn; so does one whose
                # wait for the victim to open a compaction ran a fifth of the run too long
                if kill_at and victim.job is not None:
                    late = done >= (kill_at[0] + 0.2) * total
                    if done >= kill_at[0] * total and (report.kills % 2 == 1 or late):
                        time.sleep(rng.uniform(0, 0.2))
                        _kill(victim, report, kill_at, pending, busy)
            time.sleep(lease_seconds * 1.5)  # a lease the last kill left behind expires
            report.turns = done
            verify_fleet(store, pool, scratch, report)
        finally:
            for worker in pool:
                if worker.proc.poll() is None:
                    worker.close()
    report.seconds = time.monotonic() - started
    return report


def _kill(victim: _Worker, report: FleetReport, kill_at: list[float], pending: list[Any], busy: set[int]) -> None:
    """SIGKILL the victim, give its unfinished turn back to the queue, and restart it (same home and
    host id: the host came back)."""
    job = victim.job
    victim.kill()
    report.kills += 1
    kill_at.pop(0)
    if job is not None:
        conversation, turn = job["job"]
        busy.discard(conversation)
        pending.insert(0, (conversation, turn))
    victim.start()


def verify_fleet(store: EventStore, pool: list[_Worker], scratch: Path, report: FleetReport) -> None:
    """The checks listed in the module doc; fills the report's figures."""
    from ..kernel import Kernel
    from ..pairing import pairing_problems
    from ..profile import load_profile

    acks: dict[str, Acks] = {}
    for worker in pool:
        path = Path(worker.args[3])
        if path.exists():
            for line in path.read_text().splitlines():
                owner, start, size, sha = line.split()
                acks.setdefault(owner, Acks()).batches.append((int(start), int(size), sha))
    checker = {
        s: Kernel(load_profile(scratch / "profiles" / f"{s}.toml"), store=store, home=scratch / "checker")
        for s in STRATEGIES
    }
    ids = store.list_sessions()
    report.sessions = len(ids)
    for session_id in ids:
        header = store.header(session_id)
        # a continuation's header names no parent (the strategy's registry owns ancestry): the
        # fleet created sessions named fleet-<seed>-<n>, the strategies the rest
        report.continuations += not session_id.startswith("fleet-")
        session = checker[header.profile or "basic"].open_session(session_id)  # repair closes what the dead left
        events = list(store.read(session_id))
        if [e.seq for e in events] != list(range(len(events))):
            raise CrashCheckError(f"session {session_id}: seqs have a gap or a duplicate")
        for first, count, digest in acks.get(session_id, Acks()).batches:
            if batch_hash(events[first : first + count]) != digest:
                raise CrashCheckError(f"session {session_id}: acknowledged batch {first}+{count} is lost or changed")
            report.acknowledged_batches += 1
        stats = _check_compactions(events)  # one start, one end; a commit is one contiguous batch
        summaries = [e.data["compaction_id"] for e in events if e.type == COMPACTION_SUMMARY]
        if len(summaries) != len(set(summaries)):
            raise CrashCheckError(f"session {session_id}: a compaction was applied twice")
        for event in events:
            if event.type == COMPACTION_SUMMARY:
                key = f"{event.data.get('strategy')}/{event.data.get('kind')}"
                report.compactions[key] = report.compactions.get(key, 0) + 1
            if event.type == COMPACTION_END and "takeover" in event.data:
                report.takeovers += 1
                report.takeovers_after_expiry += event.data["takeover"]["reason"] == "its holder's lease expired"
        if len(stats["committed_ids"]) != len(summaries):
            raise CrashCheckError(f"session {session_id}: committed compactions do not match their summaries")
        if problems := pairing_problems([n.message for n in session.surface]):
            raise CrashCheckError(f"session {session_id}: a tool call is split from its result: {problems[0]}")
        report.events += len(events)
        expected = surface_digest(session)
        readable = strategy_files(session)
        report.strategy_files += len(readable["files"])
        report.chapter_reads += len(readable["chapter_reads"])
        for chapter, read in readable["chapter_reads"].items():
            if read.startswith("error: "):
                raise CrashCheckError(f"session {session_id}: chapter {chapter} is not readable: {read}")
        for worker in pool:  # side by side
            worker.send({"op": "view", "session": session_id})
        for worker in pool:
            answer = worker.recv()
            worker.job = None
            if not answer["ok"] or answer["surface"] != expected:
                raise CrashCheckError(f"session {session_id}: worker {worker.host} sees another surface: {answer}")
            if answer["files"] != readable["files"] or answer["chapter_reads"] != readable["chapter_reads"]:
                raise CrashCheckError(
                    f"session {session_id}: worker {worker.host} reads other strategy files: {answer} vs {readable}"
                )


def main(argv: Sequence[str]) -> int:
    return worker_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
