"""The compaction transaction (docs/design/host-model.md §3): the one way a strategy changes the
surface beyond appending.

Every strategy that changes the surface beyond appending goes through :func:`run_transaction`
(via :meth:`Session.compact`): summaries, model-authored compressions, drops, window switches and
chapter archives alike. The steps, in order:

1. validate every span: it is on the surface, its edges are balanced cuts, spans do not overlap;
2. take the session's compaction lease (lease.py): refused as busy, naming the holder, while a
   live holder has it; an open compaction whose holder lost its lease (dead, or expired by the
   store's clock) is ended with an error end that records the takeover. A ``single_batch``
   transaction started while no compaction is open takes no lease: it writes nothing before its
   commit, whose expected-seq check is its lock (a writer that appended first, a lock included,
   makes it fail with nothing written); if its last refresh before the commit finds a
   compaction another worker opened meanwhile, it runs again the leased way (busy, or a
   takeover). With ``summarize_first`` step 5 runs before this step, and the transaction
   commits as a single batch;
3. append ``compaction/start`` (the lock in the log; the lease is renewed while the transaction runs),
   without waiting for the disk: the commit's sync (or the error end's) carries it, so a
   transaction waits for the disk once (``store.base.SyncDeferral``);
4. price the spans with the meter;
5. summarise (the ``summarize`` hook, or a summary the caller supplies);
6. shrink check: the replacements cost fewer tokens than what they replace;
7. stability check: the spans are still exactly on the surface, and no other replacement landed;
8. commit ``compaction/summary``, the replacements and ``compaction/end`` as one atomic batch;
9. on any failure after step 3: exactly one ``compaction/end {error}``; the surface is unchanged.
   When even that end cannot be written (the store keeps failing), the failure is logged as an
   error and the lease is given up anyway: the next transaction or opening of the session, in
   any process, takes the compaction over, so a failed end never leaves the session busy for
   good (see :func:`_fail`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import instructions, ledger
from .cache_rule import Decision, Edit, decide
from .convert import normalize_usage
from .errors import (
    CacheWaitError,
    CompactionError,
    ConflictError,
    EventError,
    ShrinkCheckError,
    SurfaceChangedError,
    SurfaceError,
)
from .events import (
    COMPACTION_END,
    COMPACTION_START,
    COMPACTION_SUMMARY,
    SURFACE_DROP,
    TOOL_RESULT,
    USER_MESSAGE,
    EventSpec,
    random_hex,
    remove_op,
    replace_op,
)
from .lease import CompactionLease
from .logging import get_logger
from .messages import MAX_NAME_CHARS, Message
from .pricing import ModelPrice, UnknownModelError, price_for, price_in_force
from .redact import redact

# the values a transaction is made of live in spans.py; these names are kept here for callers
from .spans import (
    CHECKPOINT_CLOSE,
    CHECKPOINT_OPEN,
    SUMMARY_SECTIONS,
    CommitResult,
    Region,
    Render,
    Span,
    SpanResult,
    Summary,
    balanced_cut_at_or_before,
    checkpoint_message,
    head_region,
    validate_spans,
    whole_surface_but_last,
)

if TYPE_CHECKING:
    from .meter import Meter
    from .ports import SessionPort
    from .surface import Node, Surface

log = get_logger("ctxkernel.compaction")


def run_transaction(
    session: SessionPort,
    spans: Sequence[Span],
    *,
    strategy: str,
    kind: str = "summary",
    render: Render | None = None,
    check_shrink: bool = True,
    data: dict[str, Any] | None = None,
    single_batch: bool = False,
    summarize_first: bool = False,
    keep_instructions: bool = True,
) -> CommitResult:
    """Run the transaction. ``single_batch`` (only when every span's replacement is given, so
    no summarize step runs between lock and commit) writes ``compaction/start`` in the same
    durable batch as the commit: the store's expected-seq check then plays the lock's part, a
    model-free switch costs one durable write instead of two, and a refusal writes nothing.
    ``keep_instructions=False`` is for a front door replaying the client's own edit of its
    history (a retried turn, a popped item): the user took those messages away, so the
    instruction budget does not bring them back. Strategies cannot pass it (the handle refuses).
    ``summarize_first`` is for a strategy whose summaries are local computation (``basic``
    without a summarizer model): the summarize hook and ``render`` run before anything is
    written and the transaction commits as ``single_batch`` (a model call must not run before the
    lock: a worker racing for the same span would pay for a summary that cannot commit)."""
    session.refresh()
    resolved = validate_spans(session.surface, spans)  # 1, before any store write: a bad span costs nothing
    if session.editing_automatically:  # 1b: does it pay for the cached prefix it rewrites?
        _gate_spans(session, spans, resolved, strategy)
    # the spans whose replacement the kernel renders itself (checkpoint_message: one text block
    # of a str) are not parsed back by the commit's surface check; a plugin's message or render is
    rendered = (
        frozenset(i for i, s in enumerate(spans) if s.message is None and not s.remove)
        if render is None
        else frozenset()
    )
    if summarize_first:
        spans = _summarized(session, spans, resolved, strategy, kind, render)
        single_batch = True
    if single_batch and session.open_compaction is None:
        try:
            return _run_steps(
                session,
                spans,
                resolved,
                None,
                strategy,
                kind,
                render,
                check_shrink,
                data,
                True,
                keep_instructions,
                rendered,
            )
        except _CompactionOpened:
            # another worker opened a compaction since our refresh: the lease decides (busy, or takeover)
            session.refresh()
            resolved = validate_spans(session.surface, spans)
    version = session.surface.version
    lease = CompactionLease(session)
    lease.acquire()  # 2: a live holder's lease refuses us as busy
    try:
        if session.refresh() or session.surface.version != version:
            # another writer appended while the lease was taken: check the spans again
            resolved = validate_spans(session.surface, spans)
        return _run_steps(
            session,
            spans,
            resolved,
            lease,
            strategy,
            kind,
            render,
            check_shrink,
            data,
            single_batch,
            keep_instructions,
            rendered,
        )
    finally:
        lease.release()


class _CompactionOpened(Exception):
    """An unleased single batch found, at its last refresh, a compaction another worker opened."""


def _summarized(
    session: SessionPort,
    spans: Sequence[Span],
    resolved: list[list[Node]],
    strategy: str,
    kind: str,
    render: Render | None,
) -> list[Span]:
    """Step 5 before the lock (``summarize_first``): each span with its replacement message
    rendered from its summary (the given one, else the summarize hook's), as the locked path
    would render it."""
    meter = session.meter
    render = render or (lambda summary, region: checkpoint_message(summary, strategy))
    written = []
    for span, nodes in zip(spans, resolved, strict=True):
        if span.remove or span.message is not None:
            written.append(span)
            continue
        region = Region(tuple(nodes), meter.nodes_tokens(nodes), strategy, kind)
        summary = Summary(span.summary) if isinstance(span.summary, str) else span.summary
        if summary is None:
            summary = session.kernel.hooks.summarize(session, region)
            if summary is None:
                msg = f"no summarize implementation answered for strategy {strategy!r}"
                raise CompactionError(msg)
        # built directly: dataclasses.replace introspects the fields on every call
        written.append(Span(span.start, span.end, summary, render(summary, region), span.remove, span.data))
    return written


# over the complexity cap: the commit's numbered steps in the order the transaction takes them,
# each a check that may refuse; split up, that order would be spread over helpers
def _run_steps(  # noqa: C901
    session: SessionPort,
    spans: Sequence[Span],
    resolved: list[list[Node]],
    lease: CompactionLease | None,
    strategy: str,
    kind: str,
    render: Render | None,
    check_shrink: bool,
    data: dict[str, Any] | None,
    single_batch: bool,
    keep_instructions: bool,
    rendered: frozenset[int] = frozenset(),
) -> CommitResult:
    """Steps 3-9 while holding the session's compaction lease (``resolved``: the spans' nodes,
    validated against the surface as it is now); ``lease`` None: a single batch started while no
    compaction was open, whose commit's expected-seq check is its lock."""
    surface = session.surface
    busy = session.open_compaction
    if busy is not None and lease is not None:  # an unleased single batch starts with none open
        # we hold the lease, so the open compaction's holder does not: it died or stalled past
        # its expiry. Its error end records the takeover; the log's seq check keeps it unique.
        try:
            session.append([lease.takeover_end(busy)])
        except ConflictError as exc:
            session.refresh()
            raise SurfaceChangedError(f"another writer appended while taking over a compaction: {exc}") from None
    compaction_id = random_hex(16)  # a replay draws it from its seed (events.replay_clock)
    version = surface.version
    start_event = EventSpec(
        COMPACTION_START,
        {
            "compaction_id": compaction_id,
            "strategy": strategy,
            "kind": kind,
            "turn": session.turn,
            "spans": [[s.start, s.end] for s in spans],
            "holder": session.holder,
        },
    )
    if single_batch:
        if any(not span.remove and span.message is None for span in spans):
            msg = "single_batch needs every span's replacement message given: a summary step needs the lock first"
            raise CompactionError(msg)
        start_seq = session.next_seq
    else:
        try:
            # 3: the lock. Not synced on its own: the commit's sync makes it durable with the
            # commit, and a power cut before that loses only a lock nobody was told about, as a
            # crash just before writing it would (store.base.SyncDeferral): one durable write
            start_seq = session.append([start_event], durable=False)
        except ConflictError as exc:
            session.refresh()
            raise SurfaceChangedError(f"another writer appended before the compaction could start: {exc}") from None
    try:
        meter = session.meter
        before = [_span_tokens(meter, surface, nodes) for nodes in resolved]  # 4
        render = render or (lambda summary, region: checkpoint_message(summary, strategy))
        replacements: list[tuple[Message | None, Summary | None]] = []
        for span, nodes, tokens in zip(spans, resolved, before, strict=True):
            if span.remove:
                replacements.append((None, None))
                continue
            summary = span.summary
            if isinstance(summary, str):
                summary = Summary(summary)
            message: Message | None = span.message
            if message is None:  # the region is built only for the hook and render that take it
                region = Region(tuple(nodes), tokens, strategy, kind)
                if summary is None:
                    summary = session.kernel.hooks.summarize(session, region)  # 5
                    if summary is None:
                        msg = f"no summarize implementation answered for strategy {strategy!r}"
                        raise CompactionError(msg)
                message = render(summary, region)
            replacements.append((message, summary))
        # 5b: the user's protected instructions this commit would take off the surface go,
        # verbatim, into its first replacement (instructions.py); the shrink check below judges
        # the strategy's own replacements, the kernel's block is bounded by the budget
        cites = [[n.seq for n in nodes] for nodes in resolved]  # per span, listed once
        cited = {seq for seqs in cites for seq in seqs}
        pinned_messages, pinned, carrier = (
            instructions.pin_lost(session, cited, [m for m, _ in replacements])
            if keep_instructions
            else ([m for m, _ in replacements], [], -1)
        )
        carried = pinned_messages[carrier] if pinned else None
        # the strategy's own replacement is counted for the shrink check and the span's record;
        # the carrier's count is taken with the block's, so its own count is needed only for
        # the check, and not even there when a bound without tokenising proves it shrinks
        strategy_after: list[int | None] = []
        for i, (m, _) in enumerate(replacements):
            if m is None:
                strategy_after.append(0)
            elif i == carrier and carried is not None and (not check_shrink or _shrinks_by_bound(meter, m, before[i])):
                strategy_after.append(None)
            else:
                strategy_after.append(meter.count_message(m))
        after = [0 if a is None else a for a in strategy_after]
        if carried is not None:
            own = replacements[carrier][0]
            replacements[carrier] = (carried, replacements[carrier][1])
            # only the carrier changed: counted from its parts (the block from the instructions'
            # own counts, the strategy's replacement from its count when it has one)
            known = strategy_after[carrier] if own is not None else None
            after[carrier] = instructions.carried_tokens(session, own, known, pinned)
        # 5c: the work ledger's entries no message left on the surface would show go, verbatim,
        # into the same replacement (ledger.py); bounded by its own budget, like the block above
        ledger_carrier, ledger_entries = -1, 0
        if keep_instructions:
            messages, ledger_carrier, ledger_entries = ledger.pin_lost(
                session, cited, [m for m, _ in replacements], carrier if pinned else -1
            )
            carried_by = messages[ledger_carrier] if ledger_carrier >= 0 else None
            if carried_by is not None:
                # the shrink check keeps judging the strategy's own replacement (strategy_after)
                replacements[ledger_carrier] = (carried_by, replacements[ledger_carrier][1])
                after[ledger_carrier] = meter.count_message(carried_by)
        if check_shrink:  # 6
            for i, (b, a) in enumerate(zip(before, strategy_after, strict=True)):
                if a is not None and a >= b:
                    msg = (
                        f"span {i} ({spans[i].start}..{spans[i].end}): the replacement costs {a} tokens, not "
                        f"fewer than the {b} it replaces; choose a larger span or a shorter summary"
                    )
                    raise ShrinkCheckError(msg)
        session.refresh()  # 7
        if lease is None and session.open_compaction is not None:
            raise _CompactionOpened
        if (lease is not None and lease.lost.is_set()) or (
            not single_batch
            and (session.open_compaction is None or session.open_compaction["compaction_id"] != compaction_id)
        ):
            msg = f"compaction {compaction_id}: its lease expired and another worker took it over; nothing committed"
            raise CompactionError(msg)
        if session.surface.version != version:
            msg = "the surface changed since the compaction started (another replacement landed)"
            raise SurfaceChangedError(msg)
        for i, (span, seqs) in enumerate(zip(spans, cites, strict=True)):
            try:
                now = [n.seq for n in session.surface.span(span.start, span.end)]
            except SurfaceError:
                now = []
            if now != seqs:
                msg = f"span {i} ({span.start}..{span.end}) changed on the surface since the compaction started"
                raise SurfaceChangedError(msg)
        batch: list[EventSpec] = [start_event] if single_batch else []  # 8
        batch.append(
            EventSpec(
                COMPACTION_SUMMARY,
                {
                    "compaction_id": compaction_id,
                    "strategy": strategy,
                    "kind": kind,
                    "summary": "\n\n".join(s.text for _, s in replacements if s is not None),
                    "cites": [seq for seqs in cites for seq in seqs],
                    "spans": [
                        {
                            "start": sp.start,
                            "end": sp.end,
                            "cites": list(seqs),  # the replacement's op holds its own list
                            "tokens_before": b,
                            "tokens_after": a,
                            "remove": sp.remove,
                            **(_model_record(s, strategy) if s and s.provider else {}),
                            **sp.data,
                        }
                        for sp, seqs, b, a, (_, s) in zip(spans, cites, before, after, replacements, strict=True)
                    ],
                    "tokens_before": sum(before),
                    "tokens_after": sum(after),
                    **({"instructions": {"pinned": [i.ref for i in pinned], "span": carrier}} if pinned else {}),
                    **({"ledger": {"entries": ledger_entries, "span": ledger_carrier}} if ledger_carrier >= 0 else {}),
                    **(data or {}),
                },
            )
        )
        parsed: dict[int, Message] = {}  # the kernel's own checkpoints, by batch index
        for i, (seqs, (message, _)) in enumerate(zip(cites, replacements, strict=True)):
            if message is None:
                batch.append(
                    EventSpec(SURFACE_DROP, {"strategy": strategy, "compaction_id": compaction_id}, remove_op(seqs))
                )
            else:
                kind_of = TOOL_RESULT if message.role == "tool" else USER_MESSAGE
                body = {"message": message.to_dict(), "compaction_id": compaction_id}
                if i in rendered and not (pinned and i == carrier) and i != ledger_carrier:
                    parsed[len(batch)] = message
                batch.append(EventSpec(kind_of, body, replace_op(seqs)))
        batch.append(EventSpec(COMPACTION_END, {"compaction_id": compaction_id}))
        first = session.append(batch, _parsed=parsed) + (1 if single_batch else 0)  # the summary's seq
    except BaseException as exc:
        if not single_batch:  # a single batch wrote nothing, so there is nothing to end
            _fail(session, compaction_id, exc)
        if isinstance(exc, ConflictError):
            raise SurfaceChangedError(f"another writer appended during the compaction: {exc}") from None
        raise
    results = []
    seq = first + 1
    uncounted = session.meter.uncounted_node  # a replacement lands uncounted: no surface lookup
    for seqs, b, a, (message, summary) in zip(cites, before, after, replacements, strict=True):
        results.append(SpanResult(list(seqs), None if message is None else seq, b, a, summary))
        node = uncounted(seq) if message is not None else None
        if node is not None and node.tokens is None and node.message == message:
            node.tokens = a  # counted above: the meter need not tokenise the replacement again
        seq += 1
    result = CommitResult(compaction_id, strategy, kind, results, start_seq, seq, dict(data or {}))
    session.kernel.hooks.commit(session, result)
    return result


