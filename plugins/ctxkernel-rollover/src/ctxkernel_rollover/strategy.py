"""The ``rollover`` strategy's declaration: its name, settings model and capabilities, written
once; every module reaches the session through ``STRATEGY.on(ctx)``."""

from __future__ import annotations

import ctxkernel

from .settings import RolloverSettings

NAME = "rollover"

STRATEGY = ctxkernel.Strategy(
    NAME,
    RolloverSettings,
    capabilities={"pressure", "overflow", "windows", "notes", "history"},
    description="summary-free rollover: a new window seeded with model-authored notes, never a summary",
)
