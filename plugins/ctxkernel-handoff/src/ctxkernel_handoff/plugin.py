"""The ``handoff`` strategy's hook implementations (the entry point names this module)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import ctxkernel
from ctxkernel import ContextOverflowError, get_logger
from ctxkernel.recall.history import History

from .engine import (
    RECEIPTS_KEPT,
    REMINDER_GROWTH,
    REMINDER_LEAD,
    REMINDER_TAG,
    STATE_VERSION,
    HandoffState,
    after_commit,
    build_handoff,
    builds_up_front,
    folded_state,
    host_settings,
    mode_for,
    no_room,
    notes_of,
    state_for,
    switch,
    warm_excerpts,
)
from .engine import (
    compact_now as manual_compaction,
)
from .strategy import NAME, STRATEGY
from .tools import TOOL_NAMES, build_recall_tools, build_tools

if TYPE_CHECKING:
    from ctxkernel import (
        CommitResult,
        Context,
        ManualCompaction,
        ModelError,
        Profile,
        Region,
        Request,
        StepContext,
        Summary,
    )

log = get_logger("ctxkernel.handoff")

PROMPT = (
    "Context windows: this session runs in numbered context windows. When a window fills up, or when you call "
    "new_context, older messages are replaced by a handoff (goal, open todos, your last user instructions verbatim, "
    "recent notes and a summary) and a new window starts. Keep durable facts, "
    "decisions and plans in your session-private notes (notes_write_file, notes_append_to_file; paths under "
    "self/notes/); the most recent ones are carried into every handoff. Call new_context at a natural stopping "
    "point when you are reminded that the window is filling up."
)
#: the prompt's part on the history tools, which come with the first switch (``[tools] offer``)
RECALL_PROMPT = (
    "Nothing is deleted: history_list_windows, history_list_items, history_search_contents and history_read_item "
    "recover any earlier item exactly (item_<seq> ids)."
)


@ctxkernel.hookimpl
def register_strategy(register: Any) -> None:
    register(STRATEGY.spec)


@ctxkernel.hookimpl
def compact_now(ctx: Context, request: ManualCompaction) -> ctxkernel.ManualOutcome | None:
    """The seed's ``/compact``: a window switch now, or a native summary where switching is off."""
    if request.action != "compact":
        return None
    outcome = manual_compaction(ctx)
    detail = outcome.detail or (f"switched to window {outcome.window}" if outcome.window else outcome.reason)
    return ctxkernel.ManualOutcome(outcome.committed, detail, outcome.result)


@ctxkernel.hookimpl
def session_opened(ctx: Context) -> None:
    """Fold the strategy's state (from the snapshot: the tail only). The history index and the
    notes are built on first use (the first step, tool call or switch), not here: restored from a
    snapshot they cost a row per window and per note version, which would make every open grow
    with the session's history; the snapshot carries them over unused (``snapshot.index_parts``)."""
    if not mode_for(ctx).enabled:
        return
    state_for(ctx)


@ctxkernel.hookimpl
def snapshot_state(ctx: Context) -> ctxkernel.StrategySnapshot | None:
    if not mode_for(ctx).enabled:
        return None  # session_opened builds no state then, so none is put into the snapshot either
    # the history and notes indexes handoff reads (a switch folded at the open, its panel) are
    # built on first use: built now, this snapshot holds them folded (index_parts runs after this
    # hook), so an open from it does not fold them from the log's first event
    notes_of(ctx)
    return STRATEGY.on(ctx).snapshot(folded_state(ctx), version=STATE_VERSION)


@ctxkernel.hookimpl
def register_tools(register: Any, ctx: Context) -> None:
    mode = mode_for(ctx)
    state = state_for(ctx)
    handoff = STRATEGY.on(ctx)
    generation = handoff.strategies_generation
    if state.generation not in (-1, generation):
        # the strategy set changed (a runtime toggle): notes are rebuilt from the log, and a
        # switch requested before the toggle is dropped rather than run under other settings
        handoff.forget_notes()
        state.requested = None
    state.generation = generation
    if not mode.tools:
        return
    for tool in build_tools():
        register(tool)
    # the history tools have nothing to recover before a switch (or a shrunk result) hides something
    if handoff.offer_tools(ctx.surface.hides_anything()):
        for tool in build_recall_tools():
            register(tool)


