"""The ``decay`` strategy's declaration, settings and position state.

State (the handle's ``state["state"]``) is folded from the log with a cursor, so each request
costs O(new events). It is part of the session's snapshots (``snapshot_state``): a session opened
from one starts from the state it holds and folds only the events after it; a snapshot without
it, of another :data:`STATE_VERSION` or malformed, costs one fold from the start of the log. The
hooks (``plugin``), the tools and the steward all read it from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

import ctxkernel

from .state import NAME, DecayState, replay

if TYPE_CHECKING:
    from ctxkernel import Context

log = ctxkernel.get_logger("ctxkernel.decay")
#: the format of the position state in session snapshots (:meth:`DecayState.to_dict`): bump it
#: whenever that shape changes, so a snapshot written by an older plugin is folded from the start
STATE_VERSION = 1


#: the largest token count a setting may hold (no model window comes near it)
MAX_TOKENS = 100_000_000


class DecaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: a normal reminder after this much growth (tokens) since the last reminder or compression
    growth_tokens: int = Field(default=24_000, ge=1, le=MAX_TOKENS)
    #: warning levels as fractions of the effective window
    warn_ratios: list[float] = Field(default_factory=lambda: [0.70, 0.81, 0.95], max_length=16)
    #: steps before the same reminder level may fire again
    cooldown_steps: int = Field(default=4, ge=0, le=10_000)
    #: spans per compress call
    max_spans: int = Field(default=8, ge=1, le=64)
    #: characters per span summary (after anchors are stripped)
    # le: the compress schema's caps (tools.SUMMARY_CHARS_CAP, TOPIC_CHARS_CAP) bound what a profile may allow
    summary_max_chars: int = Field(default=6_000, ge=100, le=100_000)
    topic_max_chars: int = Field(default=80, ge=1, le=1_000)
    #: refuse compressions that do not pay back their prefix-cache miss (below the first warning)
    cost_guard: bool = False
    #: price of a cached input token relative to an uncached one
    cached_input_ratio: float = Field(default=0.1, gt=0, lt=1)
    payback_max_requests: int = Field(default=50, ge=1, le=1_000_000)
    min_saving_tokens: int = Field(default=1, ge=1, le=MAX_TOKENS)
    #: the steward (simulation) compresses down to this share of the effective window
    steward_target_ratio: float = Field(default=0.45, gt=0, lt=1)
    #: one JSONL record per request and compression, in the store (ctxkernel export: decay/audit.jsonl)
    audit: bool = False
    #: put the position state into the session's snapshots, so an open folds only the events
    #: after the snapshot (a cache: always rebuildable from the log)
    snapshot: bool = True

    @field_validator("warn_ratios")
    @classmethod
    def _ratios(cls, value: list[float]) -> list[float]:
        if not value or any(not 0 < r <= 1 for r in value) or value != sorted(set(value)):
            msg = f"warn_ratios must be increasing fractions in (0, 1], e.g. [0.70, 0.81, 0.95]; got {value}"
            raise ValueError(msg)
        return value


STRATEGY = ctxkernel.Strategy(
    NAME,
    DecaySettings,
    capabilities={"pressure", "decoration", "tools"},
    description="position anchors; the model compresses old spans into summary blocks when reminded",
)


def settings_of(ctx: Context) -> DecaySettings:
    return STRATEGY.on(ctx).settings


# -- state -------------------------------------------------------------------------------------------
def current_state(ctx: Context) -> DecayState:
    """The position state, folded up to the session's last event."""
    holder = STRATEGY.on(ctx).state
    if "state" not in holder:
        load_state(ctx)
    state: DecayState = holder["state"]
    if state.cursor > len(ctx.events):  # our log view went backwards: never trust it
        holder.clear()
        holder.update(state=replay(ctx.events), source="replay (state ahead of log)")
        state = holder["state"]
    state.fold(ctx.events)
    return state


def load_state(ctx: Context) -> dict[str, Any]:
    """From the session's snapshot when it was opened from one holding this state (then only the
    events after it are folded), else from the start of the log."""
    decay = STRATEGY.on(ctx)
    state = decay.restored(version=STATE_VERSION, load=lambda data: _from_snapshot(data, ctx.events))
    holder = decay.state
    holder.clear()
    holder.update(state=state or DecayState(), source="replay" if state is None else "snapshot")
    return holder


def snapshot_state(ctx: Context) -> ctxkernel.StrategySnapshot | None:
    """The position state folded to the end of the log, for the session's snapshot."""
    if not _snapshots_on(ctx):
        return None
    return STRATEGY.on(ctx).snapshot(current_state(ctx).to_dict(), version=STATE_VERSION)


def _snapshots_on(ctx: Context) -> bool:
    try:
        return settings_of(ctx).snapshot
    except ctxkernel.CtxKernelError:  # settings are reported where they are used; a snapshot is optional
        return False


def _from_snapshot(data: dict[str, Any], events: Sequence[ctxkernel.Event]) -> DecayState:
    state = DecayState.from_dict(data)
    if not 0 < state.cursor <= len(events):
        msg = f"snapshot cursor {state.cursor} is outside the log (length {len(events)})"
        raise ValueError(msg)
    return state
