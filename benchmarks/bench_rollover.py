"""Rollover commit cost versus one durable append of the same bytes (a figure, no target).

    python benchmarks/run.py -k rollover          # or: python benchmarks/bench_rollover.py [--quick]

A window switch is local event writes only, no model call (seed 002 §4: "microseconds to
milliseconds of local event writes"). Each round builds a session (a surface of about 200 messages
and 20 notes the model wrote with ``note_create``, on a jsonl store with fsync on: :func:`build`;
until the fourth round the notes were written through the notes API, which no live model does:
a note's seed part is counted when the model writes it, before any switch; likewise, since the
fifth round, the seed's parts fixed from the window's start (the chain's ids, where its items
begin) are counted in the window's first ``pre_step``, which a live session runs before any switch
of that window, as the build's steps do here), then times side by side:

* subject: a whole manual rollover — the seed built from the notes and the log, the compaction
  transaction (validation, lock and commit in one durable batch), the surface replacement;
* baseline: one durable append of a single event carrying as many bytes as the rollover wrote,
  in another session of the same store, taken just before and just after the switch (the mean of
  the two), so both sides of a round see the same load.

Wall time, not CPU time: what a durable write costs is mostly the wait for ``fsync``, which CPU
time does not see. ``ratio`` is the median of the per-round ratios; the CPU-time ratio is printed
beside it (``cpu_ratio``) to show the share of the cost that is computation.

``parts_s`` says where a switch's wall time goes, from further rounds run after the measured ones
(so the timers' own few microseconds never touch ``ratio``), medians in seconds: ``rollover``, the
plugin's own work (the seed built from the notes and the log, the window ids, the checks; the
whole switch less the transaction); ``transaction``, the kernel's compaction transaction
(``StrategyHandle.compact``); inside it ``count``, the meter's counts (the seed's, which the
kernel takes for the summary's ``tokens_after`` and the new node), ``append``, the commit batch
through ``Session.append`` (the batch's checks, the store's write and ``fsync``, the fold), and
``store``, the store's own write and ``fsync`` alone; ``lease``, taking and giving up the
compaction lease; ``span_checks``, the transaction's span validation; ``instructions``, its search
for the user's instructions the commit would take off the surface; ``commit_hooks``, the plugins'
``commit`` hooks (rollover's included); ``transaction_rest``, the transaction less those parts
(its refreshes, building the summary event; under load, mostly time the process waited for a core).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import NO_TARGET, Bench, durable_append

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

REPO = Path(__file__).resolve().parents[1]


def build(home: Path, nodes: int, notes: int):
    """A session of about ``nodes`` surface nodes whose model wrote ``notes`` notes with the
    strategy's ``note_create`` tool in one batch early in the window (the calls' message and a
    result per note are among the nodes), as a live model writes them: the tool renders and
    counts each note's seed part then, so the switch tokenises only what is new."""
    profile = make_profile(
        REPO / "profiles" / "rollover.toml", model={"context_window": 1_000_000, "reserved_output_tokens": 8_000}
    )
    kernel = Kernel(profile, store=JsonlStore(home), home=home)
    session = kernel.open_session()
    session.user("benchmark the rollover")
    session.prepare_request()
    calls = [
        ToolCallBlock(
            f"n{i}",
            "note_create",
            {"path": f"notes/{i}", "content": f"decision {i}: keep the API stable; next step {i}\n" * 5},
        )
        for i in range(notes)
    ]
    session.commit_reply(Message.assistant("saving the decisions", calls))
    for call in session.pending_calls:
        session.tool_result(call.id, session.run_tool(call))
    for i in range(max(0, nodes - notes - 2) // 2):
        session.prepare_request()
        session.commit_reply(
            Message.assistant(f"step {i}", [ToolCallBlock(f"c{i}", "read_file", {"path": f"src/m{i}.py"})])
        )
        session.tool_result(f"c{i}", "def function():\n    return 42\n" * 20)
    session.end_turn()
    session.user("continue")
    return kernel, session


#: what ``parts_s`` times: label -> the functions (``module``, ``Class.method`` or ``function``)
#: whose calls inside the transaction are summed; a function a later kernel no longer has is
#: left out (its label reads 0)
PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "transaction": (("ctxkernel.handle", "StrategyHandle.compact"),),
    "count": (("ctxkernel.meter", "Meter.count_message"),),
    "append": (("ctxkernel.session", "Session.append"),),
    "store": (("ctxkernel.store.jsonl", "JsonlStore.append"),),
    "lease": (("ctxkernel.lease", "CompactionLease.acquire"), ("ctxkernel.lease", "CompactionLease.release")),
    "span_checks": (("ctxkernel.compaction", "validate_spans"),),
    "instructions": (("ctxkernel.instructions", "pin_lost"),),
    "commit_hooks": (("ctxkernel.plugins", "HookFacade.commit"),),
}
PARTS_ROUNDS = 7