def session_price(session: SessionPort) -> ModelPrice | None:
    """The prices the break-even rule weighs a session's edits with: a replay's (``simulate``),
    else the routed model's from the price table (with the profile's ``[prices]`` when given),
    else the profile's ``[prices]`` under automatic caching; None when none is known."""
    forced = price_in_force()
    if forced is not None:
        return forced
    route = session.route
    model = route["model"] if route else session.kernel.profile.model.name
    given = session.kernel.profile.prices
    try:
        price = price_for(model)
    except UnknownModelError:
        if given is None:
            return None
        price = ModelPrice(model, "openai", 1.0, 1.0, 1.0, 1.0, cache_increment=128, cache_mode="automatic")
    if given is not None:
        price = price.with_prices(given.input, given.cached_input, given.output)
    return price


def cache_decision(session: SessionPort, position: int, saved: int, *, clears: bool) -> Decision | None:
    """The break-even rule (:mod:`ctxkernel.cache_rule`) for an edit from surface ``position`` on
    that saves ``saved`` tokens; None when the rule is off or no price is known."""
    settings = session.kernel.profile.cache
    if settings.rule == "off":
        return None
    price = session_price(session)
    if price is None:
        return None
    prefix = session.sent_prefix
    previous = prefix.previous
    cached = previous is not None and previous.tokens >= price.cache_min_tokens
    rewritten = prefix.cached_from(position) if cached else 0
    pressure = session.pressure()
    overflow = pressure.tokens >= pressure.effective_window * (1 - settings.headroom_ratio)
    edit = Edit("clear" if clears else "compact", rewritten, saved)
    return decide(
        price, edit, remaining_steps=settings.remaining_steps, idle_seconds=prefix.idle_seconds(), overflow=overflow
    )