@ctxkernel.hookimpl
def system_prompt(ctx: Context) -> str | None:
    if not mode_for(ctx).tools:
        return None
    return f"{PROMPT} {RECALL_PROMPT}" if STRATEGY.on(ctx).tools_offered else PROMPT


@ctxkernel.hookimpl
def pre_step(ctx: Context, step: StepContext) -> None:
    mode = mode_for(ctx)
    if not mode.enabled:
        return
    state = state_for(ctx)
    state.excerpts.release()  # what the last switch replaced, freed at the step after it
    if mode.window:
        # every switch reads the notes: built at the first step (not at the open, see
        # session_opened), the session folds them at each step end from then on, so a switch
        # finds them current instead of folding every event since the open
        STRATEGY.on(ctx).notes()
        if builds_up_front(ctx):  # the extractive body is what a switch will use
            warm_excerpts(ctx, state)
    if state.requested is not None:
        # explicit requests are honoured even when automatic compaction is off
        requested = state.requested
        state.requested = None
        if not mode.window:
            STRATEGY.on(ctx).remind(step, f"new_context: the requested window switch did not happen: {mode.why}.")
            return
        outcome = switch(ctx, reason="requested")
        if not outcome.committed:
            STRATEGY.on(ctx).remind(
                step,
                f"new_context: the requested window switch did not happen ({outcome.detail}); you are still in "
                f"window win_{STRATEGY.on(ctx).history().current_window.number}.",
            )
        del requested
        return
    if ctx.route is None:
        return  # the first step of a fresh session has no routed request to price against
    threshold, retain, auto = host_settings(ctx)
    pressure = ctx.pressure()
    if mode.auto and auto and pressure.ratio >= threshold:
        interval = STRATEGY.on(ctx).settings.min_switch_interval_steps
        since = state.steps_since_switch
        if since is not None and since < interval and pressure.ratio < 1.0:
            # no switch storm: the last switch was `since` steps ago and this request still fits;
            # basic's threshold compaction waits too (an overflow, new_context or a manual
            # compaction never waits)
            STRATEGY.on(ctx).hold_pressure(step, f"{since} of {interval} steps since the last window switch")
            return
        outcome = switch(ctx, reason="threshold", keep_tokens=int(retain * pressure.effective_window))
        if outcome.committed:
            return
    if not mode.window:
        return
    history = STRATEGY.on(ctx).history()
    window = history.current_window.number
    pressure = ctx.pressure()
    opened = state.window_open_ratio.setdefault(window, pressure.ratio)
    # remind only when this window itself has grown: a window that opens near the threshold (a
    # tiny context) would otherwise remind, and be switched by the steward, at every step
    grown = pressure.ratio - opened >= REMINDER_GROWTH
    due = pressure.ratio >= max(0.0, threshold - REMINDER_LEAD) and grown and state.reminded_window != window
    if due and no_room(ctx) is None:  # never ask for a switch that can only be refused
        state.reminded_window = window  # single shot per window (the notice in the log restores it on restart)
        STRATEGY.on(ctx).remind(
            step,
            f"{REMINDER_TAG} this window (win_{window}) is {pressure.ratio:.0%} full; at {threshold:.0%} it switches "
            "automatically. Save what matters in notes (notes_write_file) and call new_context at a good stopping point.",
        )


@ctxkernel.hookimpl
def request_error(ctx: Context, error: ModelError) -> bool | None:
    if not isinstance(error, ContextOverflowError):
        return None
    mode = mode_for(ctx)
    if not mode.auto:
        return None  # native: the basic strategy's overflow handling answers
    state = state_for(ctx)
    if state.overflow_at is not None and state.overflow_at == state.last_assistant:
        state.overflow_at = None
        return False  # one retry per overflow: the last switch did not make the request fit
    before = ctx.meter.surface_tokens()
    outcome = switch(ctx, reason="overflow")
    if not outcome.committed:
        # a failed switch may still have shrunk kept tool results (model-free, to make room): that
        # is worth a retry; otherwise basic's overflow path answers
        return True if ctx.meter.surface_tokens() < before else None
    state.overflow_at = state.last_assistant
    return ctx.meter.surface_tokens() < before


