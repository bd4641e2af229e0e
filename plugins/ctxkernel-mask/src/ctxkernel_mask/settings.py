"""The ``mask`` strategy's settings (``[strategies.mask]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: the history tools mask can offer; ``history_read_item`` is always among them (placeholders name it)
RecallTool = Literal["history_search_contents", "history_read_item", "history_list_items", "history_list_windows"]


def _search_and_read() -> list[RecallTool]:
    return ["history_search_contents", "history_read_item"]


class MaskSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: tokens of the newest surface before the current step kept verbatim (the verbatim tail): no
    #: result in it is masked unless the window is under pressure. Older results are masked with
    #: or without pressure. 0: only the current step's results (the ones the model asked for last)
    #: stay verbatim; the history tools bring back the rest
    tail_tokens: int = Field(default=0, ge=0, le=10_000_000)
    #: the tail takes at most this share of the effective window (small windows)
    tail_ratio: float = Field(default=0.15, ge=0, le=1)
    #: a batch is cleared only when it saves at least this many tokens; above that, the prompt
    #: cache's break-even rule picks the batch (the one whose saving most exceeds the cost of the
    #: cached prefix it rewrites), so the prefix is rewritten only when that pays
    clear_at_least: int = Field(default=300, ge=1, le=10_000_000)
    #: at this share of the effective window masking no longer waits for a full batch, and may
    #: reach into the verbatim tail (never into the current step)
    pressure_ratio: float = Field(default=0.7, gt=0, le=1)
    #: results (and call arguments) under this many tokens are never masked: a mask would not pay
    min_tokens: int = Field(default=100, ge=0, le=10_000_000)
    #: tools whose results are never masked (e.g. a todo list the model re-reads)
    exclude_tools: list[str] = Field(default_factory=list, max_length=200)
    #: an error result keeps this many of its first lines (and at most ``error_chars`` characters)
    error_lines: int = Field(default=5, ge=0, le=200)
    error_chars: int = Field(default=800, ge=0, le=100_000)
    #: a reply whose tool-call arguments take at least this many tokens is masked with its results
    #: (the arguments' digest stays); 0 never masks arguments
    args_tokens: int = Field(default=250, ge=0, le=10_000_000)
    #: characters of a call's arguments shown in its placeholder (paths and commands first)
    digest_chars: int = Field(default=200, ge=20, le=10_000)
    #: the history tools (about 1,100 tokens of schemas in every request) are offered only on an
    #: effective window of at least this many tokens: below it they would take the room masking
    #: freed, and the request could overflow (what is masked stays in the log, not recallable)
    recall_min_window: int = Field(default=8_000, ge=0, le=10_000_000)
    #: which history tools come with the first mask: each schema is paid on every request after
    #: it, so the default is search (find by a word you saw) and read (by the id a placeholder
    #: names), about 280 tokens against about 600 for all four
    recall_tools: list[RecallTool] = Field(default_factory=_search_and_read, min_length=1, max_length=4)

    @model_validator(mode="after")
    def _checked(self) -> MaskSettings:
        if self.tail_ratio >= self.pressure_ratio:
            msg = f"tail_ratio ({self.tail_ratio}) must be below pressure_ratio ({self.pressure_ratio})"
            raise ValueError(msg)
        if "history_read_item" not in self.recall_tools:
            msg = f"recall_tools {self.recall_tools} must include history_read_item: every placeholder names it"
            raise ValueError(msg)
        if len(set(self.recall_tools)) != len(self.recall_tools):
            msg = f"recall_tools {self.recall_tools} names a tool twice"
            raise ValueError(msg)
        for name in self.exclude_tools:
            if not name or len(name) > 256:
                msg = f"exclude_tools holds a name of {len(name)} characters; names are 1-256 characters"
                raise ValueError(msg)
        return self
