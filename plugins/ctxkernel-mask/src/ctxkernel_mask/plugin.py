"""The ``mask`` strategy: observation masking (The Complexity Trap, arXiv 2508.21433).

Before each request, tool results older than a verbatim tail become a one-line placeholder that
names the tool, a digest of the call's arguments and the item id the history tools read it back
by; a reply whose tool-call arguments are large is masked with its results into one notice. The
model keeps its reasoning and its actions; only old observations go, with or without pressure.
Masks are committed in batches, one compaction transaction each, that the prompt cache's
break-even rule picks (at least ``clear_at_least`` tokens), so the provider's cached prefix is
rewritten only when the saving pays for it. The current step is never masked; an error result keeps its
first lines. Nothing is summarised and no model is called: a profile that needs a summary when
masking alone cannot get under its threshold lists ``basic`` after ``mask`` (``mask-summary``).

The history tools ``recall_tools`` names (search and read by default) come with the strategy, but only once the surface shows
something that replaced what it held (a mask, a summary, an excerpt): their schemas go with every
request, and a session that has hidden nothing has nothing to recall. Adding them rewrites the
cached prefix once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ctxkernel
from ctxkernel import CacheWaitError, CompactionError, Span
from ctxkernel.events import COMPACTION_SUMMARY

from .plan import READ_TOOL, WEIGHED_KEY, plan
from .recall import offered_tools, system_section
from .settings import MaskSettings
from .strategy import NAME, STRATEGY

if TYPE_CHECKING:
    from ctxkernel import Context, Profile, StepContext, ValidationReport

log = ctxkernel.get_logger("ctxkernel.mask")

#: the strategies that offer the history tools themselves (a profile runs one of them or mask)
HISTORY_STRATEGIES = ("history", "handoff")


@ctxkernel.hookimpl
def register_strategy(register: Any) -> None:
    register(STRATEGY.spec)


def recall_can_come(ctx: Context) -> bool:
    """Whether the window is large enough to carry the history tools' schemas (``recall_min_window``)."""
    return ctx.model.effective_window >= STRATEGY.on(ctx).settings.recall_min_window


@ctxkernel.hookimpl
def register_tools(register: Any, ctx: Context) -> None:
    mask = STRATEGY.on(ctx)
    if mask.offer_tools(ctx.surface.hides_anything(), ever=recall_can_come(ctx)):
        for tool in offered_tools(mask.settings):
            register(tool)


@ctxkernel.hookimpl
def system_prompt(ctx: Context) -> str | None:
    mask = STRATEGY.on(ctx)
    return system_section(mask.settings) if mask.tools_offered else None


@ctxkernel.hookimpl
def pre_step(ctx: Context, step: StepContext) -> None:
    mask = STRATEGY.on(ctx)
    # the kernel registers the tools again once something is hidden; the routed window is ours
    mask.recheck_tools(ctx.surface.hides_anything(), ever=recall_can_come(ctx))
    if mask.route is None:
        return  # the first request of a fresh session: nothing old to mask yet
    pressure = ctx.pressure()
    mask.state[WEIGHED_KEY] = None
    masks = plan(ctx, mask.settings, pressure.effective_window, pressure.tokens)
    if not masks:
        return
    reason = "pressure" if pressure.ratio >= mask.settings.pressure_ratio else "batch"
    spans = [Span(m.start, m.end, message=m.message) for m in masks]
    data = {
        "reason": reason,
        "results": sum(1 for m in masks if m.kind == "result"),
        "replies": sum(1 for m in masks if m.kind == "reply"),
    }
    weighed = mask.state[WEIGHED_KEY]
    if weighed is not None:
        data["break_even"] = weighed  # what the batch saves over the rule's horizon, and its cache cost
    try:
        mask.compact(spans, kind="mask", single_batch=True, data=data)
    except CacheWaitError as exc:
        log.info("masking waits for the prompt cache", session=ctx.id, reason=str(exc))
    except CompactionError as exc:
        # the surface stays as it was; the next step plans again from what it then shows
        log.warning("masking refused", session=ctx.id, error=f"{type(exc).__name__}: {exc}", spans=len(spans))


@ctxkernel.hookimpl
def project(ctx: Context) -> dict[str, Any]:
    batches = results = replies = saved = 0
    for event in ctx.events:
        if event.type != COMPACTION_SUMMARY or event.data.get("strategy") != NAME:
            continue
        batches += 1
        results += int(event.data.get("results", 0))
        replies += int(event.data.get("replies", 0))
        saved += int(event.data.get("tokens_before", 0)) - int(event.data.get("tokens_after", 0))
    return {"batches": batches, "masked_results": results, "masked_replies": replies, "tokens_saved": saved}


@ctxkernel.hookimpl
def validate_profile(profile: Profile, report: ValidationReport) -> None:
    checks = STRATEGY.validating(profile, report)
    if checks is None:
        return
    strategies = profile.profile.strategies
    offering = [name for name in HISTORY_STRATEGIES if name in strategies]
    if offering:
        checks.fail(
            "recall",
            f"mask offers the history tools ({READ_TOOL} and the others) itself once something is masked, and "
            f"{offering} offers them too: two strategies cannot offer one tool. Fix: remove {offering} from "
            "[profile] strategies",
        )
    else:
        checks.ok("recall", f"placeholders name {READ_TOOL}, which mask offers once something is masked")
    try:
        settings: MaskSettings = STRATEGY.settings_for(profile)
    except ctxkernel.ProfileError:
        return  # the kernel's settings check names the invalid key
    window = profile.model.effective_window
    tail = min(settings.tail_tokens, int(settings.tail_ratio * window))
    checks.ok(
        "budget",
        f"verbatim tail {tail} tokens, batches of at least {settings.clear_at_least} tokens, "
        f"pressure at {int(settings.pressure_ratio * window)} of {window} tokens",
    )