@ctxkernel.hookimpl(tryfirst=True)
def summarize(ctx: Context, region: Region) -> Summary | None:
    if region.strategy != NAME or region.kind != "window":
        return None  # native summaries are the basic strategy's
    return build_handoff(ctx, region)


@ctxkernel.hookimpl
def commit(ctx: Context, result: CommitResult) -> None:
    if result.strategy == NAME and result.kind == "window":
        after_commit(ctx, result)


@ctxkernel.hookimpl
def project(ctx: Context) -> dict[str, Any] | None:
    mode = mode_for(ctx)
    if not mode.enabled:
        return {"enabled": False, "why": mode.why}
    state = state_for(ctx)
    history = STRATEGY.on(ctx).history()
    notes = notes_of(ctx)
    return {
        "enabled": True,
        "window": history.current_window.number,
        "windows": len(history.windows),
        "switching": "window" if mode.auto else ("explicit only" if mode.window else "native"),
        "why": mode.why or None,
        "requested": state.requested is not None,
        "last_switch": state.last_switch,
        # not last_failure: it lives in this process only (the log records no failed switch), so
        # a reopened session, or `ctxkernel inspect` in another process, could never show it; a
        # panel shows what the log holds (the conformance restart check compares them). The
        # failure is logged ("window switch did not happen") and kept on state_for(session).
        "notes": len(notes),
        "notes_bytes": notes.total_bytes,
        # the inspector's panels: each window with the receipt of the switch that opened it,
        # and the notes with their trust marks (newest last, bounded)
        "window_list": [_window_row(state, w) for w in history.windows[-RECEIPTS_KEPT:]],
        "notes_list": [n.to_dict(content=False) for n in notes.active()[-RECEIPTS_KEPT:]],
    }


def _window_row(state: HandoffState, window: Any) -> dict[str, Any]:
    """A window with the receipt of the commit that opened it, from the folded state (the inspector
    lists the newest windows; reading their commits back from the log would cost a replay)."""
    row: dict[str, Any] = window.to_dict()
    if window.opened_by is not None and window.opened_by in state.receipts:
        row["receipt"] = state.receipts[window.opened_by]
    return row


@ctxkernel.hookimpl
def export_files(ctx: Context) -> dict[str, bytes] | None:
    """``handoff/handoff.md`` and ``handoff/handoff-log.md``, as the seed names them: the notes
    written after each committed switch (they live in the session log, so in the store)."""
    from .handoff import HANDOFF_LOG_NOTE, HANDOFF_NOTE

    notes = STRATEGY.on(ctx).notes()
    files = {
        f"{NAME}/{path}": notes.read(path).content.encode("utf-8")
        for path in (HANDOFF_NOTE, HANDOFF_LOG_NOTE)
        if notes.exists(path)
    }
    return files or None


@ctxkernel.hookimpl
def steward_actions(ctx: Context, request: Request) -> list[dict[str, Any]] | None:
    """The deterministic steward: when the pressure reminder shows in this window, save a progress
    note and ask for a new window (once per window)."""
    mode = mode_for(ctx)
    if not mode.window:
        return None
    state = state_for(ctx)
    history = STRATEGY.on(ctx).history()
    window = history.current_window.number
    if state.requested is not None or state.reminded_window != window or state.steward_window == window:
        return None
    state.steward_window = window
    return [
        {
            "name": "notes_write_file",
            "arguments": {"path": f"self/notes/progress/win_{window}.md", "content": _progress(history, request)},
        },
        {"name": "new_context", "arguments": {"reason": f"pressure reminder in win_{window}"}},
    ]


