"""The window switch: one switch, four entry points.

``new_context`` (requested, switched at the next step boundary), the pressure threshold, a manual
:func:`compact_now` and a provider context overflow all end in :func:`switch`, one compaction
transaction of kind ``window`` whose replacement is the bounded handoff. Pressure keeps the
latest ``retain_ratio`` of the window verbatim; the other three keep only the last message (moved
to a balanced cut, so a tool call and its results stay together). The window number is derived
from committed ``compaction/summary`` events, so it advances only when the replacement commits:
failure, cancellation and "nothing to compact" never report a switch.

The threshold, the retained tail and ``auto`` are the host's settings (the ``basic`` strategy's
``threshold_ratio``, ``retain_ratio``, ``auto``), which this strategy does not change. With the
strategy off for a model (``native``), or its tools off, compaction is left to ``basic``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxkernel import (
    CompactionError,
    CtxKernelError,
    Span,
    StrategyNotes,
    ToolError,
    get_logger,
    head_region,
    whole_surface_but_last,
)
from ctxkernel.events import ASSISTANT_MESSAGE, COMPACTION_SUMMARY, REQUEST_HEADER, STEP_START, USER_MESSAGE, utc_now
from ctxkernel.events import original_seq as original_item
from ctxkernel.recall.history import WINDOW_KINDS
from ctxkernel.text import first_line

from .excerpts import Excerpts
from .handoff import (
    HANDOFF_LOG_NOTE,
    HANDOFF_NOTE,
    MIN_GENERATED_BODY,
    Generated,
    Handoff,
    assemble,
    call_summarizer,
    frame,
    handoff_tokens,
)
from .settings import HandoffSettings
from .strategy import NAME, STRATEGY

if TYPE_CHECKING:
    from ctxkernel import CommitResult, Context, Node, Region, Summary

log = get_logger("ctxkernel.handoff")

#: host defaults when the ``basic`` strategy is not loaded (DSH's defaults)
HOST_THRESHOLD = 0.8
HOST_RETAIN = 0.16
#: the single-shot pressure reminder fires this far below the switch threshold
REMINDER_LEAD = 0.1
REMINDER_TAG = "[handoff: context pressure]"
#: and only once the window has grown by this share of the effective window since it opened
REMINDER_GROWTH = 0.05
#: a handoff should cost well under what it replaces: characters allowed per token of the region
CHARS_PER_REGION_TOKEN = 2.5
#: and at most ``handoff_max_ratio`` of the effective window (about 3.5 characters per token)
CHARS_PER_TOKEN = 3.5
#: characters of the handoff's own wrapping around snapshot, notes and body
WRAPPER_CHARS = 300
#: the new window opens at least this far below the threshold, whatever the kept tail (the
#: stated share, ``switch_free_ratio``, is what a switch aims for)
TARGET_MARGIN = 0.05
#: characters per token assumed when fitting the handoff under the threshold (conservative)
CHARS_PER_FIT_TOKEN = 3.0
#: the smallest handoff worth a switch
MIN_HANDOFF_CHARS = 600


@dataclass(frozen=True)
class Mode:
    """What the strategy does for a session's current model."""

    enabled: bool
    tools: bool  # the ten tools are registered
    window: bool  # new_context switches windows
    auto: bool  # pressure, manual and overflow compactions switch windows
    why: str = ""  # why window switching is off, when it is


