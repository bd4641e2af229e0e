"""The window switch: one compaction transaction of kind ``window`` over the surface.

It replaces every visible node with one seed message and cites each of them (the kernel refuses
a replacement that leaves one out), except, in an automatic or protective switch, the results the
client has just sent and the call they answer (:func:`just_sent`): they stay after the seed. The new window id, the previous and first ids, the trigger
and the intent it consumes travel in the ``compaction/summary`` data, so the chain is part of
the same atomic batch as the surface change. No model is ever called: the seed is built from the
notes and the log, and nothing here falls back to a summary (§3.7 of the seed: fail loud).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxkernel import CacheWaitError, CtxKernelError, Message, Span, StrategyNotes, get_logger
from ctxkernel.recall.notes import Note, NotesLimits

from .seed import (
    DENSITY_MARGIN,
    REMAINING_PLACEHOLDER,
    SeedInput,
    SeedParts,
    compose_seed,
    shared_count,
    window_texts,
)
from .state import PENDING_INPUTS, WINDOW_EVENT, WINDOW_KIND, RolloverState, state_of
from .strategy import STRATEGY
from .window_ids import next_window_id

if TYPE_CHECKING:
    from ctxkernel import CommitResult, Context, StrategyHandle

    from .settings import RolloverSettings

log = get_logger("ctxkernel.rollover")


class RolloverError(CtxKernelError):
    """A window switch could not be done; the surface is unchanged and nothing was summarised."""


def settings_of(ctx: Context) -> RolloverSettings:
    return STRATEGY.on(ctx).settings


def notes_of(
    ctx: Context, settings: RolloverSettings | None = None, state: RolloverState | None = None
) -> StrategyNotes:
    """The session's notes, writes signed by rollover, stamped with the current window
    (``settings``, ``state``: the strategy's, when the caller has them already)."""
    rollover = STRATEGY.on(ctx)
    s = settings if settings is not None else rollover.settings
    notes = rollover.notes(NotesLimits(s.max_notes, s.max_notes_bytes, s.max_note_bytes))
    notes.current_window = (state if state is not None else state_of(ctx)).current
    return notes


def counts_add(ctx: Context) -> bool:
    """True when the session's tokenizer counts a seed as the sum of its parts (a cut after a line
    end, before a tag or a heading: see :class:`~ctxkernel_rollover.seed.SeedParts`)."""
    return ctx.meter.joins_exactly("\n", "<")


def remember_note(ctx: Context, note: Note) -> None:
    """Render ``note``'s seed block, and count it where counts add, as the note is written: the
    note exists from now on, so the switch that shows it need not tokenise it (nor render it)."""
    state_of(ctx).note_cache.prepare(
        note, settings_of(ctx).seed_note_chars, ctx.meter.count_text if counts_add(ctx) else None
    )


def _chain(state: RolloverState) -> tuple[str, str, int, int]:
    """How the seed that ends the current window names its place in the chain: that window's id
    (the next one's previous), the chain's first id, the next window's number and the first item
    of the window (0 for the first window)."""
    assert state.current is not None  # ensure_window recorded it
    archived_from = state.seed_seq if state.seed_seq is not None else 0
    return state.current, state.first or state.current, state.number + 1, archived_from


def count_window_parts(ctx: Context, state: RolloverState | None = None) -> None:
    """Count the parts of the seed that will end the current window which are fixed from its
    start (the chain's ids, where its items begin), where counts add: the plugin calls this in
    each step's ``pre_step``, and it counts them once per window (the window exists from then
    on), so the switch that ends the window tokenises only what is new."""
    state = state if state is not None else state_of(ctx)
    cache = state.note_cache
    if state.current is None or cache.window_of == state.current or not counts_add(ctx):
        return
    cache.prepare_window(state.current, window_texts(*_chain(state)), ctx.meter.count_text)


def ensure_window(ctx: Context) -> str:
    """The current window id; the first window's id is recorded before it is first needed."""
    state = state_of(ctx)
    if state.current is None:
        STRATEGY.on(ctx).emit("window", {"window_id": next_window_id(None), "first": True})
        state = state_of(ctx)
    assert state.current is not None
    return state.current


def current_turn_inputs(
    ctx: Context, limit: int = PENDING_INPUTS, state: RolloverState | None = None
) -> list[tuple[int, str]]:
    """The user's own messages of the open turn (what the model still has to act on), the
    newest ``limit``, oldest first: from the folded state, not a walk back through the turn."""
    if not ctx.turn_open:
        return []
    seqs = (state if state is not None else state_of(ctx)).turn_inputs[-limit:]
    return [(seq, _user_text(ctx, seq)) for seq in seqs]


def _user_text(ctx: Context, seq: int) -> str:
    """The text of the user's message at ``seq``: its surface node's when it is visible (the
    same message, already decoded), else decoded from its event."""
    node = ctx.surface.node(seq)
    if node is not None:
        return node.message.text
    return Message.from_dict(ctx.events[seq].data["message"]).text


def _earlier_instructions(ctx: Context, count: int, state: RolloverState) -> list[tuple[int, str]]:
    """The user's own recent instructions before the open turn (the open turn's are pending)."""
    if count <= 0:
        return []
    pending = set(state.turn_inputs[-PENDING_INPUTS:]) if ctx.turn_open else set()
    seqs = [s for s in state.instructions if s not in pending][-count:]
    return [(s, _user_text(ctx, s)) for s in seqs]


def _goal(
    rollover: StrategyHandle[RolloverSettings], active: list[Note], next_goal: str | None
) -> tuple[str | None, str]:
    """The goal the seed shows and where it came from (``active``: every active note, so the
    note ``goal`` is found without another read of the notes)."""
    if next_goal and next_goal.strip():
        return next_goal, "from new_context"
    goal_note = next((n for n in active if n.path == "goal"), None)
    if goal_note is not None:
        # text copied from a tool keeps its mark as the goal too: data to check, never instructions
        trust = "" if goal_note.trust == "model-authored" else f", trust {goal_note.trust}"
        return goal_note.content, f"note 'goal'{trust}"
    # the harness's task state, else the first substantive instruction (History.goal)
    history = rollover.history()
    goal = history.goal()
    todos = [f"- [{t.status}] {t.text}" for t in history.checklist() if t.open][:20]
    if goal is not None:
        source = "the task state" if goal.type == "session/task" else "the session's first instruction"
        text = history.goal_text() or ""
        return "\n".join([text, "Open todos:", *todos]) if todos else text, f"{source}, item_{goal.seq}"
    return None, "none recorded"


#: what the remaining-tokens figure may understate the room by, as a share of the window (only
#: when the seed is not counted from its parts: another tokenizer)
FIGURE_SLACK = 0.02
#: tokens the figure's two numbers ("<remaining> of <window>", up to 12 digits each) take at
#: most beyond one digit each with cl100k_base: it splits a run of digits into pieces of at most
#: three, one token each (three more pieces per number)
FIGURE_DIGIT_TOKENS = 8


def _fill_remaining(
    ctx: Context,
    state: RolloverState,
    parts: SeedParts,
    tokens: int,
    counted: bool,
    framing: int,
    window: int,
    overhead: int,
) -> tuple[str, int]:
    """The seed with its remaining-tokens line filled in, and its exact token count (with framing).

    With a tokenizer whose counts add across the seed's cuts (cl100k_base, every bundled profile),
    the count is the sum of the parts' counts (``Meter.count_joined``): only the parts not counted
    before are tokenised (note blocks were counted when written or last shown), and the figure is
    filled from the count of every other part. Otherwise (another tokenizer) a count from the
    parts or a byte bound that understates the room by at most FIGURE_SLACK of the window is used
    as it is, else the seed is tokenised once, filled in from a guess, and once more only when
    the count shows the guess understated the tokens or overstated them by more than the slack.
    The figure never overstates the room (beyond the few tokens of its own digits)."""
    meter = ctx.meter
    room, slack = window - overhead, FIGURE_SLACK * window

    def figure(seed_tokens: int) -> str:
        return f"{max(0, room - seed_tokens)} of {window}"

    if counts_add(ctx):
        tokenizer = meter.tokenizer.name
        parts.count_all_but_figure(meter.count_text, state.note_cache, tokenizer)
        others = sum(c for i, c in enumerate(parts.counts) if i != parts.figure and c is not None)
        # the figure's part with one digit per number (the same in every seed), and the digits'
        # further pieces: cl100k_base splits a run of digits into pieces of at most three
        line = shared_count(
            tokenizer, parts.parts[parts.figure].replace(REMAINING_PLACEHOLDER, "0 of 0", 1), meter.count_text
        )
        filled = parts.with_figure(figure(framing + others + line + FIGURE_DIGIT_TOKENS))
        return filled.text, framing + meter.count_joined(filled.parts, filled.counts)
    text = parts.text
    if counted or tokens - framing <= slack:
        return text.replace(REMAINING_PLACEHOLDER, figure(tokens), 1), tokens
    size = len(text.encode())
    guess = framing + int(size * (state.seed_density + DENSITY_MARGIN)) + 1
    filled_text = text.replace(REMAINING_PLACEHOLDER, figure(guess), 1)
    exact = framing + meter.count_text(filled_text)
    if not exact <= guess <= exact + slack:
        filled_text = text.replace(REMAINING_PLACEHOLDER, figure(exact), 1)
        exact = framing + meter.count_text(filled_text)
    state.seed_density = (exact - framing) / size
    return filled_text, exact


def switch(
    ctx: Context, trigger: str, *, intent: dict[str, Any] | None = None, error: str | None = None
) -> CommitResult:
    """Start a new window now. Raises :class:`RolloverError` (after recording it) when it cannot,
    and lets :class:`ctxkernel.CacheWaitError` through unrecorded: an automatic switch that does
    not pay for the cached prefix waits, which is no failure."""
    rollover = STRATEGY.on(ctx)
    settings = rollover.settings
    current = ensure_window(ctx)
    state = state_of(ctx)
    intent = intent if intent is not None else state.pending
    try:
        result = _switch(ctx, rollover, settings, state, trigger, intent, error)
    except CacheWaitError:
        raise  # the switch waits for the prompt cache: no failure, the kernel logs the wait
    except CtxKernelError as exc:
        text = f"{type(exc).__name__}: {exc}"
        rollover.emit(
            "failed",
            {
                "trigger": trigger,
                "window_id": current,
                "intent_id": intent.get("intent_id") if intent else None,
                "error": text[:2000],
                # what an automatic retry is measured against (see plugin.pre_step: back off until
                # the surface has grown materially or the window, trigger or model changed)
                "surface_tokens": ctx.meter.surface_tokens(),
                "effective_window": ctx.pressure().effective_window,
            },
        )
        log.error(
            "rollover failed; the surface is unchanged and nothing was summarised",
            session=ctx.id,
            trigger=trigger,
            error=text,
        )
        msg = f"the {trigger} rollover of window {current} failed and the context is unchanged (nothing was summarised): {text}"
        raise RolloverError(msg) from exc
    log.info(
        "rollover",
        session=ctx.id,
        trigger=trigger,
        window=state.current,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
    )
    return result


def just_sent(ctx: Context, settings: RolloverSettings, effective_window: int) -> list[Any]:
    """The surface's tail when it is the results the client has just sent: the last assistant
    message with tool calls and its results, in an open turn. Empty when the surface ends
    otherwise, when nothing would be left to replace, or when a result is over
    ``oversized_tool_result_ratio`` of the window (the protective switch archives it instead)."""
    nodes = ctx.surface.nodes
    if not ctx.turn_open or not nodes or nodes[-1].role != "tool":
        return []
    start = len(nodes) - 1
    while start > 0 and nodes[start].role == "tool":
        start -= 1
    caller = nodes[start]
    if start == 0 or caller.role != "assistant" or not caller.message.tool_calls:
        return []
    tail = nodes[start:]
    limit = settings.oversized_tool_result_ratio * effective_window
    if any(ctx.meter.node_tokens(n) > limit for n in tail):
        return []
    return list(tail)


def _switch(
    ctx: Context,
    rollover: StrategyHandle[RolloverSettings],
    settings: RolloverSettings,
    state: RolloverState,
    trigger: str,
    intent: dict[str, Any] | None,
    error: str | None,
) -> CommitResult:
    nodes = ctx.surface.nodes
    if not nodes:
        msg = "the surface is empty: there is nothing to roll over"
        raise RolloverError(msg)
    if ctx.surface.pending_calls:
        # never mid tool batch (§3.5): only pre_step and request_error call us, both between steps
        msg = f"tool calls {sorted(ctx.surface.pending_calls)} still wait for results"
        raise RolloverError(msg)
    notes = notes_of(ctx, settings, state)
    pressure = ctx.pressure()
    surface_tokens = ctx.meter.surface_tokens()
    # system prompt, tools, anchor correction; and the recall tools the first switch brings
    overhead = max(0, pressure.tokens - surface_tokens) + rollover.header_growth()
    # the results the client has just sent stay, after the seed, with the call they answer: a
    # new window that left them out made the model start its task over
    kept = just_sent(ctx, settings, pressure.effective_window) if trigger != "manual" else []
    if kept:
        nodes = nodes[: len(nodes) - len(kept)]
    kept_tokens = ctx.meter.nodes_tokens(kept)
    replaced_tokens = surface_tokens - kept_tokens
    budget = int(settings.seed_ratio * pressure.effective_window)
    if trigger != "manual":
        # an automatic switch must relieve the window: the seed stays well below what it replaces
        budget = min(budget, int(replaced_tokens * 0.8))
    active = list(reversed(notes.active()))  # newest first
    goal, goal_source = _goal(rollover, active, (intent or {}).get("next_goal"))
    hidden: list[str] = []
    if trigger == "overflow":
        hidden = [n.path for n in active[settings.protective_keep_notes :]]
        active = active[: settings.protective_keep_notes]
    previous, first, number, archived_from = _chain(state)
    new_id = next_window_id(previous)
    seed = SeedInput(
        current=new_id,
        previous=previous,
        first=first,
        number=number,
        trigger=trigger,
        goal=goal,
        goal_source=goal_source,
        pending=current_turn_inputs(ctx, state=state),
        notes=active,
        archived_from=archived_from,
        archived_to=len(ctx.events) - 1,
        error=error,
        hidden_note_paths=hidden,
        instructions=_earlier_instructions(ctx, settings.instructions_count, state),
        instructions_chars=settings.instructions_chars,
        pending_base=settings.pending_input_chars,
    )
    framing = ctx.meter.count_message(Message.user(""))  # the per-message framing
    parts, seed_tokens, counted = compose_seed(
        seed,
        budget_tokens=max(budget - framing, 1),
        count=ctx.meter.count_text,
        goal_chars=settings.goal_chars,
        pending_chars=settings.pending_input_chars,
        note_chars=settings.seed_note_chars,
        note_cache=state.note_cache,
    )
    text, seed_tokens = _fill_remaining(
        ctx, state, parts, seed_tokens + framing, counted, framing, pressure.effective_window, overhead
    )
    # the budget always admits the minimal seed (render_seed falls back to it when nothing else
    # fits); what an automatic switch cannot do is replace the surface with something no smaller
    if seed_tokens >= replaced_tokens and trigger != "manual":
        msg = (
            f"the smallest seed costs {seed_tokens} tokens, not fewer than the {replaced_tokens} tokens of the "
            f"window it would replace, so a new window cannot relieve this one: the other "
            f"{overhead} of the {pressure.tokens} tokens are the system prompt, the tools and the provider's "
            "count. Shorten the pending input, the system prompt or the tools, or use a model with a larger window"
        )
        raise RolloverError(msg)
    start = overhead + seed_tokens + kept_tokens
    if trigger == "auto" and start >= settings.reminder_ratio * pressure.effective_window:
        # the new window would open already past its reminder: switching again and again would
        # only churn windows; the protective (overflow) switch still runs at the window's limit
        msg = (
            f"a new window would start at {start} tokens ({start / pressure.effective_window:.0%} of "
            f"{pressure.effective_window}), past its reminder_ratio {settings.reminder_ratio}, so it cannot relieve "
            f"this one: {overhead} of the {pressure.tokens} tokens are the system prompt, the tools and the "
            f"provider's count, not the {surface_tokens}-token surface. Shorten the system prompt or the tools, "
            "or use a model with a larger window"
        )
        raise RolloverError(msg)
    message = Message.user(text, STRATEGY.source("seed"))
    data: dict[str, Any] = {
        "window_id": new_id,
        "previous_window_id": state.current,
        "first_window_id": seed.first,
        "window_number": seed.number,
        "trigger": trigger,
        "reason": trigger,
        "intent_id": intent.get("intent_id") if intent else None,
        "notes": [n.id for n in active],
        "goal_source": goal_source,
        "summarized": False,
        # the newest call and the results just sent, kept verbatim after the seed (item seqs)
        "kept": [n.seq for n in kept],
    }
    return rollover.compact(
        Span(nodes[0].seq, nodes[-1].seq, message=message),
        kind=WINDOW_KIND,
        data=data,
        check_shrink=trigger != "manual",
        # nothing slow runs between validation and commit (no summary), so the lock and the
        # commit go in one durable batch: the whole switch is one local write (seed §4)
        single_batch=True,
    )


__all__ = [
    "RolloverError",
    "WINDOW_EVENT",
    "current_turn_inputs",
    "ensure_window",
    "notes_of",
    "count_window_parts",
    "remember_note",
    "switch",
]
