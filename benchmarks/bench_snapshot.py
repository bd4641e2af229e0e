"""Opening a session from its snapshot: the cost of the surface, not of the history (issue 21).

    python benchmarks/run.py -k snapshot

Sessions of the realistic mix (``_workload.py``, ``basic`` compacting) at 10,000, 100,000 and
300,000 events on the jsonl store, with the default ``[store] snapshot_every = 1000``. Each is
built to its size, then run on to the end of the turn that writes the next snapshot, then five
more turns: every size opens with a tail of ~55-65 events, so the sizes differ only in history.

1. ``cold_open_snapshot_100k``: ``Kernel.open_session(id)`` on a new store object (nothing
   cached: the snapshot is read and verified, the tail repaired and replayed) against the floor
   of reading the whole 100,000-event file and ``orjson``-parsing every line. Target <= 0.25.
2. ``cold_open_snapshot_flat_300k_vs_10k``: the same open at 300,000 events against 10,000.
   Target <= 1.5 (flat).
3. ``cold_open_snapshot_<profile>_100k`` for each plugin profile (``decay``, ``handoff``,
   ``rollover``, ``chapters``): the shipped profile's session of the realistic mix
   (``_profiles.py``: its strategies act, and their state is part of the snapshot), copied and
   run on to the turn that writes the next snapshot plus five turns, opened cold against the
   orjson floor of its log. Target <= 0.25.
4. ``cold_open_snapshot_flat_<profile>_100k_vs_10k``: the same open at 100,000 events against
   10,000, for every plugin profile. Target <= 1.5 (flat).

CPU time, alternating rounds (``_bench.py``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson
from _bench import Bench
from _profiles import built, open_kernel, turn
from _workload import build_session, kernel_for, one_turn

from ctxkernel.store.jsonl import JsonlStore

TAIL_TURNS = 5


def built_with_tail(bench: Bench, size: int) -> tuple[Path, str, int]:
    home = Path(tempfile.mkdtemp(prefix=f"snap{size}-", dir=bench.scratch))
    kernel, session_id, n = build_session(home, size)
    session = kernel.open_session(session_id)
    store = kernel.store
    before = store.snapshot_get(session_id)
    while store.snapshot_get(session_id) == before:  # run on until the turn that writes one
        one_turn(session, n)
        n += 1
    for _ in range(TAIL_TURNS):
        one_turn(session, n)
        n += 1
    return home, session_id, len(session.events)


#: the plugin profiles whose strategy state the snapshot carries
PLUGIN_PROFILES = ("decay", "handoff", "rollover", "chapters")


def profile_with_tail(bench: Bench, profile: str, size: int) -> tuple[Path, str, int]:
    """A copy of the shared ``_profiles`` session of ``profile`` at ``size``, run on to the end of
    the turn that writes the next snapshot, then five more turns (the same tail at every size)."""
    source = built(bench, profile)[size]
    home = Path(tempfile.mkdtemp(prefix=f"snap-{profile}{size}-", dir=bench.scratch))
    shutil.copytree(source.home, home, dirs_exist_ok=True)
    kernel = open_kernel(profile, home)
    session = kernel.open_session(source.session_id)
    store = kernel.store
    n = source.events  # any turn number past the build's: the mix only varies its text with it
    before = store.snapshot_get(source.session_id)
    while store.snapshot_get(source.session_id) == before:
        turn(session, n)
        n += 1
    for _ in range(TAIL_TURNS):
        turn(session, n)
        n += 1
    return home, source.session_id, len(session.events)


def profile_opener(profile: str, home: Path, session_id: str) -> Any:
    kernel = open_kernel(profile, home)

    def open_cold() -> Any:
        kernel.store = JsonlStore(home, fsync=False)  # nothing cached
        return kernel.open_session(session_id, repair=True)

    return open_cold


def run_profiles(bench: Bench, repeat: int) -> None:
    small, large = sorted(built(bench, PLUGIN_PROFILES[0]))[-2:]  # 10,000 and 100,000 (quick: 2,000 and 5,000)
    for profile in PLUGIN_PROFILES:
        sessions = {size: profile_with_tail(bench, profile, size) for size in (small, large)}
        home, session_id, events = sessions[large]
        path = JsonlStore(home).path(session_id)

        def floor(path: Path = path) -> Any:
            return [orjson.loads(line) for line in path.read_bytes().splitlines()]

        covers = JsonlStore(home).snapshot_get(session_id)
        bench.compare(
            f"cold_open_snapshot_{profile}_{large // 1000}k",
            profile_opener(profile, home, session_id),
            floor,
            target=("<=", 0.25),
            repeat=repeat,
            events=events,
            tail=events - (covers[0] if covers else 0),
            bytes=path.stat().st_size,
            snapshot_bytes=len(covers[1]) if covers else 0,
        )
        bench.compare(
            f"cold_open_snapshot_flat_{profile}_{large // 1000}k_vs_{small // 1000}k",
            profile_opener(profile, home, session_id),
            profile_opener(profile, *sessions[small][:2]),
            target=("<=", 1.5),
            repeat=repeat,
            events=events,
            baseline_events=sessions[small][2],
        )


def opener(home: Path, session_id: str) -> Any:
    kernel = kernel_for(home)

    def open_cold() -> Any:
        kernel.store = JsonlStore(home, fsync=False)  # nothing cached
        return kernel.open_session(session_id, repair=True)

    return open_cold


def run(bench: Bench) -> None:
    small, middle, large = (2_000, 10_000, 30_000) if bench.quick else (10_000, 100_000, 300_000)
    repeat = 3 if bench.quick else 7
    run_profiles(bench, repeat)
    sessions = {size: built_with_tail(bench, size) for size in (small, middle, large)}

    home, session_id, events = sessions[middle]
    path = JsonlStore(home).path(session_id)

    def floor() -> Any:
        return [orjson.loads(line) for line in path.read_bytes().splitlines()]

    covers = JsonlStore(home).snapshot_get(session_id)
    bench.compare(
        f"cold_open_snapshot_{middle // 1000}k",
        opener(home, session_id),
        floor,
        target=("<=", 0.25),
        repeat=repeat,
        events=events,
        tail=events - (covers[0] if covers else 0),
        bytes=path.stat().st_size,
    )
    bench.compare(
        f"cold_open_snapshot_flat_{large // 1000}k_vs_{small // 1000}k",
        opener(*sessions[large][:2]),
        opener(*sessions[small][:2]),
        target=("<=", 1.5),
        repeat=repeat,
        events=sessions[large][2],
        baseline_events=sessions[small][2],
    )