@dataclass
class HandoffState:
    """Per-session state, rebuilt from the log (the pending request is transient by design)."""

    cursor: int = 0
    header_seq: int | None = None
    reminded_window: int = 0  # window in which the pressure reminder was shown
    last_assistant: int = -1
    requested: dict[str, Any] | None = None  # never durable: not re-executed after a restart
    overflow_at: int | None = None  # assistant count when the last overflow was handled
    steward_window: int = 0  # window in which the simulation steward last acted
    window_open_ratio: dict[int, float] = field(default_factory=dict)  # pressure when first seen, by window
    generation: int = -1
    switches: int = 0
    last_switch: dict[str, Any] | None = None
    #: steps started since the last committed window switch (None: no switch yet)
    steps_since_switch: int | None = None
    #: the receipt of each of the newest RECEIPTS_KEPT window-opening commits, by the seq of its
    #: compaction/summary: the inspector's window list shows them without reading old events back
    receipts: dict[int, dict[str, Any]] = field(default_factory=dict)
    last_failure: str | None = None
    plan: SwitchPlan | None = None  # the switch in progress (within one transaction)
    excerpts: Excerpts = field(default_factory=Excerpts)  # each surface node's excerpt, rendered once
    excerpted: int = -1  # the seq warm_excerpts renders from next (-1: this process has not started)


@dataclass
class SwitchOutcome:
    committed: bool
    reason: str
    window: int | None = None
    detail: str = ""
    result: CommitResult | None = None
    record: dict[str, Any] = field(default_factory=dict)


def settings_of(ctx: Context) -> HandoffSettings:
    return STRATEGY.on(ctx).settings


def mode_for(ctx: Context) -> Mode:
    if not STRATEGY.on(ctx).enabled:
        return Mode(False, False, False, False, "the handoff strategy is disabled")
    settings = settings_of(ctx)
    if not settings.enabled:
        return Mode(False, False, False, False, "[strategies.handoff] enabled = false")
    if not settings.inject_tools:
        return Mode(True, False, False, False, "inject_tools = false: compaction uses native summaries")
    route = ctx.route or {}
    model = STRATEGY.on(ctx).model
    strategy = settings.strategy_for(route.get("provider", model.provider), route.get("model", model.name))
    if strategy == "native":
        return Mode(True, True, False, False, f"model {model.provider}/{model.name} uses the native strategy")
    return Mode(
        True,
        True,
        True,
        settings.override_compaction,
        "" if settings.override_compaction else "override_compaction = false",
    )


def host_settings(ctx: Context) -> tuple[float, float, bool]:
    """The host's threshold_ratio, retain_ratio and auto (from ``basic`` when it is loaded)."""
    basic: Any = STRATEGY.on(ctx).peer_settings("basic")
    if basic is not None:
        return basic.threshold_ratio, basic.retain_ratio, basic.auto
    return HOST_THRESHOLD, HOST_RETAIN, True


#: the format of :func:`folded_state` in session snapshots: bump it whenever that shape changes,
#: so a snapshot written by an older plugin is folded from the start of the log
STATE_VERSION = 3
#: the fields of :class:`HandoffState` the fold of the log derives (the rest is this process's)
FOLDED = ("cursor", "header_seq", "reminded_window", "last_assistant", "last_switch", "receipts", "steps_since_switch")
#: window receipts kept in the state (the inspector lists as many windows, the newest)
RECEIPTS_KEPT = 100


def window_receipt(data: dict[str, Any]) -> dict[str, Any]:
    """What the inspector shows of the commit that opened a window (its compaction/summary data)."""
    return {
        "tokens_before": data.get("tokens_before"),
        "tokens_after": data.get("tokens_after"),
        **(data.get("window_record") or {}),
    }


def folded_state(ctx: Context) -> dict[str, Any]:
    """What the fold of the log derives, as plain JSON, for the session's snapshot."""
    state = state_for(ctx)
    folded = {name: getattr(state, name) for name in FOLDED}
    folded["receipts"] = [[seq, receipt] for seq, receipt in state.receipts.items()]  # JSON keys are strings
    return folded