def cache_gate(session: SessionPort, position: int, saved: int, *, strategy: str, clears: bool) -> None:
    """Refuse (:class:`ctxkernel.CacheWaitError`, nothing written) an automatic edit the
    break-even rule says to wait with. The kernel's own bound (``strategy="kernel"``) is never
    refused: it keeps a request within the window."""
    if strategy == "kernel" or _asked_for(session, strategy):
        return
    decision = cache_decision(session, position, saved, clears=clears)
    if decision is not None and not decision.edits:
        log.info("edit waits for the prompt cache", session=session.id, strategy=strategy, reason=decision.reason)
        msg = f"strategy {strategy!r}: the edit waits: {decision.reason}"
        raise CacheWaitError(msg, decision)


def _asked_for(session: SessionPort, strategy: str) -> bool:
    """Whether the model called one of ``strategy``'s tools since the previous request: the edit
    carries out what the model asked for (a ``new_context`` switched at the next step)."""
    tools = session.tools
    for name in session.sent_prefix.calls_since():
        tool = tools.get(name)
        if tool is not None and tool.strategy == strategy:
            return True
    return False


def _gate_spans(session: SessionPort, spans: Sequence[Span], resolved: list[list[Node]], strategy: str) -> None:
    """Step 1b: the rule before anything is written or summarised, with what is known now: a
    summary is taken as free. It is not judged again once written: the call is paid by then, and
    throwing its summary away would waste it (measured: a second summary call on chat-short)."""
    meter, surface = session.meter, session.surface
    first = min(surface.position(nodes[0].seq) or 0 for nodes in resolved)
    saved = 0
    for span, nodes in zip(spans, resolved, strict=True):
        saved += _span_tokens(meter, surface, nodes)
        if span.message is not None and not span.remove:
            saved -= meter.count_message(span.message)
    clears = all(span.remove or span.message is not None for span in spans)
    cache_gate(session, first, saved, strategy=strategy, clears=clears)


