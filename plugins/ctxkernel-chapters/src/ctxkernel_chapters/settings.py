"""Settings of the ``chapters`` strategy (``[strategies.chapters]``, overridable per model).

Per-model values come from the profile's ``[[model_policies]]`` tables (the seed insists: some
models have huge windows, some 32K, and one flat number serves neither).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: the largest token count a setting may hold (no model window comes near it)
MAX_TOKENS = 100_000_000


class ChaptersSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: archive the head of the surface as chapters at this share of the effective window
    compact_at_ratio: float = Field(default=0.90, gt=0, le=1)
    #: share of the effective window kept verbatim after an in-place compaction
    retain_ratio: float = Field(default=0.16, ge=0, lt=1)
    #: table of contents + handoff note may take at most this share of the window left after
    #: the system prompt and tool schemas (a continuation preflight, never a truncation)
    continuation_budget_ratio: float = Field(default=0.25, gt=0, le=1)
    #: segmentation aims at chapters of about this many tokens, split at turn boundaries
    chapter_token_target: int = Field(default=8_000, ge=200, le=MAX_TOKENS)
    #: tool results at or below this stay inline in chapters; larger ones are itemised as artifacts
    tool_result_defer_floor_tokens: int = Field(default=200, ge=0, le=MAX_TOKENS)
    #: a tool result above this is moved to the artifact store before the next request
    tool_result_artifact_tokens: int = Field(default=6_000, ge=1, le=MAX_TOKENS)
    #: ... or above this share of the effective window, whichever is smaller (small windows)
    tool_result_artifact_ratio: float = Field(default=0.2, gt=0, le=1)
    #: characters of a result kept as a preview in its artifact handle
    artifact_preview_chars: int = Field(default=600, ge=0, le=20_000)
    #: the folder chapter paths are shown under and exported to (ctxkernel export); the files
    #: themselves are in the store's blobs
    archive_root: str = "chapters"
    #: budget of the table-of-contents bullets; over it, the oldest bullets lose their summaries
    toc_bullet_budget_tokens: int = Field(default=2_000, ge=100, le=MAX_TOKENS)
    #: the user's own messages of the archived part are quoted verbatim in the table of contents,
    #: newest first, within this many tokens (0: none)
    toc_instruction_budget_tokens: int = Field(default=1_500, ge=0, le=MAX_TOKENS)
    #: tell the model that continuing in a new session is available at this share of the window
    pressure_suggestion_ratio: float = Field(default=0.75, gt=0, le=1)
    #: archive in place automatically in pre_step (off: only on overflow)
    auto: bool = True
    #: extra attempts when an in-place compaction fails its shrink or stability check
    compaction_retries: int = Field(default=1, ge=0, le=5)
    #: extra attempts on a provider context overflow
    overflow_retries: int = Field(default=1, ge=0, le=5)
    #: what the simulator's steward does at the suggestion: "continue" (call chapters_continue)
    #: or "compact" (leave it to the in-place compaction)
    steward: Literal["continue", "compact"] = "continue"
    #: lines returned by one page of chapters_read / chapters_artifact read
    read_page_lines: int = Field(default=200, ge=10, le=5_000)

    @model_validator(mode="after")
    def _consistent(self) -> ChaptersSettings:
        if self.pressure_suggestion_ratio >= self.compact_at_ratio:
            msg = (
                f"pressure_suggestion_ratio ({self.pressure_suggestion_ratio}) must be below compact_at_ratio "
                f"({self.compact_at_ratio}): the suggestion has to come before the automatic archive"
            )
            raise ValueError(msg)
        if self.retain_ratio >= self.compact_at_ratio:
            msg = f"retain_ratio ({self.retain_ratio}) must be below compact_at_ratio ({self.compact_at_ratio})"
            raise ValueError(msg)
        if self.tool_result_defer_floor_tokens > self.tool_result_artifact_tokens:
            msg = (
                f"tool_result_defer_floor_tokens ({self.tool_result_defer_floor_tokens}) must not exceed "
                f"tool_result_artifact_tokens ({self.tool_result_artifact_tokens})"
            )
            raise ValueError(msg)
        return self

    def artifact_threshold(self, effective_window: int) -> int:
        """Tokens above which a tool result becomes an artifact on arrival."""
        by_window = int(self.tool_result_artifact_ratio * effective_window)
        return max(self.tool_result_defer_floor_tokens, min(self.tool_result_artifact_tokens, by_window))
