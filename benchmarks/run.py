"""Run every ``benchmarks/bench_*.py`` and print one JSON line per result.

    make bench                          # the full sizes (several minutes)
    python benchmarks/run.py --quick    # small sizes: a smoke run
    python benchmarks/run.py -k kernel  # only modules whose name contains "kernel"

Each line is ``{"name", "ratio", "target", "unit", "median", "spread", "met", ...}`` (see
``_bench.py``). To add benchmarks, create ``benchmarks/bench_<topic>.py`` with a
``run(bench)`` function that calls ``bench.compare(...)`` or ``bench.report(...)``; this runner
finds it. A module without ``run`` but with a ``__main__`` block is run as a script in a
subprocess; its JSON lines are passed through, and a line with ``"ok": false`` (or
``"met": false``) counts as a missed target.

Exit status: 1 when a module fails (or, with ``--strict``, when a target is missed), else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _bench import Bench  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("-k", dest="keyword", default="", help="only modules whose file name contains this")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--out", type=Path, help="also write the JSON lines to this file")
    args = parser.parse_args()

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    modules = sorted(p for p in HERE.glob("bench_*.py") if args.keyword in p.stem)
    machine = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": _cpus(),
        "system": platform.system(),
    }
    print(json.dumps({"machine": machine, "modules": [p.stem for p in modules], "quick": args.quick}), flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="ctxkernel-bench-"))
    bench = Bench(quick=args.quick, scratch=scratch)
    failed_modules = []
    try:
        for path in modules:
            started = time.perf_counter()
            try:
                module = _load(path)
                if hasattr(module, "run"):
                    module.run(bench)
                elif not _run_script(path, bench):
                    failed_modules.append(path.stem)
            except Exception:
                traceback.print_exc()
                failed_modules.append(path.stem)
            print(
                json.dumps({"module": path.stem, "seconds": round(time.perf_counter() - started, 1)}),
                file=sys.stderr,
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in bench.results))
    missed = [r["name"] for r in bench.results if not r["met"]]
    if missed:
        print(json.dumps({"missed": missed}), file=sys.stderr)
    if failed_modules:
        print(json.dumps({"failed_modules": failed_modules}), file=sys.stderr)
        return 1
    return 1 if (args.strict and missed) else 0


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "run") and not hasattr(module, "main"):
        msg = f"{path.name} defines neither run(bench) nor main()"
        raise AttributeError(msg)
    return module


def _run_script(path: Path, bench: Bench) -> bool:
    """Run a script-style module; pass its lines through. False when it produced no result."""
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=HERE.parent)
    results = 0
    for raw in proc.stdout.splitlines():
        print(raw, flush=True)
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and "name" in line and "ratio" in line:
            line.setdefault("met", bool(line.get("ok", True)))
            bench.results.append(line)
            results += 1
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    return results > 0 or proc.returncode == 0


def _cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
