"""Kernel benchmarks: cold replay, per-step cost against history length, incremental pressure.

1. ``cold_replay_<N>``: ``Kernel.open_session(id)`` on a fresh store object (nothing cached) of a
   session of N events with snapshots off (the full replay), against the floor of reading the
   same file and ``orjson``-parsing every line. Target: within 3× of the floor.
2. ``step_cost_100k_vs_1k``: one model step (``prepare_request`` + ``commit_reply``) in a
   session of ~100,000 events against the same step in a session of ~1,000 events, the surfaces
   being of comparable size. Target: flat, within 2×.
3. ``pressure_incremental_vs_recount``: ``session.pressure()`` after one new message on a
   ~100,000-token surface, against recounting the whole surface and header with tiktoken.
   Target: at least 50× faster.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import orjson
from _bench import Bench, per_call
from _workload import build_session, kernel_for, text, usage_for

from ctxkernel import Message
from ctxkernel.meter import message_text_for_count
from ctxkernel.store.jsonl import JsonlStore


def run(bench: Bench) -> None:
    sizes = (2_000, 10_000) if bench.quick else (10_000, 100_000)
    sessions: dict[int, tuple[Path, str, int]] = {}
    for size in sizes:
        home = Path(tempfile.mkdtemp(prefix=f"cold{size}-", dir=bench.scratch))
        kernel, session_id, _ = build_session(home, size)
        sessions[size] = (home, session_id, len(kernel.open_session(session_id).events))
    for size in sizes:
        cold_replay(bench, size, *sessions[size])
    step_cost(bench, sessions)
    incremental_pressure(bench)


def cold_replay(bench: Bench, size: int, home: Path, session_id: str, events: int) -> None:
    # snapshots off: this row is the full replay (bench_snapshot.py measures opening from one);
    # the profile and plugins load once per process, not per session
    kernel = kernel_for(home, snapshot_every=0)
    path = kernel.store.path(session_id)

    def floor() -> Any:
        return [orjson.loads(line) for line in path.read_bytes().splitlines()]

    def replay() -> Any:
        # a new store object each time: no index, no parsed events, nothing cached
        kernel.store = JsonlStore(home, fsync=False)
        return kernel.open_session(session_id, repair=True)

    label = f"{size // 1000}k"
    bench.compare(
        f"cold_replay_{label}",
        replay,
        floor,
        target=("<=", 3),
        repeat=3 if bench.quick else 5,
        events=events,
        bytes=path.stat().st_size,
    )


def step_cost(bench: Bench, sessions: dict[int, tuple[Path, str, int]]) -> None:
    """The long session is the largest generated one; the short one is built fresh (~1k)."""
    small_home = Path(tempfile.mkdtemp(prefix="step1k-", dir=bench.scratch))
    small_kernel, small_id, _ = build_session(small_home, 1_000)
    big_home, big_id, big_events = sessions[max(sessions)]
    small = small_kernel.open_session(small_id)
    big = kernel_for(big_home).open_session(big_id)
    counter = itertools.count()

    def step(session: Any) -> None:
        n = next(counter)
        session.user(f"quick question {n}: " + text(15, n))
        request = session.prepare_request()
        reply = Message.assistant(text(25, n))
        session.commit_reply(reply, usage=usage_for(session, request, reply))
        session.end_turn()

    number = 20 if bench.quick else 50
    bench.compare(
        "step_cost_100k_vs_1k" if not bench.quick else "step_cost_long_vs_1k",
        per_call(lambda: step(big), number),
        per_call(lambda: step(small), number),
        target=("<=", 2),
        repeat=5 if bench.quick else 9,
        unit=f"s per {number} steps",
        events_long=big_events,
        events_short=len(small.events),
        surface_long=len(big.surface),
        surface_short=len(small.surface),
    )


def incremental_pressure(bench: Bench) -> None:
    """A ~100k-token surface (no automatic compaction), then one message at a time."""
    home = Path(tempfile.mkdtemp(prefix="pressure-", dir=bench.scratch))
    kernel = kernel_for(home, context_window=400_000, auto=False)
    session = kernel.open_session()
    goal = 20_000 if bench.quick else 100_000
    n = 0
    session.user("start")
    while session.meter.surface_tokens() < goal:
        session.add_message(Message.user(text(120, n)))
        n += 1
    tokenizer = session.meter.tokenizer
    counter = itertools.count(n)

    def add_one() -> None:
        session.add_message(Message.user(text(120, next(counter))))

    def incremental() -> int:
        return session.pressure().tokens

    def recount() -> int:
        system, tools, _, _ = session._tooling.compose()
        total = tokenizer.count(system) + tokenizer.count(orjson.dumps(tools).decode())
        for node in session.surface:
            total += tokenizer.count(message_text_for_count(node.message))
        return total

    bench.compare(
        "pressure_incremental_vs_recount",
        incremental,
        recount,
        target=(">=", 50),
        invert=True,
        repeat=9 if bench.quick else 15,
        setup=add_one,  # each round: one new message, so the incremental path has work to do
        surface_tokens=session.meter.surface_tokens(),
        surface_nodes=len(session.surface),
    )