def _model_record(summary: Summary, strategy: str) -> dict[str, Any]:
    """Who wrote a summary and at what cost, checked as a reply's are: a summarize hook is a plugin's code."""
    where = f"the summary for strategy {strategy!r}"
    for key in ("provider", "model"):
        value = getattr(summary, key)
        if not (value is None and key == "model") and not (isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS):
            msg = f"{where}: {key} must be a string of 1-{MAX_NAME_CHARS} characters, got {value!r:.80}"
            raise CompactionError(msg)
    try:
        usage = normalize_usage(summary.usage)
    except EventError as exc:
        raise CompactionError(f"{where}: {exc}") from None
    return {"provider": summary.provider, "model": summary.model, "usage": usage}


def _span_tokens(meter: Meter, surface: Surface, nodes: list[Node]) -> int:
    """The exact tokens of a span's nodes. A span that is the whole surface (a window switch, a
    handoff) costs the meter's surface total, which is exact and current (it counts only the nodes
    never counted before), instead of a sum over its ~200 nodes."""
    if nodes and len(nodes) == len(surface.nodes) and nodes[0] is surface.nodes[0] and nodes[-1] is surface.nodes[-1]:
        return int(meter.surface_tokens())
    return int(meter.nodes_tokens(nodes))


def _shrinks_by_bound(meter: Meter, message: Message, tokens_before: int) -> bool:
    """True when the meter's bound without tokenising (``Meter.message_at_most``) already shows
    ``message`` costs fewer tokens than ``tokens_before``."""
    bound = meter.message_at_most(message)
    return bound is not None and bound < tokens_before


