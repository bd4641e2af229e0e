"""Simulation throughput: events per second of ``ctxkernel simulate`` for each shipped profile.

    python benchmarks/run.py -k simulate

Each profile replays the long synthetic workload (``coding-long``, the one ``make demo`` shows)
with the default steward, as ``ctxkernel simulate --workload coding-long --profile <name>`` does;
then each recording found under ``../shared/transcripts/`` (skipped, with a line saying so, when
the folder is absent). Events are those written to every session of the replay (a strategy that
continues in a child session counts both). CPU time per replay, rounds alternating the profiles.

``simulate_<source>_<profile>``: ``ratio`` = the profile's events/s over the unmanaged baseline's
(``none``: the kernel with no strategy) on the same recording, in the same round: the share of
the kernel's speed a strategy keeps. Target >= 0.25 (ours: the issue names no number; a strategy
may cost up to 4x the bare kernel per event). ``median`` is events/s.

``simulate_corpus_jobs2_vs_jobs1``: corpus mode (``--transcripts``) on 100 seeded
coding sessions (OpenAI chat files written from ``coding-long`` with two turns of twelve steps),
each through ``none`` and ``basic``: ``ratio`` = the wall time with ``--jobs 2`` over ``--jobs 1``
(wall time, not CPU time: the work moves to worker processes). Target <= 0.8 (ours: two workers
on two cores would ideally halve it; process start-up and a shared machine take some of that).
``median`` is the ``--jobs 2`` wall seconds; ``--quick`` replays 20 sessions.
"""

from __future__ import annotations

import gc
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _bench import Bench
from _profiles import PROFILES, REPO

from ctxkernel import Kernel
from ctxkernel.convert import to_openai_message
from ctxkernel.simulate import AssistantItem, Options, ToolResultItem, UserItem, build_workload, load_recording
from ctxkernel.simulate.corpus import find_files, plan, run_corpus
from ctxkernel.simulate.replay import Replay, prepare_profile
from ctxkernel.simulate.workloads import coding_long
from ctxkernel.store.jsonl import JsonlStore

TRANSCRIPTS = REPO.parent / "shared" / "transcripts"


def replay_rate(name: str, recording: Any, scratch: Path) -> float:
    """Events per CPU second of one replay of ``recording`` through profile ``name``."""
    options = Options()
    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        home = Path(folder)
        profile = prepare_profile(name, recording, options, home)
        kernel = Kernel(profile, store=JsonlStore(home, fsync=False), home=home)
        replay = Replay(kernel, recording, options, label=name)
        gc.collect()
        start = time.process_time()
        replay.run()
        seconds = time.process_time() - start
        events = sum(len(s.events) for s in replay.sessions)
    return events / seconds


def sources(bench: Bench) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = [("coding_long", build_workload("coding-long"))]
    if not TRANSCRIPTS.is_dir():
        print(json.dumps({"name": "simulate_transcripts", "skipped": "../shared/transcripts is absent"}), flush=True)
        return found
    paths = sorted(p for p in TRANSCRIPTS.glob("*/*") if p.is_file())
    per_format = Counter(path.parent.name for path in paths)
    seen: Counter[str] = Counter()
    for path in paths:
        seen[path.parent.name] += 1
        # named by format, and by its place in the folder when the format has several files:
        # transcript file names stay out of the record, and no two rows share a name
        ordinal = f"_{seen[path.parent.name]}" if per_format[path.parent.name] > 1 else ""
        try:
            recording = load_recording(path)
        except Exception as exc:  # one unreadable file is reported, the rest still run
            print(
                json.dumps(
                    {
                        "name": f"simulate_transcript_{path.parent.name}{ordinal}",
                        "skipped": f"cannot load: {type(exc).__name__}",
                    }
                ),
                flush=True,
            )
            continue
        found.append((f"transcript_{path.parent.name}{ordinal}".replace("-", "_"), recording))
    return found


def write_corpus(folder: Path, sessions: int) -> None:
    """``sessions`` seeded coding sessions as OpenAI chat files (what ``--transcripts`` reads)."""
    for seed in range(sessions):
        messages: list[dict[str, Any]] = []
        for item in coding_long(seed, turns=2, steps_per_turn=12).items:
            if isinstance(item, UserItem):
                messages.append({"role": "user", "content": item.text})
            elif isinstance(item, AssistantItem):
                messages.append(to_openai_message(item.message))
            elif isinstance(item, ToolResultItem):
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.content})
        (folder / f"session-{seed:03d}.json").write_text(json.dumps(messages))


def corpus_scaling(bench: Bench) -> None:
    sessions = 20 if bench.quick else 100
    rounds = 1 if bench.quick else 2
    with tempfile.TemporaryDirectory(dir=bench.scratch) as folder:
        write_corpus(Path(folder), sessions)
        tasks = plan(find_files(folder))
        walls: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(rounds):
            for jobs in (1, 2):
                start = time.perf_counter()
                results = run_corpus(tasks, ["none", "basic"], Options(), jobs=jobs)
                walls[jobs].append(time.perf_counter() - start)
                assert all(p["status"] == "ok" for s in results for p in s["profiles"])
    ratios = [two / one for one, two in zip(walls[1], walls[2], strict=True)]
    ratio = statistics.median(ratios)
    bench.report(
        "simulate_corpus_jobs2_vs_jobs1",  # a stable name: the size is in "sessions"
        ratio,
        ("<=", 0.8),
        "s",
        statistics.median(walls[2]),
        (max(ratios) - min(ratios)) / ratio,
        baseline_median=round(statistics.median(walls[1]), 3),
        sessions=sessions,
        repeat=rounds,
    )


def run(bench: Bench) -> None:
    corpus_scaling(bench)
    rounds = 2 if bench.quick else 3
    scratch = Path(bench.scratch)
    for label, recording in sources(bench):
        if bench.quick and label != "coding_long":
            continue
        names = ("none", *PROFILES)
        replay_rate("none", recording, scratch)  # warm imports and caches
        rates: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(rounds):
            for name in names:
                rates[name].append(replay_rate(name, recording, scratch))
        for name in PROFILES:
            ratios = [a / b for a, b in zip(rates[name], rates["none"], strict=True)]
            ratio = statistics.median(ratios)
            bench.report(
                f"simulate_{label}_{name}",
                ratio,
                (">=", 0.25),
                "events/s",
                statistics.median(rates[name]),
                (max(ratios) - min(ratios)) / ratio,
                baseline_median=round(statistics.median(rates["none"]), 1),
                requests=recording.requests,
                repeat=rounds,
            )


if __name__ == "__main__":
    import sys

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)))