@contextlib.contextmanager
def timing_parts(sink: dict[str, float]):
    """Sum into ``sink`` the wall time of the transaction's calls and, inside it, of each other
    :data:`PARTS` function's (the plugin's own counts, before the transaction, are its share)."""
    import importlib

    originals, inside = [], []
    for label, targets in PARTS.items():
        for module, name in targets:
            owner: Any = importlib.import_module(module)
            *path, attribute = name.split(".")
            for part in path:
                owner = getattr(owner, part, None)
            original = getattr(owner, "__dict__", {}).get(attribute)
            if original is None:
                continue

            def timed(*args, _original=original, _label=label, **kwargs):
                if _label != "transaction" and "transaction" not in inside:
                    return _original(*args, **kwargs)
                inside.append(_label)
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    inside.pop()
                    if _label not in inside:  # a nested call of the same part is in its caller's time
                        sink[_label] = sink.get(_label, 0.0) + time.perf_counter() - start

            originals.append((owner, attribute, original))
            setattr(owner, attribute, timed)
    try:
        yield sink
    finally:
        for owner, attribute, original in reversed(originals):
            setattr(owner, attribute, original)


def parts_round(scratch: Path, nodes: int, notes: int) -> dict[str, float]:
    """One switch with :data:`PARTS` timed: the seconds of each, and ``rollover`` (the rest)."""
    from ctxkernel_rollover.switch import switch

    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        kernel, session = build(Path(folder), nodes, notes)
        sink: dict[str, float] = {}
        wall = time.perf_counter()
        with timing_parts(sink):
            switch(session.context, "manual")
        wall = time.perf_counter() - wall
        inner = sum(seconds for label, seconds in sink.items() if label not in ("transaction", "store"))
        rest = sink.get("transaction", 0.0) - inner  # ``store`` is inside ``append``
        return {"rollover": wall - sink.get("transaction", 0.0), **sink, "transaction_rest": rest}


#: the first baseline's size in a sizing round (the rounds measured use what that round wrote)
WRITTEN_GUESS = 60_000


def one_round(scratch: Path, nodes: int, notes: int, written_guess: int = WRITTEN_GUESS) -> dict[str, float]:
    """One switch between two baseline appends of the same size: the three run back to back,
    so the baseline sees the load and the disk's state the switch saw (a baseline taken on its
    own moved 2-3.6x between runs while the switch did not)."""
    from ctxkernel_rollover.switch import switch

    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        kernel, session = build(Path(folder), nodes, notes)
        other = kernel.open_session()
        path = session.store.path(session.id)
        size_before = path.stat().st_size
        before_wall, before_cpu = durable_append(other, written_guess)
        cpu, wall = time.process_time(), time.perf_counter()
        switch(session.context, "manual")
        rollover_wall, rollover_cpu = time.perf_counter() - wall, time.process_time() - cpu
        written = path.stat().st_size - size_before
        after_wall, after_cpu = durable_append(other, written)
        return {
            "rw": rollover_wall,
            "rc": rollover_cpu,
            "aw": (before_wall + after_wall) / 2,
            "ac": (before_cpu + after_cpu) / 2,
            "bytes": written,
        }


def run(bench: Bench) -> None:
    from ctxkernel.logging import configure_logging

    configure_logging("warning")  # a log line per switch is the operator's choice, not commit cost
    repeat = 5 if bench.quick else 15
    nodes, notes = (60, 8) if bench.quick else (200, 20)
    scratch = bench.scratch if str(bench.scratch) not in ("", ".") else Path(tempfile.gettempdir())
    one_round(scratch, 20, 2)  # warm imports, tokenizer and caches
    size = int(one_round(scratch, nodes, notes)["bytes"])  # what a switch writes: the baselines' size
    rounds = [one_round(scratch, nodes, notes, size) for _ in range(repeat)]
    ratios = [r["rw"] / r["aw"] for r in rounds]
    parts = [parts_round(scratch, nodes, notes) for _ in range(3 if bench.quick else PARTS_ROUNDS)]
    ratio = statistics.median(ratios)
    bench.report(
        "rollover_commit_vs_durable_append",
        ratio,
        NO_TARGET,  # was <= 2 (issue 21); kept as a figure since issue 40 (docs/performance.md)
        "s",
        statistics.median(r["rw"] for r in rounds),
        (max(ratios) - min(ratios)) / ratio if ratio else 0.0,
        baseline_median=float(f"{statistics.median(r['aw'] for r in rounds):.6g}"),
        cpu_ratio=round(statistics.median(r["rc"] / max(r["ac"], 1e-9) for r in rounds), 3),
        bytes=int(statistics.median(r["bytes"] for r in rounds)),
        parts_s={
            label: float(f"{statistics.median(p.get(label, 0.0) for p in parts):.3g}")
            for label in ("rollover", *PARTS, "transaction_rest")
        },
        surface_nodes=nodes,
        notes=notes,
        timing="wall",
        repeat=repeat,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick=args.quick, scratch=Path(scratch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
