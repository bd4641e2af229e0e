"""The compaction transaction (docs/design/host-model.md §3) and the helpers that choose balanced regions.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import instructions
from .errors import (
    CompactionError,
    ConflictError,
    ShrinkCheckError,
    SurfaceChangedError,
    SurfaceError,
    UnbalancedCutError,
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
from .messages import Message, Source
from .redact import redact

if TYPE_CHECKING:
    from .session import Session
    from .surface import Node, Surface

log = get_logger("ctxkernel.compaction")

CHECKPOINT_OPEN = "<context-checkpoint>"
CHECKPOINT_CLOSE = "</context-checkpoint>"

#: the eight headings of a summary, in order: the built-in ``basic`` directive and extractive
#: summary and the handoff strategy both use them, so a summary from either reads the same
SUMMARY_SECTIONS: tuple[str, ...] = (
    "Primary Request and Intent",
    "Key Technical Concepts",
    "Files and Code",
    "Errors and Fixes",
    "Pending Jobs",
    "Current Work",
    "Next Step",
    "Critical Context",
)


@dataclass(frozen=True)
class Summary:
    """A summary and, when a model wrote it, who and at what cost."""

    text: str
    provider: str | None = None
    model: str | None = None
    usage: dict[str, int] | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Region:
    """A contiguous run of surface nodes handed to ``summarize``."""

    nodes: tuple[Node, ...]
    tokens: int
    strategy: str
    kind: str

    @property
    def seqs(self) -> list[int]:
        return [n.seq for n in self.nodes]

    @property
    def messages(self) -> list[Message]:
        return [n.message for n in self.nodes]


@dataclass
class Span:
    """One range a transaction replaces (``start``..``end`` are surface node seqs).

    Give ``message`` for an exact replacement, or ``summary`` text to be wrapped by the
    transaction's ``render``; with neither, the ``summarize`` hook writes it. A span of one tool
    result whose ``message`` is a tool message rewrites that result's content in place (same call
    id, name and error flag), keeping its pairing. ``remove`` drops
    the range with no replacement (a cited ``surface/drop``).
    """

    start: int
    end: int
    summary: str | Summary | None = None
    message: Message | None = None
    remove: bool = False
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanResult:
    cites: list[int]
    replacement_seq: int | None
    tokens_before: int
    tokens_after: int
    summary: Summary | None


@dataclass(frozen=True)
class CommitResult:
    """What a committed transaction did (passed to the ``commit`` hook)."""

    compaction_id: str
    strategy: str
    kind: str
    spans: list[SpanResult]
    start_seq: int
    end_seq: int
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_before(self) -> int:
        return sum(s.tokens_before for s in self.spans)

    @property
    def tokens_after(self) -> int:
        return sum(s.tokens_after for s in self.spans)

    @property
    def cites(self) -> list[int]:
        return [c for s in self.spans for c in s.cites]


def checkpoint_message(summary: Summary | str, strategy: str, form: str = "checkpoint") -> Message:
    """The default replacement: the summary in a marked block, written as a plugin message."""
    text = summary.text if isinstance(summary, Summary) else summary
    return Message.user(f"{CHECKPOINT_OPEN}\n{text.strip()}\n{CHECKPOINT_CLOSE}", Source.plugin_form(strategy, form))


Render = Callable[[Summary, "Region"], Message]


def validate_spans(surface: Surface, spans: Sequence[Span]) -> list[list[Node]]:
    """Step 1: every span on the surface, balanced, not overlapping. Nothing is written."""
    if not spans:
        msg = "a compaction needs at least one span"
        raise CompactionError(msg)
    taken: list[tuple[int, int, int]] = []  # (first, last position, span index) of each span so far
    resolved = []
    for i, span in enumerate(spans):
        try:
            nodes = surface.span(span.start, span.end)
        except SurfaceError as exc:
            raise CompactionError(f"span {i} ({span.start}..{span.end}): {exc}") from None
        if span.message is not None and span.message.role == "tool" and not _is_result_rewrite(span, nodes):
            msg = f"span {i} ({span.start}..{span.end}): a tool message can replace only one tool result"
            raise CompactionError(msg)
        if _is_result_rewrite(span, nodes):
            # a content-only replacement of one tool result keeps its pairing (the surface checks
            # that the call id, name and error flag are unchanged), so it is not a cut at all
            pass
        else:
            try:
                surface.check_range_closed(nodes)
            except SurfaceError as exc:
                raise UnbalancedCutError(f"span {i} ({span.start}..{span.end}) is not a balanced cut: {exc}") from None
        # a span is a run of positions: two overlap where their runs do (first shared node named)
        first = surface.position(nodes[0].seq)
        assert first is not None  # surface.span found it
        last = first + len(nodes) - 1
        shared = [(max(first, a), j) for a, b, j in taken if a <= last and first <= b]
        if shared:
            position, j = min(shared)
            msg = f"span {i} ({span.start}..{span.end}) overlaps span {j} at seq {surface.nodes[position].seq}"
            raise CompactionError(msg)
        taken.append((first, last, i))
        if span.remove and (span.message is not None or span.summary is not None):
            msg = f"span {i}: a removal carries no summary or message"
            raise CompactionError(msg)
        resolved.append(nodes)
    return resolved


def _is_result_rewrite(span: Span, nodes: list[Node]) -> bool:
    """True for a span that replaces one tool result with a tool message (new content only)."""
    return len(nodes) == 1 and nodes[0].role == "tool" and span.message is not None and span.message.role == "tool"


def open_compaction(session: Session) -> dict[str, Any] | None:
    """The unmatched ``compaction/start`` data (with its seq), or None."""
    return session.open_compaction


def run_transaction(
    session: Session,
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
    session: Session,
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


def _run_steps(
    session: Session,
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
                            **(
                                {"provider": s.provider, "model": s.model, "usage": s.usage} if s and s.provider else {}
                            ),
                            **sp.data,
                        }
                        for sp, seqs, b, a, (_, s) in zip(spans, cites, before, after, replacements, strict=True)
                    ],
                    "tokens_before": sum(before),
                    "tokens_after": sum(after),
                    **({"instructions": {"pinned": [i.ref for i in pinned], "span": carrier}} if pinned else {}),
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
                if i in rendered and not (pinned and i == carrier):
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


def _span_tokens(meter: Any, surface: Surface, nodes: list[Node]) -> int:
    """The exact tokens of a span's nodes. A span that is the whole surface (a window switch, a
    handoff) costs the meter's surface total, which is exact and current (it counts only the nodes
    never counted before), instead of a sum over its ~200 nodes."""
    if nodes and len(nodes) == len(surface.nodes) and nodes[0] is surface.nodes[0] and nodes[-1] is surface.nodes[-1]:
        return int(meter.surface_tokens())
    return int(meter.nodes_tokens(nodes))


def _shrinks_by_bound(meter: Any, message: Message, tokens_before: int) -> bool:
    """True when the meter's bound without tokenising (``Meter.message_at_most``) already shows
    ``message`` costs fewer tokens than ``tokens_before``."""
    bound = meter.message_at_most(message)
    return bound is not None and bound < tokens_before


#: attempts at writing a failed transaction's error end (step 9) before it is given up on
END_ATTEMPTS = 3


def _fail(session: Session, compaction_id: str, exc: BaseException) -> None:
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
        except Exception as exc_end:  # noqa: BLE001 - a store error of any kind: retried, then logged
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


# -- region selection helpers ---------------------------------------------------------------------
def balanced_cut_at_or_before(surface: Surface, position: int) -> int:
    """The largest balanced cut position ``<= position`` (0 is always balanced)."""
    position = min(max(position, 0), len(surface.nodes))
    while position > 0 and not surface.is_balanced_cut(position):
        position -= 1
    return position


def head_region(surface: Surface, meter: Any, keep_tokens: int, *, min_nodes: int = 1) -> tuple[int, int] | None:
    """The range from the surface head up to a balanced cut that keeps at least ``keep_tokens``
    of the newest nodes verbatim (the cut moves toward the head until it is balanced).

    Returns ``(start_seq, end_seq)``, or None when nothing can be compacted.
    """
    nodes = surface.nodes
    kept = 0
    cut = len(nodes)
    while cut > 0 and kept < keep_tokens:
        cut -= 1
        kept += meter.node_tokens(nodes[cut])
    cut = balanced_cut_at_or_before(surface, cut)
    if cut < min_nodes:
        return None
    return nodes[0].seq, nodes[cut - 1].seq


def whole_surface_but_last(surface: Surface, keep_last: int = 1) -> tuple[int, int] | None:
    """Everything but the last ``keep_last`` nodes, moved to a balanced cut."""
    cut = balanced_cut_at_or_before(surface, len(surface.nodes) - keep_last)
    if cut < 1:
        return None
    return surface.nodes[0].seq, surface.nodes[cut - 1].seq
