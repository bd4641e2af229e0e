"""ctxkernel strategy ``handoff``: windowed handoffs with session notes and history recall.

Integrators ask for a manual compaction (the seed's ``/compact``) with ``session.compact_now()``,
which calls :func:`compact_now` with the session's ``ctx`` (``compact_now(session.context)`` does
the same directly); the rest runs through the kernel's hooks once ``handoff`` is in a profile's
strategies.
"""

from .engine import Mode, SwitchOutcome, compact_now, mode_for, request_new_context, switch
from .settings import HandoffSettings, ModelStrategy
from .tools import TOOL_NAMES

__all__ = [
    "TOOL_NAMES",
    "HandoffSettings",
    "Mode",
    "ModelStrategy",
    "SwitchOutcome",
    "compact_now",
    "mode_for",
    "request_new_context",
    "switch",
]