#: the longest quote the steward's progress note takes from what the model sees: a model's own
#: notes are short (docs/simulate.md, "The steward policy": its messages in the shared recordings
#: are 65 characters at the median, 182 at p90)
STEWARD_QUOTE_CHARS = 600


def _progress(history: History, request: Request) -> str:
    """What a careful model would write down before switching, from what this request shows it:
    the latest instruction and its own latest step, each at most :data:`STEWARD_QUOTE_CHARS`."""
    lines = [f"Progress at the end of win_{history.current_window.number}."]
    asked = said = ""
    for message in request.messages:
        if message.role == "user" and message.source.kind == "user" and message.text.strip():
            asked = " ".join(message.text.split())
        elif message.role == "assistant" and message.text.strip():
            said = " ".join(message.text.split())
    if asked:
        lines.append(f"Last instruction: {asked[:STEWARD_QUOTE_CHARS]}")
    if said:
        lines.append(f"Last assistant step: {said[:STEWARD_QUOTE_CHARS]}")
    return "\n".join(lines)


@ctxkernel.hookimpl
def validate_profile(profile: Profile, report: Any) -> None:
    checks = STRATEGY.validating(profile, report)
    if checks is None:
        return
    try:
        settings = STRATEGY.settings_for(profile)
        variants = [
            STRATEGY.settings_for(profile, p.match.provider, p.match.name)
            for p in profile.model_policies
            if STRATEGY.name in p.strategies
        ]
    except ctxkernel.ProfileError:
        return  # the kernel's settings check reports the invalid table with the file and the key
    every = [settings, *variants]
    # tools: the recall tools are shared with rollover; both in one profile would register them twice
    sharing = [s for s in profile.profile.strategies if s == "rollover"]
    if sharing:
        checks.fail(
            "tools",
            f"strategies {sharing} register new_context too, which collides with handoff's {list(TOOL_NAMES)}. "
            "Fix: run only one windowed strategy (handoff or rollover) in a profile",
        )
    else:
        checks.ok("tools", f"registers {len(TOOL_NAMES)} tools: {', '.join(TOOL_NAMES)}")
    # notes storage: notes are events in the session log, so the store must accept writes
    store = profile.store
    if store.backend in ("jsonl", "sqlite"):
        home = profile.store_home()
        probe = home
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        if probe.is_dir() and os.access(probe, os.W_OK):
            checks.ok("store", f"notes are stored in the {store.backend} ctx logs under {home} (writable)")
        else:
            checks.fail(
                "store",
                f"notes storage {home} is not writable (checked {probe}). Fix: set [store] path or CTXKERNEL_HOME to a writable folder",
            )
    else:
        checks.ok("store", "notes are stored in the postgres session logs (checked by the kernel's store check)")
    # generated handoffs need a summarizer model
    if any(s.handoff_summary == "generated" for s in every) and profile.summarizer.kind == "extractive":
        checks.warn(
            "strategy",
            "handoff_summary = 'generated' but [summarizer] kind = 'extractive': every switch will fall back to an "
            "extractive handoff. Fix: configure [summarizer] (kind = 'openai', base_url, model), or set "
            "handoff_summary = 'extractive'",
        )
    # native summaries come from the basic strategy
    native = any(
        not s.inject_tools
        or not s.override_compaction
        or s.default_strategy == "native"
        or any(p.strategy == "native" for p in s.model_policies)
        for s in every
    )
    if "basic" not in profile.profile.strategies:
        message = (
            "native summaries (inject_tools = false, override_compaction = false, default_strategy = 'native', a native "
            "model policy, or the runtime toggle) come from the 'basic' strategy, which this profile does not load. "
            "Fix: add 'basic' after 'handoff' in [profile] strategies and capability_order"
        )
        (checks.fail if native else checks.warn)("strategy", message)
    elif profile.profile.strategies.index("basic") < profile.profile.strategies.index(NAME):
        checks.fail(
            "strategy",
            "'basic' is listed before 'handoff', so native summaries would pre-empt window switches. Fix: list 'handoff' first",
        )
    else:
        checks.ok("strategy", "native summaries fall back to 'basic'")
