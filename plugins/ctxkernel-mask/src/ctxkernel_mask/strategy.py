"""The ``mask`` strategy's declaration: its name, settings model and capabilities, written once."""

from __future__ import annotations

import ctxkernel

from .settings import MaskSettings

NAME = "mask"

STRATEGY = ctxkernel.Strategy(
    NAME,
    MaskSettings,
    capabilities={"observation", "recall"},  # recall: its placeholders name ids its history tools read back
    description="observation masking: old tool outputs become a one-line placeholder, in cache-friendly batches",
)
