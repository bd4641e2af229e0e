"""Rollover commit cost versus one durable append of the same bytes (target: within 2x).

    python benchmarks/bench_rollover.py [--repeat 15] [--nodes 200] [--notes 20]

A window switch is local event writes only, no model call (seed 002 §4: "microseconds/milliseconds
of local event writes"). This measures, side by side in one run on the same jsonl store with
fsync on, the wall time of a whole manual rollover (building the seed from the notes and the log,
the compaction transaction: lock event, validation, commit batch) against one durable append of
a single event carrying as many bytes as the rollover wrote. The transaction writes two durable
batches (the lock, then the commit), so 2x is the honest floor for the fsync share of it.
Prints one JSON line per measure: name, ratio, target, unit and the raw medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ctxkernel import EventSpec, Kernel, Message, ToolCallBlock
from ctxkernel.recall.notes import Notes
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

REPO = Path(__file__).resolve().parents[1]


def build(home: Path, nodes: int, notes: int):
    profile = make_profile(REPO / "profiles" / "rollover.toml", model={"context_window": 1_000_000, "reserved_output_tokens": 8_000})
    kernel = Kernel(profile, store=JsonlStore(home), home=home)
    session = kernel.open_session()
    session.user("benchmark the rollover")
    for i in range(nodes // 2):
        session.prepare_request()
        session.commit_reply(Message.assistant(f"step {i}", [ToolCallBlock(f"c{i}", "read_file", {"path": f"src/m{i}.py"})]))
        session.tool_result(f"c{i}", "def function():\n    return 42\n" * 20)
    notes_api = Notes.for_session(session)
    for i in range(notes):
        notes_api.write(f"notes/{i}", f"decision {i}: keep the API stable; next step {i}\n" * 5)
    session.end_turn()
    session.user("continue")
    return kernel, session


def one(nodes: int, notes: int) -> tuple[float, float, int]:
    from ctxkernel_rollover.switch import switch

    with tempfile.TemporaryDirectory() as scratch:
        kernel, session = build(Path(scratch), nodes, notes)
        size_before = session.store.path(session.id).stat().st_size
        t0 = time.perf_counter()
        switch(session, "manual")
        rollover = time.perf_counter() - t0
        written = session.store.path(session.id).stat().st_size - size_before
        other = kernel.open_session()
        payload = "x" * max(1, written - 120)  # the envelope of one event is about 120 bytes
        t0 = time.perf_counter()
        other.append([EventSpec("bench/blob", {"blob": payload}, ignorable=True)])
        append = time.perf_counter() - t0
        return rollover, append, written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--notes", type=int, default=20)
    args = parser.parse_args()
    one(20, 2)  # warm imports, tokenizer and caches
    runs = [one(args.nodes, args.notes) for _ in range(args.repeat)]
    rollover = statistics.median(r[0] for r in runs)
    append = statistics.median(r[1] for r in runs)
    ratio = statistics.median(r[0] / r[1] for r in runs)
    print(json.dumps({
        "name": "rollover_commit_vs_durable_append",
        "ratio": round(ratio, 3),
        "target": 2.0,
        "unit": "x",
        "ok": ratio <= 2.0,
        "rollover_ms": round(rollover * 1000, 3),
        "append_ms": round(append * 1000, 3),
        "bytes": int(statistics.median(r[2] for r in runs)),
        "surface_nodes": args.nodes,
        "notes": args.notes,
        "repeat": args.repeat,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