#: attempts at writing a failed transaction's error end (step 9) before it is given up on
END_ATTEMPTS = 3


def _fail(session: SessionPort, compaction_id: str, exc: BaseException) -> None:
    """Step 9: write exactly one ``compaction/end {error}`` for a transaction that failed after
    its start was written. Never raises, so the caller re-raises the transaction's own error.

    Each of up to :data:`END_ATTEMPTS` attempts folds what other writers appended first, so a
    conflict with another writer or a passing store error is retried. When every attempt fails,
    the failure is logged as an error (the compaction, the transaction's error and the store's);
    the caller then gives the lease up, so the next transaction or opening of the session takes
    the compaction over and writes its end.
    """
    error = redact(f"{type(exc).__name__}: {exc}"[:4000])  # a summarizer's error may echo a key
    end_error: Exception | None = None
    for attempt in range(1, END_ATTEMPTS + 1):
        try:
            session.refresh()
            if session.open_compaction is None or session.open_compaction["compaction_id"] != compaction_id:
                return  # already ended (an earlier attempt's write landed before its error was raised)
            session.append_one(COMPACTION_END, {"compaction_id": compaction_id, "error": error[:2000]})
            return
        except Exception as exc_end:  # a store error of any kind: retried, then logged
            end_error = exc_end
            log.warning(
                "compaction end not written",
                session=session.id,
                compaction_id=compaction_id,
                attempt=attempt,
                error=f"{type(exc_end).__name__}: {exc_end}",
            )
    log.error(
        "compaction end could not be written; the next compaction or opening of this session ends it",
        session=session.id,
        compaction_id=compaction_id,
        error=error,
        end_error=f"{type(end_error).__name__}: {end_error}",
        attempts=END_ATTEMPTS,
    )


__all__ = [
    "CHECKPOINT_CLOSE",
    "CHECKPOINT_OPEN",
    "END_ATTEMPTS",
    "SUMMARY_SECTIONS",
    "CommitResult",
    "Region",
    "Render",
    "Span",
    "SpanResult",
    "Summary",
    "balanced_cut_at_or_before",
    "checkpoint_message",
    "head_region",
    "run_transaction",
    "validate_spans",
    "whole_surface_but_last",
]