def _from_folded(data: dict[str, Any], log_length: int) -> HandoffState:
    cursor, header, reminded, assistant, last, receipts, since = (data[name] for name in FOLDED)
    if type(cursor) is not int or not 0 < cursor <= log_length:
        msg = f"cursor {cursor!r} is outside the log (length {log_length})"
        raise ValueError(msg)
    if not (header is None or type(header) is int) or type(reminded) is not int or type(assistant) is not int:
        msg = "header_seq, reminded_window and last_assistant must be integers"
        raise ValueError(msg)
    if not (last is None or isinstance(last, dict)):
        msg = "last_switch must be an object or null"
        raise ValueError(msg)
    if not (since is None or (type(since) is int and 0 <= since <= log_length)):
        msg = "steps_since_switch must be a count of steps within the log, or null"
        raise ValueError(msg)
    if not isinstance(receipts, list) or len(receipts) > RECEIPTS_KEPT:
        msg = f"receipts must be a list of at most {RECEIPTS_KEPT} [seq, receipt] pairs"
        raise ValueError(msg)
    by_seq: dict[int, dict[str, Any]] = {}
    for pair in receipts:
        if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and isinstance(pair[1], dict)):
            msg = "each receipt must be a [seq, object] pair"
            raise ValueError(msg)
        if not 0 <= pair[0] < cursor:
            msg = f"receipt seq {pair[0]} is outside the folded log (cursor {cursor})"
            raise ValueError(msg)
        by_seq[pair[0]] = pair[1]
    return HandoffState(
        cursor=cursor,
        header_seq=header,
        reminded_window=reminded,
        last_assistant=assistant,
        last_switch=last,
        receipts=by_seq,
        steps_since_switch=since,
    )


def state_for(ctx: Context) -> HandoffState:
    """The session's handoff state, folded up to date with the log (opened from a session snapshot
    holding it: from there, so an open folds only the tail)."""
    handoff = STRATEGY.on(ctx)
    holder = handoff.state
    state = holder.get("state")
    if not isinstance(state, HandoffState):
        restored = handoff.restored(version=STATE_VERSION, load=lambda data: _from_folded(data, len(ctx.events)))
        state = holder["state"] = restored or HandoffState()
    events = ctx.events
    history = None
    for event in events[state.cursor :]:
        if event.type == REQUEST_HEADER:
            state.header_seq = event.seq
        elif event.type == STEP_START:
            if state.steps_since_switch is not None:
                state.steps_since_switch += 1
        elif event.type == ASSISTANT_MESSAGE:
            state.last_assistant = event.seq
        elif event.type == COMPACTION_SUMMARY and event.data.get("kind") in WINDOW_KINDS:
            state.receipts[event.seq] = window_receipt(event.data)
            if len(state.receipts) > RECEIPTS_KEPT:
                del state.receipts[next(iter(state.receipts))]  # the oldest (seqs fold in order)
            if event.data.get("strategy") == NAME and event.data.get("kind") == "window":
                state.steps_since_switch = 0
                # the panel's last switch comes from the log, so a reopened session shows the same
                history = history or STRATEGY.on(ctx).history()
                record = dict(event.data.get("window_record") or {})
                state.last_switch = {
                    "window": history.window_of(event.seq + 1),
                    "reason": event.data.get("reason"),
                    **record,
                }
        elif event.type == USER_MESSAGE:
            source = event.data["message"].get("source") or {}
            if source.get("plugin") == NAME and source.get("form") == "notice":
                text = "".join(b.get("text", "") for b in event.data["message"].get("content", ()))
                if text.startswith(REMINDER_TAG):
                    history = history or STRATEGY.on(ctx).history()
                    state.reminded_window = history.window_of(event.seq)
    state.cursor = len(events)
    return state


def request_header(ctx: Context, state: HandoffState) -> tuple[str, list[Any]]:
    """System prompt and tools of the last request (what the summarizer call is prefixed with)."""
    if state.header_seq is not None:
        data = ctx.events[state.header_seq].data
        return data["system"], data["tools"]
    return STRATEGY.on(ctx).base_system_prompt, []


def notes_of(ctx: Context) -> StrategyNotes:
    """The session's notes, writes signed by handoff, stamped with the current window."""
    handoff = STRATEGY.on(ctx)
    notes = handoff.notes()
    notes.current_window = f"win_{handoff.history().current_window.number}"
    return notes


