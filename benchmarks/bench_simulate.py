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
"""

from __future__ import annotations

import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import Bench
from _profiles import PROFILES, REPO

from ctxkernel import Kernel
from ctxkernel.simulate import Options, build_workload, load_recording
from ctxkernel.simulate.replay import Replay, prepare_profile
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
    for path in sorted(p for p in TRANSCRIPTS.glob("*/*") if p.is_file()):
        try:
            recording = load_recording(path)
        except Exception as exc:  # noqa: BLE001 - one unreadable file is reported, the rest still run
            print(
                json.dumps(
                    {"name": f"simulate_transcript_{path.parent.name}", "skipped": f"cannot load: {type(exc).__name__}"}
                ),
                flush=True,
            )
            continue
        # named by format only: transcript file names stay out of the record
        found.append((f"transcript_{path.parent.name}".replace("-", "_"), recording))
    return found


def run(bench: Bench) -> None:
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
