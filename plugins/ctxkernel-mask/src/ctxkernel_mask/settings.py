"""The ``mask`` strategy's settings (``[strategies.mask]``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MaskSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: tokens of the newest surface kept verbatim (the verbatim tail): no result in it is masked
    #: unless the window is under pressure
    tail_tokens: int = Field(default=4_000, ge=0, le=10_000_000)
    #: the tail takes at most this share of the effective window (small windows)
    tail_ratio: float = Field(default=0.15, ge=0, le=1)
    #: a batch is cleared only when it saves at least this many tokens, so the cached prefix is
    #: rewritten rarely (each batch rewrites the cache from its first masked result on)
    clear_at_least: int = Field(default=4_000, ge=1, le=10_000_000)
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

    @model_validator(mode="after")
    def _checked(self) -> MaskSettings:
        if self.tail_ratio >= self.pressure_ratio:
            msg = f"tail_ratio ({self.tail_ratio}) must be below pressure_ratio ({self.pressure_ratio})"
            raise ValueError(msg)
        for name in self.exclude_tools:
            if not name or len(name) > 256:
                msg = f"exclude_tools holds a name of {len(name)} characters; names are 1-256 characters"
                raise ValueError(msg)
        return self