# -- the switch --------------------------------------------------------------------------------------------
def outside_surface(ctx: Context) -> int:
    """What no switch can remove: the request header (with the tools the first switch brings),
    decorations and the gap between the provider's last reported usage and our estimate."""
    return ctx.pressure().tokens - ctx.meter.surface_tokens() + STRATEGY.on(ctx).header_growth()


def no_room(ctx: Context, fixed: int | None = None) -> str | None:
    """Why no new window can open below the threshold, whatever it replaced; None when one can.
    ``fixed``: :func:`outside_surface`, when the caller has it. When that alone leaves no room, a
    switch could only fail its fit after shrinking kept results for nothing (basic then compacts
    once and backs off; an overflow still tries a switch), and a reminder to call ``new_context``
    would only cost tokens (a 4,000-token window whose request header is over the target)."""
    threshold, _, _ = host_settings(ctx)
    target = int((threshold - TARGET_MARGIN) * ctx.model.effective_window)
    pressure = ctx.pressure()
    fixed = outside_surface(ctx) if fixed is None else fixed
    if fixed + int(MIN_HANDOFF_CHARS / CHARS_PER_FIT_TOKEN) <= target:
        return None
    return (
        f"no room for a new window: {fixed} of the {pressure.tokens} tokens are outside the surface (request "
        f"header{', and the provider-reported usage above our estimate' if pressure.anchored else ''}), over the "
        f"{target}-token target below the threshold"
    )


def switch(ctx: Context, *, reason: str, keep_tokens: int | None = None) -> SwitchOutcome:
    """Switch to a new window now. ``keep_tokens`` keeps that much of the newest surface verbatim
    (the pressure path); None keeps only the last message. Never raises for an ordinary failure."""
    ctx.refresh()
    state = state_for(ctx)
    opened_at = ctx.pressure().ratio
    history = STRATEGY.on(ctx).history()
    surface = ctx.surface
    settings = settings_of(ctx)
    effective = ctx.model.effective_window
    # the new window must open below the threshold, or every step would switch again: the handoff
    # may take what the kept tail and the request header leave under it
    threshold, _, _ = host_settings(ctx)
    target = int((threshold - TARGET_MARGIN) * effective)
    # where the switch aims: the stated share of the window below the threshold, so the next
    # switch is that much growth away (a switch that frees a few tokens switches again next step)
    aim = min(target, int(max(threshold - settings.switch_free_ratio, 0.0) * effective))
    if keep_tokens is not None:
        fixed = outside_surface(ctx)
        blocked = no_room(ctx, fixed)
        if blocked is not None:
            return _failed(state, reason, blocked)
        # the verbatim tail gives way to the aim (head_region still keeps the newest call whole)
        keep_tokens = min(keep_tokens, max(0, aim - fixed - int(MIN_HANDOFF_CHARS / CHARS_PER_FIT_TOKEN)))
    for attempt in range(2):
        if keep_tokens is None:
            region = whole_surface_but_last(surface, 1)
        else:
            region = head_region(surface, ctx.meter, keep_tokens, min_nodes=2)
        if region is None:
            return _failed(state, reason, "nothing to compact: no balanced cut leaves anything to replace")
        nodes = surface.span(*region)
        region_tokens = tokens_of_span(ctx, nodes)
        # the user's instructions the kernel keeps through the switch stay in the new window too, and what
        # stays outside the surface (counted again: a shrunk result above may have brought the tools)
        pinned = STRATEGY.on(ctx).pinned_instructions_tokens(*region)
        rest = outside_surface(ctx) + ctx.meter.surface_tokens() - region_tokens + pinned
        deficit = rest + int(MIN_HANDOFF_CHARS / CHARS_PER_FIT_TOKEN) - target
        if attempt or deficit <= 0 or not shrink_kept_results(ctx, after=nodes[-1].seq, tokens=deficit):
            break
    bound = min(
        settings.handoff_max_chars,
        int(region_tokens * CHARS_PER_REGION_TOKEN),
        int(effective * settings.handoff_max_ratio * CHARS_PER_TOKEN),
    )
    budget = min(bound, int((aim - rest) * CHARS_PER_FIT_TOKEN))
    if budget >= MIN_HANDOFF_CHARS:
        target = aim
    else:
        # the kept tail (the newest call and its results) is too large to reach the aim: free
        # what can be freed, still below the threshold
        budget = min(bound, int((target - rest) * CHARS_PER_FIT_TOKEN))
    if budget < MIN_HANDOFF_CHARS:
        return _failed(
            state,
            reason,
            f"nothing to compact: replacing {region_tokens} tokens leaves no room for a handoff under the threshold "
            f"({rest} tokens stay: request header and the kept messages)",
        )
    new_window = history.current_window.number + 1
    # the pressure the switch relieved (a threshold switch inside min_switch_interval_steps: >= 1)
    record: dict[str, Any] = {"window": new_window, "reason": reason, "pressure_ratio": round(opened_at, 4)}
    assert region is not None  # every pass of the loop above returned when it found no region
    plan = state.plan = SwitchPlan(reason, budget, region_tokens, rest, target, record, settings)
    try:
        if builds_up_front(ctx, settings):
            # no model call: the handoff and its notes are built before the transaction and
            # committed in one durable write (the lock in the same batch as the commit)
            summary = compose(ctx, plan, nodes)
            assert plan.handoff is not None
            span = Span(region[0], region[1], summary=summary, message=plan.handoff.message())
            result = STRATEGY.on(ctx).compact(
                span, kind="window", data=record, single_batch=True, check_shrink=not plan.shrinks
            )
        else:
            # generated: the summarize hook builds the handoff inside the transaction, so the
            # summary call runs under the compaction lock, and a cancellation during it ends the
            # transaction with its error end: nothing switches, no note is written
            result = STRATEGY.on(ctx).compact(
                Span(region[0], region[1]),
                kind="window",
                data=record,
                render=lambda summary, region_: plan.handoff.message(),  # type: ignore[union-attr]
            )
    except CompactionError as exc:
        return _failed(state, reason, f"{type(exc).__name__}: {exc}", record=record)
    finally:
        state.plan = None
    state.requested = None
    return SwitchOutcome(True, reason, new_window, "", result, record)


