"""Store performance, every backend side by side (one JSON line per result: name, ratio, target, unit).

    bash scripts/test-services.sh .venv/bin/python benchmarks/run.py -k store   # with PostgreSQL
    .venv/bin/python benchmarks/bench_store.py --quick                            # no server: jsonl, sqlite

Measured in wall-clock time, in rounds that alternate the backend and its floor, reporting the
median of the per-round ratios (``ratio`` is "higher is better"; ``target`` is the least we accept):

* ``store_append_<backend>``: events per second appended one event per batch with durability on
  (jsonl fsyncs each batch; sqlite commits with ``synchronous=FULL`` in WAL mode; PostgreSQL with its
  default ``synchronous_commit=on``). ``ratio`` is that rate over the floor: raw ``write`` +
  ``fsync`` of the same bytes to one file.
* ``store_append_batch100_<backend>``: the same with 100 events per batch (a compaction commit, an
  import), over the floor for the same batching.
* ``store_cold_read_<backend>``: seconds to read a 100,000-event session through a *new* store
  object (no cached index; the OS page cache is warm, as for a resumed session). ``ratio`` is the
  floor (read the jsonl file and ``orjson.loads`` each line, no validation) over the backend's time.

PostgreSQL is measured when ``CTXKERNEL_TEST_PG_DSN`` (or ``CTXKERNEL_STORE__DSN``) is set; its
tables go in a throwaway schema. The absolute rates depend on the disk; compare the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from ctxkernel.events import Event
from ctxkernel.store.base import EventStore, SessionHeader
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.store.sqlite import SqliteStore

#: least accepted ratios (see the module doc); set from measurements with a wide margin
TARGETS = {
    "append": {"jsonl": 0.3, "sqlite": 0.3, "postgres": 0.15},
    "append_batch100": {"jsonl": 0.3, "sqlite": 0.3, "postgres": 0.1},
    "cold_read": {"jsonl": 0.1, "sqlite": 0.1, "postgres": 0.05},
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
        from ctxkernel.testing.store import postgres_schema

        schema_dsn = stack.enter_context(postgres_schema(dsn))  # dropped at the end of the run
        found["postgres"] = lambda: PostgresStore(schema_dsn)
    else:
        emit({"name": "store_postgres", "skipped": "set CTXKERNEL_TEST_PG_DSN (scripts/test-services.sh does)"})
    return found


def run(bench: Any) -> None:
    """Entry point for ``benchmarks/run.py`` (see ``_bench.py``): wall-clock rounds, alternating
    subject and floor, median of the per-round ratios (CPU time would miss fsync waits and the
    PostgreSQL server's work)."""
    # short rounds, many of them: a shared disk's fsync latency drifts, and alternating often cancels it
    appends = 50 if bench.quick else 200
    events = 10_000 if bench.quick else 100_000
    rounds = 3 if bench.quick else 9
    with tempfile.TemporaryDirectory(dir=bench.scratch or None) as tmp, contextlib.ExitStack() as stack:
        scratch = Path(tmp)
        stores = backends(scratch, stack)
        run_id = os.urandom(4).hex()
        for backend, opener in stores.items():
            store = opener()
            for kind, per_batch, count in (("append", 1, appends), ("append_batch100", 100, appends * 10)):
                ratios, rates, floors = [], [], []
                for r in range(rounds):
                    floor = floor_append(scratch, count, per_batch)
                    rate = store_append(store, f"{kind}-{run_id}-{r}", count, per_batch)
                    ratios.append(rate / floor)
                    rates.append(rate)
                    floors.append(floor)
                _report(
                    bench,
                    f"store_{kind}_{backend}",
                    ratios,
                    TARGETS[kind][backend],
                    "events/s",
                    rates,
                    floor_events_per_s=round(statistics.median(floors), 1),
                    per_batch=per_batch,
                    events=count,
                )
            fill(store, f"long-{run_id}", events)
            store.close()
        jsonl_file = scratch / "jsonl" / "sessions" / f"long-{run_id}.jsonl"
        for backend, opener in stores.items():
            ratios, times, floors = [], [], []
            for _ in range(max(3, rounds // 2)):
                floor = floor_read(jsonl_file)
                seconds = cold_read(opener, f"long-{run_id}", events)
                ratios.append(floor / seconds)
                times.append(seconds)
                floors.append(floor)
            _report(
                bench,
                f"store_cold_read_{backend}",
                ratios,
                TARGETS["cold_read"][backend],
                "s",
                times,
                floor_s=round(statistics.median(floors), 4),
                events=events,
                events_per_s=round(events / statistics.median(times)),
            )


def _report(
    bench: Any, name: str, ratios: list[float], target: float, unit: str, values: list[float], **extra: Any
) -> None:
    ratio = statistics.median(ratios)
    spread = (max(ratios) - min(ratios)) / ratio if ratio else 0.0
    bench.report(name, ratio, (">=", target), unit, statistics.median(values), spread, **extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bench import Bench

    with tempfile.TemporaryDirectory() as scratch:
        bench = Bench(quick=args.quick, scratch=Path(scratch))
        run(bench)
    return 0 if all(r["met"] for r in bench.results) else 1


if __name__ == "__main__":
    sys.exit(main())
