"""The ``handoff`` strategy's declaration: its name, settings model and capabilities, written
once; every module reaches the session through ``STRATEGY.on(ctx)``."""

from __future__ import annotations

import ctxkernel

from .settings import HandoffSettings

NAME = "handoff"

STRATEGY = ctxkernel.Strategy(
    NAME,
    HandoffSettings,
    capabilities={"pressure", "overflow", "windows", "notes", "history"},
    description="windowed handoff: bounded handoffs between context windows, session notes and history recall",
)