def tokens_of_span(ctx: Context, nodes: list[Node]) -> int:
    """Exactly the tokens of ``nodes`` (a run of the surface), counting over the fewer nodes: the
    surface's total (the meter keeps it) less the nodes outside a region that holds most of it
    (a switch that keeps the last message replaces all the others)."""
    meter, surface = ctx.meter, ctx.surface.nodes
    outside = len(surface) - len(nodes)
    if outside >= len(nodes):
        return sum(meter.node_tokens(n) for n in nodes)
    start = ctx.surface.position(nodes[0].seq) or 0
    others = [*surface[:start], *surface[start + len(nodes) :]]
    return meter.surface_tokens() - sum(meter.node_tokens(n) for n in others)


@dataclass
class SwitchPlan:
    """What :func:`switch` decided, for the summarize hook that builds the handoff."""

    reason: str
    budget: int
    region_tokens: int
    rest: int  # tokens that stay: request header and the kept messages
    target: int  # the new window must open at or below this many tokens
    record: dict[str, Any]  # the compaction/summary data; the hook adds the window record
    #: the strategy's settings as the switch read them (one look-up per switch: each is a
    #: validation cache's and the model's settings' look-up, ~10 µs)
    settings: HandoffSettings
    handoff: Handoff | None = None
    #: the handoff built costs fewer tokens than the region (an exact count): the transaction's
    #: shrink check would count it again only to find the same
    shrinks: bool = False


def build_handoff(ctx: Context, region: Region) -> Summary:
    """The ``summarize`` hook's answer for a generated window switch (see :func:`compose`)."""
    plan = state_for(ctx).plan
    if plan is None:
        msg = "a handoff window switch must be started by ctxkernel_handoff.switch(); no switch is planned"
        raise CompactionError(msg)
    return compose(ctx, plan, list(region.nodes))


