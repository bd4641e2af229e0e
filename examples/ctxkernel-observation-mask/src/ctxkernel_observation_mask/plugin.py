"""Observation masking: tool results older than the last ``keep_last`` are replaced by a short
placeholder, through one-node tool-result replacements (the cheap, model-free reduction that
OpenHands and SWE-agent ship). The call and its result stay paired; only the content changes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

import ctxkernel


class MaskSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: how many of the newest tool results stay verbatim
    keep_last: int = Field(default=5, ge=1, le=100_000)
    #: results shorter than this many characters are never masked (a mask would not pay)
    min_chars: int = Field(default=400, ge=0, le=100_000_000)
    placeholder: str = "[output of {name} omitted: {chars} characters; re-run the tool to see it]"


STRATEGY = ctxkernel.Strategy("observation-mask", MaskSettings, capabilities={"observation"})


@ctxkernel.hookimpl
def register_strategy(register: Any) -> None:
    register(STRATEGY.spec)


@ctxkernel.hookimpl
def pre_step(ctx: ctxkernel.Context, step: ctxkernel.StepContext) -> None:
    mask = STRATEGY.on(ctx)
    settings = mask.settings  # a MaskSettings, validated for the routed model
    results = [n for n in ctx.surface.nodes if n.role == "tool"]
    for node in results[: -settings.keep_last]:
        result = node.message.tool_result
        if result is None or node.pruned or len(result.content) < settings.min_chars:
            continue  # already masked, or too small to be worth it
        text = settings.placeholder.format(name=result.name or "tool", chars=len(result.content))
        mask.replace_tool_result(node.seq, text, reason="mask")


@ctxkernel.hookimpl
def project(ctx: ctxkernel.Context) -> dict[str, Any]:
    masked = sum(1 for n in ctx.surface.nodes if n.pruned)
    return {"masked_results": masked}
