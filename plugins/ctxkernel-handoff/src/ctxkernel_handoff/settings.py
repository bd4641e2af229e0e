"""The ``[strategies.handoff]`` settings, with the seed's keys and semantics."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HANDOFF_MIN_CHARS = 8_000
HANDOFF_MAX_CHARS = 32_000
HANDOFF_DEFAULT_CHARS = 16_000


class ModelStrategy(BaseModel):
    """One entry of ``model_policies``: the strategy for an exact provider/model pair."""

    model_config = ConfigDict(extra="forbid")

    provider: str
    model: str
    strategy: Literal["window", "native"]


class HandoffSettings(BaseModel):
    """Settings of the ``handoff`` strategy (unknown keys are refused).

    ``enabled``             context management for every session of this kernel (the runtime toggle
                            ``kernel.set_strategy_enabled("handoff", ...)`` switches it without a restart)
    ``override_compaction`` automatic, manual and overflow compactions switch windows; off, they use the
                            native (``basic``) summaries while the tools stay and ``new_context`` still works
    ``inject_tools``        provide ``new_context`` and the notes/history tools; off, every compaction is
                            native, so history is never trimmed without a way to recover it
    ``default_strategy``    ``window`` or ``native`` (the kernel's ``basic``) for models not in ``model_policies``
    ``model_policies``      ``[{provider, model, strategy}]``, exact matches, the first match wins
    ``handoff_summary``     ``generated`` (one summarizer call per switch) or ``extractive`` (no model call)
    ``handoff_max_chars``   the whole handoff's character budget, 8,000-32,000
    ``handoff_max_ratio``   ... and at most this share of the effective window in tokens (small windows)
    ``switch_free_ratio``   a switch opens the new window at most this share of the effective window below
                            the threshold, so the next one is that much growth away (when the kept tail
                            allows it: the newest call and its results are always kept whole)
    ``min_switch_interval_steps`` a threshold switch waits this many steps after the last switch while the
                            next request still fits the window (0: no wait); overflows, ``new_context`` and
                            manual switches never wait
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = True
    override_compaction: bool = True
    inject_tools: bool = True
    default_strategy: Literal["window", "native"] = "window"
    model_policies: list[ModelStrategy] = Field(default_factory=list)
    handoff_summary: Literal["generated", "extractive"] = "generated"
    handoff_max_chars: int = Field(default=HANDOFF_DEFAULT_CHARS, ge=HANDOFF_MIN_CHARS, le=HANDOFF_MAX_CHARS)
    handoff_max_ratio: float = Field(default=0.1, gt=0, le=0.5)
    switch_free_ratio: float = Field(default=0.3, ge=0.05, lt=1)
    min_switch_interval_steps: int = Field(default=3, ge=0, le=1_000)

    def strategy_for(self, provider: str | None, model: str | None) -> str:
        """``window`` or ``native`` for a provider/model (first exact match, else the default)."""
        for policy in self.model_policies:
            if policy.provider == provider and policy.model == model:
                return policy.strategy
        return self.default_strategy