def compose(ctx: Context, plan: SwitchPlan, nodes: list[Node]) -> Summary:
    """Build the handoff of ``plan`` for the outgoing ``nodes`` (one summarizer call when
    generated), fitted under the threshold; stage its notes in the commit's data and return what
    compaction/summary records."""
    state = state_for(ctx)
    history = STRATEGY.on(ctx).history()
    settings = plan.settings
    session_notes = notes_of(ctx)
    notes = session_notes.active()
    mode = settings.handoff_summary
    budget = plan.budget
    generated: Generated | None = None
    discarded = None
    if mode == "generated":
        # the call is made only when the budget can carry a usable generated body: price the
        # mandatory snapshot and the note previews first
        fixed = frame(history, notes, budget=budget, reason=plan.reason)
        room = budget - len(fixed.snapshot) - len(fixed.notes) - WRAPPER_CHARS
        if room >= MIN_GENERATED_BODY:
            generated = call_summarizer(ctx, nodes, room, request_header(ctx, state))
        else:
            discarded = "budget"
    handoff: Handoff | None = None
    for _ in range(3):
        handoff = assemble(
            history,
            nodes,
            notes,
            budget=budget,
            mode=mode,
            reason=plan.reason,
            generated=generated,
            discarded=discarded,
            excerpts=state.excerpts,
        )
        if len(handoff.text) > settings.handoff_max_chars:
            msg = (
                f"the handoff needs {len(handoff.text)} characters, over handoff_max_chars {settings.handoff_max_chars}"
            )
            raise CompactionError(msg)
        # exact, from the lines counted as their excerpts were rendered (only the rest is tokenised)
        tokens = handoff_tokens(ctx, handoff)
        plan.shrinks = tokens < plan.region_tokens
        if plan.shrinks and plan.rest + tokens <= plan.target:
            break
        budget = int(budget * min(0.9, min(plan.region_tokens, max(1, plan.target - plan.rest)) / max(tokens, 1) * 0.9))
        if budget < MIN_HANDOFF_CHARS:
            break
    assert handoff is not None
    plan.handoff = handoff
    plan.record["window_record"] = {
        **handoff.record,
        "region_tokens": plan.region_tokens,
        "region_items": [f"item_{nodes[0].seq}", f"item_{nodes[-1].seq}"],
    }
    plan.record.update(stage_notes(ctx, plan, handoff, session_notes))
    return handoff.summary


def stage_notes(ctx: Context, plan: SwitchPlan, handoff: Handoff, notes: StrategyNotes) -> dict[str, Any]:
    """The seed's two notes of a committed switch, staged to ride in its commit (the data to merge
    into compaction/summary): ``handoff.md`` replaced with the full unclipped handoff (a generated
    one: the summarizer's raw reply), one line added to ``handoff-log.md``. They land exactly when
    the switch does, in its one durable write; a note the notes limits refuse is logged and left
    out, never blocking the switch. ``notes``: the session's, as :func:`notes_of` gives them."""
    window = f"win_{plan.record['window']}"
    full = handoff.full
    limit = notes.limits.max_note_bytes
    # UTF-8 takes at most 4 bytes a character: a handoff far under the limit is not encoded to know
    fits = len(full) * 4 <= limit or len(full.encode()) <= limit
    body = full if fits else full.encode()[: limit - 64].decode(errors="ignore") + "\n… [clipped to the note limit]"
    first = leading_line(full)[:200]  # the first line that is not blank
    now = utc_now()  # the replay clock in a simulation
    line = f"- {window} {now} reason={plan.reason} summary=win_{plan.record['window'] - 1}_summary {first}\n"
    trust = "model-authored" if handoff.record.get("handoff_summary") == "generated" else "tool-output"
    staged = notes.staged()
    stages: tuple[tuple[str, Callable[[], object]], ...] = (
        (HANDOFF_NOTE, lambda: staged.write(HANDOFF_NOTE, body, trust=trust, window=window)),
        (HANDOFF_LOG_NOTE, lambda: staged.append(HANDOFF_LOG_NOTE, line, trust="tool-output", window=window)),
    )
    for path, stage in stages:
        try:
            stage()
        except Exception as exc:  # a note that cannot be written never blocks the switch
            log.warning("handoff note not written", session=ctx.id, path=path, error=f"{type(exc).__name__}: {exc}")
    return staged.data


