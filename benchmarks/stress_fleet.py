"""Fleet proof at scale (issue 19): worker processes with their own kernel homes and host ids serve
many sessions of every strategy on one PostgreSQL while one worker is SIGKILLed again and again.

    make stress                                         # after the crash trials
    python benchmarks/stress_fleet.py --workers 4 --sessions 40 --turns 8 --kills 24

Needs CTXKERNEL_TEST_PG_DSN (scripts/test-services.sh sets it; required under CI=true). Prints the
figures on stderr and one JSON line on stdout; exits 1 on the first violated invariant (see
ctxkernel.testing.fleet for what is checked).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from ctxkernel.testing.crash import CrashCheckError
from ctxkernel.testing.fleet import run_fleet
from ctxkernel.testing.store import PG_DSN_ENV, in_ci, postgres_schema


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--kills", type=int, default=24)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    dsn = os.environ.get(PG_DSN_ENV)
    if not dsn:
        print(json.dumps({"name": "fleet_stress", "skipped": f"{PG_DSN_ENV} is not set"}))
        return 1 if in_ci() else 0
    with postgres_schema(dsn) as schema_dsn:
        try:
            report = run_fleet(
                f"postgres:{schema_dsn}",
                workers=args.workers,
                sessions=args.sessions,
                turns=args.turns,
                kills=args.kills,
                seed=args.seed,
            )
        except CrashCheckError as exc:
            print(json.dumps({"name": "fleet_stress", "ok": False, "error": str(exc)}))
            return 1
    print(report.line(), file=sys.stderr)
    print(json.dumps({"name": "fleet_stress", "ok": True, **dataclasses.asdict(report)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
