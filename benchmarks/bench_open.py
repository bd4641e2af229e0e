"""Cold open of a session on the sqlite and PostgreSQL stores, against orjson-parsing its bytes.

    python benchmarks/run.py -k open            # sqlite; PostgreSQL with CTXKERNEL_TEST_PG_DSN set

The jsonl backend's cold open is ``cold_replay_<N>k`` in ``bench_kernel.py``; this module adds
the other backends with the same subject and floor. The session is the ``basic`` profile's
session of the realistic mix (``_profiles.py``) at 10,000 and 100,000 events, copied event for
event into each store. Subject: ``Kernel.open_session(id, repair=True)`` on a new store object
(nothing cached: read, repair, replay, meter). Floor: read the session's jsonl file and
``orjson.loads`` every line (the same events' bytes). CPU time, alternating (``_bench.py``).

``cold_open_<backend>_<N>k``: ``ratio`` = open / floor, target <= 3 (the issue's).
PostgreSQL's server-side work is not in this process's CPU time; its ``wall_ratio`` is beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from _bench import Bench
from _profiles import built, open_kernel, sizes

from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.store.sqlite import SqliteStore


def copy_session(source: JsonlStore, target: Any, session_id: str) -> int:
    target.create(source.header(session_id))
    batch: list[Any] = []
    seq = 0
    for event in source.read(session_id):
        batch.append(event)
        if len(batch) == 2_000:
            target.append(session_id, batch, seq)
            seq += len(batch)
            batch = []
    if batch:
        target.append(session_id, batch, seq)
        seq += len(batch)
    return seq


def backends(scratch: Path, stack: contextlib.ExitStack, size: int) -> dict[str, Callable[[], Any]]:
    """Stores for one size (the sizes' sessions share an id: they are copies of one build)."""
    found: dict[str, Callable[[], Any]] = {"sqlite": lambda: SqliteStore(scratch / f"open-sqlite-{size}")}
    dsn = os.environ.get("CTXKERNEL_TEST_PG_DSN") or os.environ.get("CTXKERNEL_STORE__DSN")
    if dsn:
        from ctxkernel.store.postgres import PostgresStore
        from ctxkernel.testing.store import postgres_schema

        schema_dsn = stack.enter_context(postgres_schema(dsn))
        found["postgres"] = lambda: PostgresStore(schema_dsn)
    elif size == 0:
        print(
            json.dumps(
                {"name": "cold_open_postgres", "skipped": "set CTXKERNEL_TEST_PG_DSN (scripts/test-services.sh does)"}
            ),
            flush=True,
        )
    return found


def run(bench: Bench) -> None:
    repeat = 3 if bench.quick else 5
    preset = sizes(bench)[1:]  # 10k and 100k
    scratch = Path(bench.scratch)
    with contextlib.ExitStack() as stack:
        backends(scratch, stack, 0)  # says why PostgreSQL is skipped, once
        for size in preset:
            stores = backends(scratch, stack, size)
            b = built(bench, "basic")[size]
            source = JsonlStore(b.home, fsync=False)
            path = source.path(b.session_id)
            for backend, opener in stores.items():
                store = opener()
                copied = copy_session(source, store, b.session_id)
                store.close()
                kernel = open_kernel("basic", b.home, store=opener())

                def floor(path: Path = path) -> Any:
                    return [orjson.loads(line) for line in path.read_bytes().splitlines()]

                def cold_open(
                    kernel: Any = kernel, opener: Callable[[], Any] = opener, session_id: str = b.session_id
                ) -> Any:
                    kernel.store.close()
                    kernel.store = opener()  # a new store object: no cache, no index
                    return kernel.open_session(session_id, repair=True)

                walls = []
                for _ in range(2):
                    start = time.perf_counter()
                    floor()
                    middle = time.perf_counter()
                    cold_open()
                    walls.append((time.perf_counter() - middle) / (middle - start))
                label = f"{size // 1000}k" if size % 1000 == 0 else str(size)
                bench.compare(
                    f"cold_open_{backend}_{label}",
                    cold_open,
                    floor,
                    target=("<=", 3),
                    repeat=repeat,
                    events=copied,
                    bytes=path.stat().st_size,
                    wall_ratio=round(statistics.median(walls), 3),
                )
                kernel.store.close()


if __name__ == "__main__":
    import sys
    import tempfile

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)))
