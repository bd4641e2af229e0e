"""Compaction transaction cost per strategy against one durable append of the same bytes.

    python benchmarks/run.py -k compaction

Each round builds a session of the profile (a surface of about 240 small messages, jsonl store
with fsync on) and times, in wall time (a durable write is mostly the wait for ``fsync``), the
strategy's own manual compaction, which runs the kernel's transaction (validation, lock, commit):

* ``basic``: ``default_plugins.basic.compact`` of the head, keeping a quarter of the surface;
* ``decay``: the ``compress`` tool on the span its steward plans (the summary is in the call's
  arguments, i.e. written by the model, so no summarising happens inside the timing);
* ``handoff``: ``ctxkernel_handoff.compact_now`` (a window switch keeping the last message);
* ``chapters``: ``compact_in_place`` keeping a quarter of the surface (its chapter files
  and records are written after the commit, at the next step: not timed).

A compaction's snapshot is written at the next step boundary, never inside the commit, for every
strategy alike, so none of these timings holds it: ``decay``'s ``compress`` leaves it to the
``tool_result`` that closes its step (until the fifth round ``run_tool`` wrote it on return, and
decay's row held it: ~0.75 ms, moved to the step's end, not removed; ``benchmarks/LOG.md``).
The session folds its snapshot indexes (timeline, history, the notes) and serialises each step's nodes at the
end of that step (``Session._sync_indexes``), so that snapshot folds and serialises only the
compaction's own step.

The instruction block a commit pins is counted from the counts the meter took of those user
messages when they landed on the surface (a live session counts every visible message for its
pressure anyway, and the build does so for its requests) and of the block's fixed frame, once per
process (the same text in every session): only the ids and the replacement's text are tokenised
inside the timing. Handoff renders the excerpt of each message at the end of the step it
lands in and counts its activity lines then (``Excerpts.of``), so a switch counts its handoff
from those lines and tokenises only the rest (the snapshot, the notes, the frame): that tokenising
moved to the step ends of the build, outside the timing, as it does in a live session (measured:
~0.1 ms a step), it was not removed. Since the sixth round each step end also adds its new
excerpts to the body's material (``Material``: entries before each position, the file list,
the positions naming a file or carrying a block; a few µs a step), so a switch reads those at
its region's length instead of collecting every excerpt of the window: moved, not removed.
Since the tenth round a switch's commit hook leaves the fold of its four events (the next
step's ``pre_step`` folds the log to its end anyway) and the freeing of the excerpts it replaced
to the next step: moved, not removed (~0.25 M instructions; ``benchmarks/LOG.md``).
Chapters counts each user instruction's quote in the ``pre_step`` of the step it starts
(``count_new_quotes``, in the build, outside the timing; a live session pays it there too:
~15-100 µs once per user message), so its table of contents is counted from those quotes and
only its head and end are tokenised inside the timing: moved, not removed.

``rollover`` is measured by ``bench_rollover.py`` (same design; its line is in the same run).
The baseline is one durable append of a single event carrying as many bytes as the compaction
wrote, in another session of the same store, taken just before and just after the compaction (the
mean of the two), so both sides of a round see the same load. No model is called: the extractive summary of
``basic`` and the handoff text are local computation and are included (an upper bound).

``compaction_<strategy>_vs_durable_append``: ``ratio`` = compaction / append, a figure without a
target since issue 40 (it was <= 3, issue 21): what the rows were for is met, every compaction is
one durable write, and what is left is a few ms of CPU once per many steps; the denominator moves
with the disk. ``cpu_ratio`` beside it. What users feel, a compaction that does not grow with the
session, is ``bench_compaction_flat.py``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _bench import NO_TARGET, Bench, durable_append
from _profiles import open_kernel, turn
from _workload import usage_for

from ctxkernel import Message, ToolCallBlock

TURNS = 60  # small turns only: about 240 surface messages, far below every threshold


def build(home: Path, profile: str) -> tuple[Any, Any]:
    kernel = open_kernel(profile, home, fsync=True)
    session = kernel.open_session()
    for n in range(1, TURNS + 1):
        turn(session, n * 10 + 1)  # never a multiple of 10: no large results
    session.user("continue")
    return kernel, session


def basic(session: Any) -> Callable[[], Any]:
    from ctxkernel.default_plugins.basic import compact

    keep = session.meter.surface_tokens() // 4
    return lambda: compact(session.context, keep, reason="manual")


def decay(session: Any) -> Callable[[], Any]:
    from ctxkernel_decay.plugin import current_state, settings_of
    from ctxkernel_decay.steward import plan_spans

    request = session.prepare_request()  # the anchors are assigned when a request is decorated
    spans = plan_spans(
        session.context,
        current_state(session.context),
        settings_of(session.context),
        session.meter.surface_tokens() // 2,
    )
    assert spans, "decay planned no span"
    call = ToolCallBlock("bench_compress", "compress", {"spans": spans})
    reply = Message.assistant("", [call])
    session.commit_reply(reply, usage=usage_for(session, request, reply))
    return lambda: session.run_tool(call)


def handoff(session: Any) -> Callable[[], Any]:
    from ctxkernel_handoff import compact_now

    return lambda: compact_now(session.context)


def chapters(session: Any) -> Callable[[], Any]:
    from ctxkernel_chapters.plugin import compact_in_place

    keep = session.meter.surface_tokens() // 4
    return lambda: compact_in_place(session.context, keep, reason="manual")


STRATEGIES: dict[str, Callable[[Any], Callable[[], Any]]] = {
    "basic": basic,
    "decay": decay,
    "handoff": handoff,
    "chapters": chapters,
}


def one_round(scratch: Path, profile: str, size: int) -> dict[str, float]:
    """One compaction between two baseline appends of ``size`` bytes (what the strategy's
    compaction writes, from a sizing round): back to back, so both sides see the same load."""
    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        kernel, session = build(Path(folder), profile)
        action = STRATEGIES[profile](session)
        other = kernel.open_session()
        path = session.store.path(session.id)
        before, surface_before = path.stat().st_size, len(session.surface)
        first_wall, first_cpu = durable_append(other, size)
        cpu, wall = time.process_time(), time.perf_counter()
        outcome = action()
        compaction_wall, compaction_cpu = time.perf_counter() - wall, time.process_time() - cpu
        written = path.stat().st_size - before
        if written <= 0 or len(session.surface) >= surface_before:
            msg = f"{profile}: the compaction did not shrink the surface ({outcome!r})"
            raise RuntimeError(msg)
        second_wall, second_cpu = durable_append(other, size)
        return {
            "cw": compaction_wall,
            "cc": compaction_cpu,
            "aw": (first_wall + second_wall) / 2,
            "ac": (first_cpu + second_cpu) / 2,
            "bytes": written,
            "nodes": surface_before,
            "after": len(session.surface),
        }


def run(bench: Bench) -> None:
    repeat = 3 if bench.quick else 7
    scratch = Path(bench.scratch)
    for profile in STRATEGIES:
        size = int(one_round(scratch, profile, 10_000)["bytes"])  # warm imports and caches; the size
        rounds = [one_round(scratch, profile, size) for _ in range(repeat)]
        ratios = [r["cw"] / r["aw"] for r in rounds]
        ratio = statistics.median(ratios)
        bench.report(
            f"compaction_{profile}_vs_durable_append",
            ratio,
            NO_TARGET,
            "s",
            statistics.median(r["cw"] for r in rounds),
            (max(ratios) - min(ratios)) / ratio,
            baseline_median=float(f"{statistics.median(r['aw'] for r in rounds):.6g}"),
            cpu_ratio=round(statistics.median(r["cc"] / max(r["ac"], 1e-9) for r in rounds), 3),
            bytes=int(statistics.median(r["bytes"] for r in rounds)),
            surface_before=int(statistics.median(r["nodes"] for r in rounds)),
            surface_after=int(statistics.median(r["after"] for r in rounds)),
            timing="wall",
            repeat=repeat,
        )


if __name__ == "__main__":
    import sys

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)))
