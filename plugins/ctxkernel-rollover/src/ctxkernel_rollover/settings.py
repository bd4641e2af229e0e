"""The ``rollover`` strategy's settings (``[strategies.rollover]``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RolloverSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: share of the effective window at which the single reminder of a window is shown
    reminder_ratio: float = Field(default=0.75, gt=0, lt=1)
    #: share of the effective window at which a new window starts by itself
    rollover_ratio: float = Field(default=0.90, gt=0, le=1)
    #: most of the effective window a seed message may take
    seed_ratio: float = Field(default=0.25, gt=0, le=0.5)
    #: characters of one note shown in a seed (the rest is read with note_get)
    seed_note_chars: int = Field(default=8_000, ge=200, le=200_000)
    #: characters of the goal shown in a seed
    goal_chars: int = Field(default=4_000, ge=200, le=100_000)
    #: characters of the pending user input shown in a seed (the full text stays in the history)
    pending_input_chars: int = Field(default=16_000, ge=200, le=400_000)
    #: earlier user instructions repeated verbatim in a seed (the user's words, never summarised)
    instructions_count: int = Field(default=8, ge=0, le=50)
    instructions_chars: int = Field(default=6_000, ge=0, le=200_000)
    #: notes kept in the seed of a protective (overflow) rollover, newest first
    protective_keep_notes: int = Field(default=8, ge=0, le=64)
    #: a tool result over this share of the effective window forces a protective rollover
    oversized_tool_result_ratio: float = Field(default=0.5, gt=0, le=1)
    #: protective rollovers in a row on provider overflows before the error is given up on
    overflow_retries: int = Field(default=1, ge=0, le=5)
    #: notes limits (per session): count, total bytes, bytes per note; over-limit writes are refused
    max_notes: int = Field(default=64, ge=1, le=10_000)
    max_notes_bytes: int = Field(default=4_000_000, ge=1_000, le=1_000_000_000)
    max_note_bytes: int = Field(default=1_000_000, ge=100, le=1_000_000_000)
    #: a profile that also runs a summarising strategy must say so here (seed §3.7)
    allow_summary_fallback: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> RolloverSettings:
        if self.reminder_ratio >= self.rollover_ratio:
            msg = f"reminder_ratio ({self.reminder_ratio}) must be below rollover_ratio ({self.rollover_ratio})"
            raise ValueError(msg)
        if self.max_note_bytes > self.max_notes_bytes:
            msg = f"max_note_bytes ({self.max_note_bytes}) cannot exceed max_notes_bytes ({self.max_notes_bytes})"
            raise ValueError(msg)
        return self
