"""Shared helpers for ``benchmarks/bench_*.py``: side-by-side timing, result lines, workloads.

A benchmark module defines ``run(bench: Bench) -> None`` and calls :meth:`Bench.compare` (or
:meth:`Bench.report`) once per result. Every result is a ratio of two timings measured
alternately in the same process, so machine speed cancels out; absolute timings are printed
for context only.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Target = tuple[str, float]  # (">=" or "<=", value)
#: a row kept as a figure, with no target to meet (docs/performance.md says which and why)
NO_TARGET = None


@dataclass
class Bench:
    """What ``run.py`` hands each module: the size preset and the result sink."""

    quick: bool = False
    scratch: Path = field(default_factory=Path)
    results: list[dict[str, Any]] = field(default_factory=list)
    out: Any = sys.stdout

    def report(
        self,
        name: str,
        ratio: float,
        target: Target | None,
        unit: str,
        median: float,
        spread: float,
        **extra: Any,
    ) -> dict[str, Any]:
        """Print one JSON line ``{name, ratio, target, unit, median, spread, met, ...}``.

        ``target=NO_TARGET`` keeps the row as a figure: ``target`` is ``"none"`` and ``met`` is
        true, so it never counts as a miss."""
        if target is None:
            met, shown = True, "none"
        else:
            op, value = target
            met = ratio >= value if op == ">=" else ratio <= value
            shown = f"{op} {value:g}"
        line = {
            "name": name,
            "ratio": round(ratio, 3),
            "target": shown,
            "unit": unit,
            "median": _round(median),
            "spread": round(spread, 3),
            "met": met,
            **extra,
        }
        self.results.append(line)
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()
        return line

    def compare(
        self,
        name: str,
        subject: Callable[[], Any],
        baseline: Callable[[], Any],
        *,
        target: Target,
        repeat: int,
        invert: bool = False,
        unit: str = "s",
        setup: Callable[[], Any] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Time ``subject`` and ``baseline`` alternately ``repeat`` times.

        ``ratio`` is the median of the per-round ratios ``subject / baseline`` (or ``baseline /
        subject`` with ``invert``, for "N times faster" targets); ``median`` is the subject's
        median time; ``spread`` is ``(max - min) / median`` of the per-round ratios.
        """
        ratios, subject_times, baseline_times = [], [], []
        for _ in range(repeat):
            if setup is not None:
                setup()
            b = cpu_seconds(baseline)
            if setup is not None:
                setup()
            s = cpu_seconds(subject)
            subject_times.append(s)
            baseline_times.append(b)
            ratios.append(b / s if invert else s / b)
        ratio = statistics.median(ratios)
        spread = (max(ratios) - min(ratios)) / ratio if ratio else 0.0
        return self.report(
            name,
            ratio,
            target,
            unit,
            statistics.median(subject_times),
            spread,
            baseline_median=_round(statistics.median(baseline_times)),
            repeat=repeat,
            **extra,
        )


def cpu_seconds(fn: Callable[[], Any]) -> float:
    """CPU seconds of this process running ``fn`` (with the cyclic collector paused).

    CPU time rather than wall time: on a shared machine (CI, two cores) other processes steal
    wall time from one side of a comparison at random. The collector is paused because it would
    charge one side for the other's garbage; docs/performance.md gives the effect of leaving it on.
    """
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        fn()
        return time.process_time() - start
    finally:
        gc.enable()


def per_call(fn: Callable[[], Any], number: int) -> Callable[[], None]:
    """A callable that runs ``fn`` ``number`` times; with it, ``compare`` times per ``number`` calls."""

    def many() -> None:
        for _ in range(number):
            fn()

    return many


def durable_append(session: Any, written: int) -> tuple[float, float]:
    """Wall and CPU seconds of one durable append of ``written`` bytes, as one event of
    ``session``: the baseline a compaction's single durable write is compared with."""
    from ctxkernel import EventSpec

    payload = "x" * max(1, written - 120)  # the envelope of one event line is about 120 bytes
    cpu, wall = time.process_time(), time.perf_counter()
    session.append([EventSpec("bench/blob", {"blob": payload}, ignorable=True)])
    return time.perf_counter() - wall, time.process_time() - cpu


def _round(seconds: float) -> float:
    return float(f"{seconds:.6g}")
