"""The built-in ``basic`` strategy: native-style summary compaction (DSH's default engine).

At ``threshold_ratio`` of the effective window it summarises the surface head and keeps a
verbatim tail of ``retain_ratio`` of the window, cutting only at balanced points, with at most
``compaction_retries`` + 1 attempts. On a provider context overflow it compacts harder and asks
for a retry once the surface has actually shrunk. After any compaction it compacts by threshold
again only once the surface has grown by ``regrow_ratio`` of the window, so a compaction that
cannot lower the pressure does not repeat at every step (overflow handling is not held back).

Summaries come from the ``summarize`` hook; this module's implementation is ``trylast`` so any
installed strategy's summarizer wins. With a summarizer model it appends the eight-section
directive after the replayed prefix (so a provider prefix cache serves the prefix); without one
it builds a deterministic extractive summary with the same eight sections from the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

import ctxkernel
from ctxkernel import (
    SUMMARY_SECTIONS,
    CompactionError,
    ContextOverflowError,
    Message,
    ModelError,
    Span,
    Summary,
    head_region,
)
from ctxkernel.events import COMPACTION_END, COMPACTION_START
from ctxkernel.text import extractive_summary

if TYPE_CHECKING:
    from ctxkernel import Context, ManualCompaction, Region, StepContext

NAME = "basic"
log = ctxkernel.get_logger("ctxkernel.basic")

DIRECTIVE = (
    "Your task is to write a summary of the conversation so far that lets work continue "
    "without it. Write exactly these eight sections, in this order, each as a '## ' heading, "
    "writing '(none)' under a section with nothing to say and never dropping a section: "
    + "; ".join(SUMMARY_SECTIONS)
    + ". Quote the user's instructions verbatim where they still apply. If the conversation "
    "begins with an earlier summary, merge it into yours instead of copying it."
)


class BasicSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: compact automatically at this share of the effective window (False-y via ``auto``)
    threshold_ratio: float = Field(default=0.8, gt=0, le=1)
    #: share of the effective window kept verbatim after a compaction
    retain_ratio: float = Field(default=0.16, ge=0, lt=1)
    #: extra attempts when a compaction fails its shrink or stability check
    compaction_retries: int = Field(default=1, ge=0, le=5)
    #: extra attempts on a provider context overflow
    overflow_retries: int = Field(default=1, ge=0, le=5)
    #: compact automatically in pre_step (off: only on overflow or when asked)
    auto: bool = True
    #: characters of the extractive summary (bounded so the checkpoint always shrinks)
    summary_max_chars: int = Field(default=12_000, ge=1_000, le=200_000)
    #: after a compaction, compact by threshold again only once the surface has grown by this
    #: share of the effective window (0: no back-off); overflow handling is not held back
    regrow_ratio: float = Field(default=0.1, ge=0, lt=1)

    @model_validator(mode="after")
    def _retain_below_threshold(self) -> BasicSettings:
        if self.retain_ratio >= self.threshold_ratio:
            msg = f"retain_ratio ({self.retain_ratio}) must be below threshold_ratio ({self.threshold_ratio})"
            raise ValueError(msg)
        return self


STRATEGY = ctxkernel.Strategy(
    NAME,
    BasicSettings,
    capabilities={"pressure", "overflow", "summary"},
    description="native-style summary compaction: summarise the head, keep a verbatim tail",
)


@ctxkernel.hookimpl
def register_strategy(register: Any) -> None:
    register(STRATEGY.spec)


#: a conservative characters-per-token ratio for sizing the extractive summary before it exists
_CHARS_PER_TOKEN_LOW = 3


@ctxkernel.hookimpl
def validate_profile(profile: Any, report: Any) -> None:
    """Refuse budgets under which a compaction cannot get back below the threshold (a loop)."""
    routes = [(profile.model.provider, profile.model.name)]
    for policy in profile.model_policies:
        routes.append((policy.match.provider or profile.model.provider, policy.match.name or profile.model.name))
    for provider, name in dict.fromkeys(routes):
        model = profile.model_for(provider, name)
        settings = BasicSettings.model_validate(profile.strategy_settings(NAME, provider, name))
        window = model.effective_window
        threshold = int(settings.threshold_ratio * window)
        tail = int(settings.retain_ratio * window)
        summary = settings.summary_max_chars // _CHARS_PER_TOKEN_LOW
        # the user's instructions the kernel keeps through a compaction come on top (instructions.py)
        kept = int(profile.instructions.budget_ratio * window)
        if tail + summary + kept >= threshold:
            report.warn(
                "basic-budget",
                NAME,
                f"for {provider}/{name} a compaction keeps a {tail}-token tail plus a summary of up to ~{summary} tokens "
                f"({settings.summary_max_chars} chars) plus up to {kept} tokens of user instructions "
                f"([instructions] budget_ratio {profile.instructions.budget_ratio}), not below the {threshold}-token "
                f"threshold ({settings.threshold_ratio} of the effective window {window}): it may compact at every "
                "step. Fix: lower retain_ratio, summary_max_chars or budget_ratio, raise threshold_ratio, or use a "
                "larger window",
            )
        else:
            report.ok(
                "basic-budget",
                NAME,
                f"{provider}/{name}: tail {tail} + summary <= ~{summary} + instructions <= {kept} < threshold "
                f"{threshold} tokens",
            )


def compact(ctx: Context, keep_tokens: int, *, reason: str) -> bool:
    """Summarise the head, keeping ``keep_tokens`` verbatim; True when the surface shrank."""
    basic = STRATEGY.on(ctx)
    for attempt in range(basic.settings.compaction_retries + 1):
        region = head_region(ctx.surface, ctx.meter, keep_tokens, min_nodes=2)
        if region is None and reason == "overflow" and attempt < basic.settings.compaction_retries:
            # the verbatim tail holds all but an earlier summary: an overflow needs a smaller tail
            keep_tokens //= 2
            continue
        if region is None:
            return False
        try:
            # the extractive summary is local computation: written before the transaction, which
            # then commits in one write; a summarizer model is asked only under the lock
            basic.compact(
                Span(*region),
                kind="summary",
                data={"reason": reason, "attempt": attempt},
                summarize_first=basic.summarizer is None,
            )
            return True
        except CompactionError as exc:
            log.warning("compaction failed", session=ctx.id, attempt=attempt, error=str(exc))
            keep_tokens //= 2  # a smaller tail leaves more to summarise: more likely to shrink
    return False


@ctxkernel.hookimpl(trylast=True)
def compact_now(ctx: Context, request: ManualCompaction) -> ctxkernel.ManualOutcome | None:
    """Manual compaction: summarise the head now, keeping ``retain_ratio`` of the window verbatim."""
    if request.action != "compact":
        return None
    keep = int(STRATEGY.on(ctx).settings.retain_ratio * ctx.pressure().effective_window)
    if compact(ctx, keep, reason="manual"):
        return ctxkernel.ManualOutcome(True, f"summarised the head, keeping about {keep} tokens verbatim")
    return ctxkernel.ManualOutcome(
        False, f"nothing to summarise: the surface fits the verbatim tail of {keep} tokens, or no summary shrank it"
    )


@ctxkernel.hookimpl(trylast=True)
def pre_step(ctx: Context, step: StepContext) -> None:
    basic = STRATEGY.on(ctx)
    if step.attempt == 0:
        # a new request: ``overflow_retries`` counts the attempts of one request, so a streak an
        # earlier request left (its overflow path found nothing to summarise) must not refuse
        # this request's first overflow (with guard_request, the composed-request guard)
        basic.state["overflow_streak"] = 0
    settings = basic.settings
    if not settings.auto or basic.route is None:
        return  # the first step of a fresh session has no routed request to price against
    # a message over the kernel's per-message bound sits in the verbatim tail, where no summary of
    # the head can reach it: excerpt it first (with a pointer to the full item) and price after
    basic.excerpt_oversized()
    pressure = basic.pressure()
    if pressure.ratio < settings.threshold_ratio:
        return
    if step.pressure_held is not None and pressure.ratio < 1.0:
        # the strategy that owns the pressure (handoff) waits at this step and the request fits
        log.debug("threshold compaction left to its owner", session=ctx.id, held_by=step.pressure_held[0])
        return
    # a compaction that left the pressure at (or within regrow_ratio of) the threshold, or failed,
    # would run again at every step without lowering it (a compaction loop): wait until the
    # surface has grown materially; the provider's context overflow still compacts (request_error)
    needed = int(settings.regrow_ratio * pressure.effective_window)
    mark = last_compaction_mark(ctx)
    if needed and mark is not None and grown_since(ctx, mark, needed) < needed:
        log.debug("threshold compaction held back", session=ctx.id, since=mark, ratio=round(pressure.ratio, 3))
        return
    compact(ctx, int(settings.retain_ratio * pressure.effective_window), reason="threshold")


#: the format of the folded fields in session snapshots (bump it when their shape changes)
STATE_VERSION = 1
#: what the fold of the log derives; ``overflow_streak`` is this process's retry count and is left
#: out (restored, a streak caught mid-compaction by the snapshot made a reopened session refuse the
#: next overflow that the live one would have compacted)
FOLDED = ("cursor", "open_id", "mark")


@ctxkernel.hookimpl
def session_opened(ctx: Context) -> None:
    last_compaction_mark(ctx)


@ctxkernel.hookimpl
def snapshot_state(ctx: Context) -> ctxkernel.StrategySnapshot:
    last_compaction_mark(ctx)
    state = STRATEGY.on(ctx).state
    return STRATEGY.on(ctx).snapshot({k: state.get(k) for k in FOLDED}, version=STATE_VERSION)


def _from_folded(data: dict[str, Any], log_length: int) -> dict[str, Any]:
    cursor, open_id, mark = (data[k] for k in FOLDED)
    if type(cursor) is not int or not 0 < cursor <= log_length:
        msg = f"cursor {cursor!r} is outside the log (length {log_length})"
        raise ValueError(msg)
    if not (open_id is None or isinstance(open_id, str)) or not (mark is None or type(mark) is int):
        msg = "open_id must be a compaction id or null, mark a seq or null"
        raise ValueError(msg)
    return {"cursor": cursor, "open_id": open_id, "mark": mark}


def last_compaction_mark(ctx: Context) -> int | None:
    """Seq at which this strategy's last compaction attempt ended (committed or failed), folded
    from the log with a cursor (from the session's snapshot when it was opened from one), so a
    reopened session holds back exactly like the live one."""
    basic = STRATEGY.on(ctx)
    state = basic.state
    if "cursor" not in state:
        state.update(basic.restored(version=STATE_VERSION, load=lambda d: _from_folded(d, len(ctx.events))) or {})
    events = ctx.events
    for event in events[state.get("cursor", 0) :]:
        if event.type == COMPACTION_START and event.data.get("strategy") == NAME:
            state["open_id"] = event.data.get("compaction_id")
            state["mark"] = event.seq
        elif event.type == COMPACTION_END and event.data.get("compaction_id") == state.get("open_id"):
            state["open_id"] = None
            state["mark"] = event.seq
    state["cursor"] = len(events)
    return state.get("mark")


def grown_since(ctx: Context, mark: int, enough: int) -> int:
    """Tokens of surface nodes appended after seq ``mark``, counted from the newest and stopping
    at ``enough`` (so the work is bounded by the growth that matters)."""
    grown = 0
    for node in reversed(ctx.surface.nodes):
        if node.seq <= mark or grown >= enough:
            break
        grown += ctx.meter.node_tokens(node)
    return grown


@ctxkernel.hookimpl(trylast=True)
def request_error(ctx: Context, error: ModelError) -> bool | None:
    if not isinstance(error, ContextOverflowError):
        return None
    basic = STRATEGY.on(ctx)
    settings = basic.settings
    overflows = basic.state.get("overflow_streak", 0)
    if overflows >= settings.overflow_retries:
        basic.state["overflow_streak"] = 0
        return False
    basic.state["overflow_streak"] = overflows + 1
    before = ctx.meter.surface_tokens()
    window = basic.pressure().effective_window
    if error.limit:  # the provider's real limit wins over a profile that overstates the window
        window = min(window, error.limit)
    keep = int(settings.retain_ratio * window) // 2
    shrank = compact(ctx, keep, reason="overflow") and ctx.meter.surface_tokens() < before
    return shrank


@ctxkernel.hookimpl
def commit(ctx: Context, result: Any) -> None:
    if result.strategy == NAME:
        STRATEGY.on(ctx).state["overflow_streak"] = 0


@ctxkernel.hookimpl(trylast=True)
def summarize(ctx: Context, region: Region) -> Summary | None:
    basic = STRATEGY.on(ctx)
    model = basic.summarizer
    if model is not None:
        return model_summary(ctx, region, model)
    settings = basic.settings if basic.active else BasicSettings()
    limit = min(settings.summary_max_chars, max(400, region.tokens * 2))
    return Summary(extractive_summary(region.messages, max_chars=limit))


def model_summary(ctx: Context, region: Region, model: Any) -> Summary:
    """Ask the summarizer model: system and tools of the request header, the replayed region,
    then the directive last, so the provider's prefix cache serves everything before it."""
    header = STRATEGY.on(ctx).request_header()
    system, tools = header.system, header.tools
    messages = [*region.messages, Message.user(DIRECTIVE, ctxkernel.Source.plugin_form(NAME, "directive"))]
    reply = model.complete(messages, system=system, tools=tools)
    text = reply.message.text.strip()
    if not text:
        msg = "the summarizer model returned an empty summary"
        raise CompactionError(msg)
    return Summary(text, provider=reply.provider or model.provider, model=reply.model or model.model, usage=reply.usage)