#: characters :func:`leading_line` looks at before it splits the whole text
LEADING_CHARS = 1_024


def leading_line(text: str) -> str:
    """``first_line(text).strip()``, splitting only the text's start when the first line ends
    there (a 16 KB handoff was stripped and split into its ~470 lines for its first)."""
    start = text.lstrip()[:LEADING_CHARS]
    lines = start.splitlines()
    # a second line means the first one ended inside ``start``: stripping the whole text's end
    # can take only white space from it (when all after it is blank), which strip() takes too
    return lines[0].strip() if len(lines) > 1 else first_line(text).strip()


def builds_up_front(ctx: Context, settings: HandoffSettings | None = None) -> bool:
    """True when a switch makes no model call (``extractive``, or ``generated`` with no summarizer
    configured, which falls back to extractive): its handoff is then built before the transaction.
    ``settings``: the strategy's, when the caller has them already."""
    settings = settings if settings is not None else settings_of(ctx)
    return settings.handoff_summary == "extractive" or STRATEGY.on(ctx).summarizer is None


#: a process whose first step finds at most this many surface nodes renders them at that step
FRESH_WINDOW_NODES = 16


def warm_excerpts(ctx: Context, state: HandoffState) -> None:
    """Render the excerpts of the surface nodes appended since the last step (a few per step), so
    a switch assembles its extractive body instead of rendering its whole window, and add them to
    the body's material (:class:`~ctxkernel_handoff.handoff.Material`). A process starts at the
    log's end (an open costs nothing here) unless its window has just begun (a new session: its
    first few nodes are rendered now, so the material starts with them); what it lacks is rendered
    at its first switch."""
    events = ctx.events
    if state.excerpted < 0:
        surface = ctx.surface
        if len(surface) > FRESH_WINDOW_NODES:
            state.excerpted = len(events)
            return
        state.excerpted = min((node.seq for node in surface), default=len(events))
    if state.excerpted >= len(events):
        return
    history = STRATEGY.on(ctx).history()
    surface = ctx.surface
    for seq in range(state.excerpted, len(events)):
        node = surface.node(seq)
        if node is not None:
            state.excerpts.of(history, node, ctx.meter)
    state.excerpted = len(events)
    if len(state.excerpts) > 2 * len(surface) + 256:  # nodes replaced since (shrunk results, native summaries)
        state.excerpts.prune(lambda seq: surface.node(seq) is not None)
    state.excerpts.extend(surface.nodes)  # the body's material: the nodes just rendered


#: a kept tool result smaller than this is never shrunk
SHRINK_MIN_CHARS = 2_000


