"""A compaction's cost does not grow with the session: the same compaction at 300,000 events against 10,000.

    python benchmarks/run.py -k compaction_flat

For each strategy, one session of its shipped profile (``profiles/<strategy>.toml``) is built
through the Session API with ``_profiles.py``'s coding mix (its strategies acting at their
thresholds as in a host) to 10,000 events, copied, and built on to 300,000 (quick: 2,000 and
30,000). Both sessions are then brought to the same state: one untimed manual compaction, then
every round runs ``TURNS`` more turns of the mix at both sizes and times the strategy's manual
compaction (``bench_compaction.py``'s: ``basic`` and ``chapters`` keep a quarter of the surface,
``decay`` compresses the span its steward plans, ``handoff`` and ``rollover`` switch windows), so
what is in front of the compaction is the same at both sizes; only the history behind it differs.

``compaction_<strategy>_flat_300k_vs_10k``: CPU time of the compaction at 300k / at 10k (the
median over alternating rounds, collector paused, fsync off: the question is whether the
compaction's work grows with the log, not the disk). Target <= 1.5 (issue 40). Beside it:
``events``, each log's length after the rounds; ``surface_before`` / ``surface_after``, the
median surface (nodes) in front of and after the timed compactions, small size first.

``mask`` masks as it goes (its ``pre_step``, with or without pressure), so a compaction at the end
of the turns would find nothing left to mask. Its session is built with the strategy live, as in a
host; over the ``TURNS`` turns before each compaction it is switched off for the session
(``Session.set_strategy_enabled``, as an integrator would), so those turns' results wait, and
switched on again for the timed compaction: one batch its ``plan()`` makes under pressure (the
results older than the current step, reaching into the verbatim tail as at the window's edge),
committed as its ``pre_step`` commits one. A mask rewrites results in place and leaves the surface
as long as it was, and the two builds stop at different points of ``basic``'s overflow guard, so
before the untimed compaction both sizes are first brought to one surface by ``basic``'s
compaction keeping ``SETTLE_TOKENS`` (``settle``).

Adding a strategy: give ``FLAT_STRATEGIES`` its manual compaction (list it in ``LIVE_STRATEGIES``
too if it acts on every step).

    python benchmarks/bench_compaction_flat.py [--quick] [strategy ...]   # some strategies only
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _bench import Bench, cpu_seconds
from _profiles import open_kernel, turn
from _workload import usage_for
from bench_compaction import STRATEGIES

from ctxkernel import Message, ToolCallBlock


def decay(session: Any) -> Callable[[], Any]:
    """``bench_compaction.decay``, with a call id of its own each time (one session compresses
    many times here)."""
    from ctxkernel_decay.plugin import current_state, settings_of
    from ctxkernel_decay.steward import plan_spans

    request = session.prepare_request()
    spans = plan_spans(
        session.context,
        current_state(session.context),
        settings_of(session.context),
        session.meter.surface_tokens() // 2,
    )
    assert spans, "decay planned no span"
    call = ToolCallBlock(f"bench_compress_{session.next_seq}", "compress", {"spans": spans})
    reply = Message.assistant("", [call])
    session.commit_reply(reply, usage=usage_for(session, request, reply))
    return lambda: session.run_tool(call)


def rollover(session: Any) -> Callable[[], Any]:
    from ctxkernel_rollover.switch import switch

    return lambda: switch(session.context, "manual")


def mask(session: Any) -> Callable[[], Any]:
    """One batch of masks from ``plan()``'s under-pressure path (the request at the window's edge),
    committed as the strategy's ``pre_step`` commits one; the turns before it ran with the
    strategy off (``LIVE_STRATEGIES``), so their results are what it masks."""
    from ctxkernel import Span
    from ctxkernel_mask.plan import plan
    from ctxkernel_mask.strategy import STRATEGY

    handle = STRATEGY.on(session.context)
    window = session.context.pressure().effective_window
    masks = plan(session.context, handle.settings, window, window)
    assert masks, "mask planned nothing"
    spans = [Span(m.start, m.end, message=m.message) for m in masks]
    return lambda: handle.compact(spans, kind="mask", single_batch=True, data={"reason": "pressure"})


#: the strategies whose row this module writes
FLAT_STRATEGIES: dict[str, Callable[[Any], Callable[[], Any]]] = {
    **STRATEGIES,
    "decay": decay,
    "rollover": rollover,
    "mask": mask,
}
TURNS = 40  # turns before each timed compaction: its surface, the same at both sizes
#: the strategies that act on every step (``pre_step``) and so leave nothing for the compaction:
#: switched off over the ``TURNS`` turns, on again for the compaction
LIVE_STRATEGIES = frozenset({"mask"})
SETTLE_TOKENS = 4_000  # a live strategy's surface before its first compaction (``settle``)


def build(scratch: Path, profile: str, sizes: tuple[int, int]) -> list[tuple[Any, Any]]:
    """(kernel, live session) at each size: one build, copied as it passes the smaller size."""
    small, large = sizes
    root = Path(tempfile.mkdtemp(prefix=f"flat-{profile}-", dir=scratch))
    kernel = open_kernel(profile, root / "large")
    session = kernel.open_session()
    n = 0
    while len(session.events) < small:
        turn(session, n)
        n += 1
    shutil.copytree(root / "large", root / "small")
    while len(session.events) < large:
        turn(session, n)
        n += 1
    small_kernel = open_kernel(profile, root / "small")
    return [(small_kernel, small_kernel.open_session(session.id)), (kernel, session)]


def settle(session: Any) -> None:
    """A live strategy's compaction rewrites in place and leaves the surface as long as it was,
    and the two builds stop at different points of their cycles (``basic``'s guard compacts each
    whenever it overflows): ``basic``'s compaction first, keeping ``SETTLE_TOKENS`` verbatim, so
    both sizes start from a surface of that size."""
    from ctxkernel.default_plugins.basic import compact

    session.user("settle")
    if not compact(session.context, SETTLE_TOKENS, reason="manual"):
        msg = f"the settling compaction did nothing ({len(session.surface)} nodes)"
        raise RuntimeError(msg)
    session.prepare_request()
    session.commit_reply(Message.assistant("settled"))
    session.end_turn()


def compaction(profile: str, session: Any, n: int) -> tuple[float, int, int]:
    """``TURNS`` turns, then the strategy's manual compaction, timed; the step it opened is
    closed after the timing. Returns (CPU seconds, surface before, surface after)."""
    live = profile in LIVE_STRATEGIES
    if live:
        session.set_strategy_enabled(profile, False)
    for k in range(TURNS):
        turn(session, n + k)
    if live:
        session.set_strategy_enabled(profile, True)
    session.user("continue")
    action = FLAT_STRATEGIES[profile](session)
    before, tokens_before = len(session.surface), session.meter.surface_tokens()
    outcome: list[Any] = []
    seconds = cpu_seconds(lambda: outcome.append(action()))
    after, tokens_after = len(session.surface), session.meter.surface_tokens()
    for call_id in list(session.surface.pending_calls):  # decay's compress: its result, as a host commits it
        session.tool_result(call_id, outcome[0])
    if after >= before and tokens_after >= tokens_before:  # a mask rewrites in place: fewer tokens
        msg = f"{profile}: the compaction did not shrink the surface ({before} -> {after} nodes)"
        raise RuntimeError(msg)
    session.prepare_request()
    session.commit_reply(Message.assistant("done"))
    session.end_turn()
    return seconds, before, after


def run(bench: Bench, strategies: Sequence[str] = ()) -> None:
    """Every row, or only those of ``strategies``."""
    sizes = (2_000, 30_000) if bench.quick else (10_000, 300_000)
    repeat = 3 if bench.quick else 7
    label = f"{sizes[1] // 1000}k_vs_{sizes[0] // 1000}k"
    unknown = set(strategies) - set(FLAT_STRATEGIES)
    if unknown:
        msg = f"no flat row for {sorted(unknown)}; the rows: {list(FLAT_STRATEGIES)}"
        raise ValueError(msg)
    for profile in strategies or FLAT_STRATEGIES:
        sessions = build(Path(bench.scratch), profile, sizes)
        n = 10_000_000  # past any turn number of the build: the mix varies its text with it
        for _, session in sessions:  # the same state at both sizes: one compaction, untimed
            if profile in LIVE_STRATEGIES:
                settle(session)
            compaction(profile, session, n)
        rounds: list[list[tuple[float, int, int]]] = [[], []]
        for r in range(repeat):
            n += TURNS + 1
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for i in order:
                rounds[i].append(compaction(profile, sessions[i][1], n))
        ratios = [big[0] / small[0] for small, big in zip(rounds[0], rounds[1], strict=True)]
        ratio = statistics.median(ratios)
        bench.report(
            f"compaction_{profile}_flat_{label}",
            ratio,
            ("<=", 1.5),
            "s",
            statistics.median(r[0] for r in rounds[1]),
            (max(ratios) - min(ratios)) / ratio if ratio else 0.0,
            baseline_median=float(f"{statistics.median(r[0] for r in rounds[0]):.6g}"),
            events=[len(s.events) for _, s in sessions],
            surface_before=[int(statistics.median(r[1] for r in side)) for side in rounds],
            surface_after=[int(statistics.median(r[2] for r in side)) for side in rounds],
            repeat=repeat,
        )
        for kernel, _ in sessions:
            close = getattr(kernel.store, "close", None)
            if close:
                close()


if __name__ == "__main__":
    import sys

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        chosen = [a for a in sys.argv[1:] if a != "--quick"]
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)), chosen)
