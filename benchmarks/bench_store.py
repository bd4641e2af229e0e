"""Store performance, every backend side by side in one run (JSON lines: name, ratio, target, unit).

    bash scripts/test-services.sh .venv/bin/python benchmarks/bench_store.py   # with PostgreSQL
    .venv/bin/python benchmarks/bench_store.py --events 20000                   # quicker, no server

Measured on this machine, in this run:

* ``store_append_<backend>``: events per second appended one event per batch with durability on
  (jsonl fsyncs each batch, sqlite commits with ``synchronous=FULL`` in WAL mode, PostgreSQL commits
  with its default ``synchronous_commit=on``); ``ratio`` is that rate over the floor: raw
  ``write`` + ``fsync`` of the same bytes to one file (``store_append_floor``).
* ``store_append_batch100_<backend>``: the same with 100 events per batch (a compaction commit,
  an importer), ratio over the floor's events per second for the same batching.
* ``store_cold_read_<backend>``: seconds to read a 100,000-event session through a *new* store
  object (no cached index; the OS page cache is warm, as it is for a resumed session);
  ``ratio`` is the floor (read the jsonl file and ``orjson.loads`` each line, no validation)
  over the backend's time: 1.0 would be as fast as parsing the bytes.

``ratio`` is always "higher is better" and ``target`` is the least we accept; ``ok`` says whether
it was met. Absolute numbers depend on the disk; the ratios are what to compare across machines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from ctxkernel.events import Event
from ctxkernel.store.base import EventStore, SessionHeader
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.store.sqlite import SqliteStore

#: least accepted ratios (see the module doc); set from measurements with a wide margin
TARGETS = {
    "append": {"jsonl": 0.5, "sqlite": 0.2, "postgres": 0.1},
    "append_batch100": {"jsonl": 0.3, "sqlite": 0.1, "postgres": 0.05},
    "cold_read": {"jsonl": 0.15, "sqlite": 0.1, "postgres": 0.05},
}
PAYLOAD = "x" * 160  # about the size of a small kernel event


def make_event(seq: int) -> Event:
    return Event(seq, "bench/tick", {"n": seq, "text": PAYLOAD}, "2026-01-01T00:00:00.000Z", None, True)


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def floor_append(folder: Path, events: int, per_batch: int) -> float:
    """Events per second of raw write+fsync of the same lines, one fsync per batch."""
    lines = [orjson.dumps(make_event(i).to_dict()) + b"\n" for i in range(per_batch)]
    payload = b"".join(lines)
    path = folder / f"floor-{per_batch}.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    started = time.perf_counter()
    for _ in range(events // per_batch):
        os.write(fd, payload)
        os.fsync(fd)
    elapsed = time.perf_counter() - started
    os.close(fd)
    return (events // per_batch) * per_batch / elapsed


def store_append(store: EventStore, session_id: str, events: int, per_batch: int) -> float:
    store.create(SessionHeader(id=session_id, created="2026-01-01T00:00:00.000Z"))
    started = time.perf_counter()
    seq = 0
    while seq + per_batch <= events:
        store.append(session_id, [make_event(s) for s in range(seq, seq + per_batch)], seq)
        seq += per_batch
    return seq / (time.perf_counter() - started)


def fill(store: EventStore, session_id: str, events: int) -> None:
    store.create(SessionHeader(id=session_id, created="2026-01-01T00:00:00.000Z"))
    for start in range(0, events, 1000):
        store.append(session_id, [make_event(s) for s in range(start, min(start + 1000, events))], start)


def cold_read(open_store: Callable[[], EventStore], session_id: str, events: int) -> float:
    store = open_store()
    started = time.perf_counter()
    count = sum(1 for _ in store.read(session_id))
    elapsed = time.perf_counter() - started
    store.close()
    assert count == events, (count, events)
    return elapsed


def floor_read(path: Path) -> float:
    started = time.perf_counter()
    with open(path, "rb") as f:
        data = f.read()
    for line in data.splitlines()[1:]:
        orjson.loads(line)
    return time.perf_counter() - started


def backends(scratch: Path, stack: contextlib.ExitStack) -> dict[str, Callable[[], EventStore]]:
    found: dict[str, Callable[[], EventStore]] = {
        "jsonl": lambda: JsonlStore(scratch / "jsonl"),
        "sqlite": lambda: SqliteStore(scratch / "sqlite"),
    }
    dsn = os.environ.get("CTXKERNEL_TEST_PG_DSN") or os.environ.get("CTXKERNEL_STORE__DSN")
    if dsn:
        from ctxkernel.store.postgres import PostgresStore
        from ctxkernel.testing_store import postgres_schema

        schema_dsn = stack.enter_context(postgres_schema(dsn))  # dropped at the end of the run
        found["postgres"] = lambda: PostgresStore(schema_dsn)
    else:
        emit({"name": "store_postgres", "skipped": "set CTXKERNEL_TEST_PG_DSN (scripts/test-services.sh does)"})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000, help="events in the cold-read session")
    parser.add_argument("--appends", type=int, default=2000, help="events appended one per batch")
    args = parser.parse_args()
    failed = False

    def report(kind: str, backend: str, value: float, unit: str, ratio: float, **extra: object) -> None:
        nonlocal failed
        target = TARGETS[kind][backend]
        ok = ratio >= target
        failed |= not ok
        emit({"name": f"store_{kind}_{backend}", "value": round(value, 4), "unit": unit, "ratio": round(ratio, 3),
              "target": target, "ok": ok, **extra})

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMPDIR")) as tmp, contextlib.ExitStack() as stack:
        scratch = Path(tmp)
        stores = backends(scratch, stack)
        run_id = os.urandom(4).hex()
        floor1 = floor_append(scratch, args.appends, 1)
        floor100 = floor_append(scratch, args.appends * 10, 100)
        emit({"name": "store_append_floor", "value": round(floor1, 1), "unit": "events/s", "ratio": 1.0, "target": 1.0,
              "batch100": round(floor100, 1)})
        for backend, opener in stores.items():
            store = opener()
            rate = store_append(store, f"append-{run_id}", args.appends, 1)
            report("append", backend, rate, "events/s", rate / floor1, floor=round(floor1, 1))
            rate = store_append(store, f"append100-{run_id}", args.appends * 10, 100)
            report("append_batch100", backend, rate, "events/s", rate / floor100, floor=round(floor100, 1))
            fill(store, f"long-{run_id}", args.events)
            store.close()
        read_floor = floor_read(scratch / "jsonl" / "sessions" / f"long-{run_id}.jsonl")
        emit({"name": "store_cold_read_floor", "value": round(read_floor, 4), "unit": "s", "ratio": 1.0, "target": 1.0,
              "events": args.events})
        for backend, opener in stores.items():
            seconds = cold_read(opener, f"long-{run_id}", args.events)
            report("cold_read", backend, seconds, "s", read_floor / seconds, events=args.events,
                   events_per_s=round(args.events / seconds))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