def shrink_kept_results(ctx: Context, *, after: int, tokens: int) -> bool:
    """Shrink the largest visible tool results after seq ``after`` (the kept tail) model-free until
    about ``tokens`` are freed: head and tail kept, a marker naming the item that holds the full
    text (the log keeps it; ``history_read_item`` reads it). True when anything shrank.

    Used only when the kept tail alone would leave no room under the threshold (a small window and a
    large result), where the alternative is a context overflow.
    """
    position = ctx.surface.position(after)
    kept = ctx.surface.nodes[(position + 1 if position is not None else 0) :]
    candidates = sorted(
        (n for n in kept if n.role == "tool" and len(n.message.tool_result.content) > SHRINK_MIN_CHARS),  # type: ignore[union-attr]
        key=lambda n: -ctx.meter.node_tokens(n),
    )
    shrank = False
    for node in candidates:
        if tokens <= 0:
            break
        content = node.message.tool_result.content  # type: ignore[union-attr]
        before = ctx.meter.node_tokens(node)
        keep_tokens = max(250, before - tokens)
        keep_chars = int(keep_tokens * CHARS_PER_FIT_TOKEN)
        if keep_chars >= len(content) - 200:
            continue
        original = f"item_{original_item(ctx.events, node.seq)}"  # from the log: the result's text is a tool's
        head, tail = content[: keep_chars * 3 // 4], content[len(content) - keep_chars // 4 :]
        marker = (
            f"\n[… {len(content) - len(head) - len(tail)} characters omitted to fit the context window; "
            f"the full result is {original}: history_read_item id={original}]\n"
        )
        try:
            seq = STRATEGY.on(ctx).replace_tool_result(node.seq, head + marker + tail, reason="fit")
        except CtxKernelError as exc:
            log.info("could not shrink a kept tool result", seq=node.seq, error=str(exc))
            continue
        replaced = ctx.surface.node(seq)
        assert replaced is not None  # the replacement just landed on the surface
        tokens -= before - ctx.meter.node_tokens(replaced)
        shrank = True
    return shrank


def _failed(state: HandoffState, reason: str, detail: str, record: dict[str, Any] | None = None) -> SwitchOutcome:
    state.last_failure = f"{reason}: {detail}"
    log.info("window switch did not happen", reason=reason, detail=detail)
    return SwitchOutcome(False, reason, None, detail, None, record or {})


def after_commit(ctx: Context, result: CommitResult) -> None:
    """After a committed switch (its notes landed with it, see :func:`stage_notes`): count it and
    keep only the excerpts of the surface it left (a pass over the kept tail, not over the
    nodes it replaced: those cost as much as the switch's own planning)."""
    held = STRATEGY.on(ctx).state.get("state")
    # the state folds the commit's events at its next use (the next step's pre_step folds the
    # log to its end anyway: moved, not removed); the switch that committed built it
    state = held if isinstance(held, HandoffState) else state_for(ctx)
    state.switches += 1
    state.excerpts.keep(ctx.surface.nodes)


# -- the entry points ----------------------------------------------------------------------------------
def compact_now(ctx: Context) -> SwitchOutcome:
    """Manual compaction (the seed's ``/compact``): a window switch keeping only the last message,
    or a native summary when window switching is off for this session's model."""
    mode = mode_for(ctx)
    if not mode.enabled:
        return SwitchOutcome(False, "manual", None, mode.why)
    if mode.auto:
        return switch(ctx, reason="manual")
    _, retain, _ = host_settings(ctx)
    keep = int(retain * ctx.pressure().effective_window)
    region = head_region(ctx.surface, ctx.meter, keep, min_nodes=2)
    if region is None:
        return SwitchOutcome(False, "manual", None, "nothing to compact")
    try:
        result = STRATEGY.on(ctx).compact(Span(*region), kind="summary", data={"reason": "manual", "native": True})
    except CompactionError as exc:
        return SwitchOutcome(False, "manual", None, f"{type(exc).__name__}: {exc} (native: {mode.why})")
    return SwitchOutcome(True, "manual", None, f"native summary ({mode.why})", result)


def request_new_context(ctx: Context, reason: str = "") -> str:
    """Record a switch request (what ``new_context`` does); it runs at the next step boundary."""
    mode = mode_for(ctx)
    if not mode.window:
        msg = f"new_context is not available in this session: {mode.why}. The notes_* tools still work"
        raise ToolError(msg)
    state = state_for(ctx)
    if state.requested is not None:
        return "requested (already pending): the window switch happens at the next step boundary"
    state.requested = {"reason": reason[:500], "at": len(ctx.events)}
    return (
        "requested: a new context window starts at the next step boundary, after every result of this batch is "
        "committed. It opens with a handoff (goal, todos, your last instructions, recent notes and a summary); "
        "from then on the history_* tools recover exact details. Save anything else you need in notes now."
    )


__all__ = [
    "Mode",
    "HandoffState",
    "SwitchOutcome",
    "after_commit",
    "compact_now",
    "host_settings",
    "mode_for",
    "request_new_context",
    "state_for",
    "switch",
]
