"""Crash proof at scale: SIGKILL a writer at random points, 100+ trials per store backend.

    make stress                                   # all backends, PostgreSQL from test-services.sh
    python benchmarks/stress_store.py --trials 100 --backend sqlite

Each trial kills a writer during appends and compaction transactions and then checks, on the
reopened store, that the log replays, that no acknowledged event is lost and that no half-committed
compaction is visible (see ctxkernel.testing.crash). Prints one JSON line per backend and exits 1
on the first violation. PostgreSQL runs when CTXKERNEL_TEST_PG_DSN is set (required under CI=true).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from ctxkernel.testing.crash import CrashCheckError, run_trials
from ctxkernel.testing.store import PG_DSN_ENV, in_ci


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--backend", action="append", choices=["jsonl", "sqlite", "postgres"])
    args = parser.parse_args()
    backends = args.backend or ["jsonl", "sqlite", "postgres"]
    failed = False
    for backend in backends:
        with tempfile.TemporaryDirectory() as scratch:
            if backend == "postgres":
                dsn = os.environ.get(PG_DSN_ENV)
                if not dsn:
                    print(json.dumps({"name": "crash_trials_postgres", "skipped": f"{PG_DSN_ENV} is not set"}))
                    failed = failed or in_ci()
                    continue
                from ctxkernel.testing.store import postgres_schema

                with postgres_schema(dsn) as schema_dsn:
                    failed |= run(backend, f"postgres:{schema_dsn}", args)
            else:
                failed |= run(backend, f"{backend}:{scratch}", args)
    return 1 if failed else 0


def run(backend: str, spec: str, args: argparse.Namespace) -> bool:
    started = time.monotonic()
    try:
        report = run_trials(spec, args.trials, seed=args.seed)
    except CrashCheckError as exc:
        print(json.dumps({"name": f"crash_trials_{backend}", "ok": False, "error": str(exc)}))
        return True
    print(report.line(), file=sys.stderr)
    print(
        json.dumps(
            {
                "name": f"crash_trials_{backend}",
                "ok": True,
                "trials": report.trials,
                "acknowledged_batches": report.acknowledged_batches,
                "events": report.events,
                "kills_inside_compaction": report.killed_inside_compaction,
                "compactions_committed": report.compactions_committed,
                "compactions_failed_or_interrupted": report.compactions_interrupted,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
    return False


if __name__ == "__main__":
    sys.exit(main())
