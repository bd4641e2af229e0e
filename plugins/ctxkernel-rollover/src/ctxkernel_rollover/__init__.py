"""ctxkernel-rollover: summary-free context rollover with a UUIDv7 window chain and notes.

The strategy module is :mod:`ctxkernel_rollover.plugin` (entry point ``rollover`` in group
``ctxkernel.strategies``). Integrators may inject a note on the user's behalf with
:func:`inject_note`.
"""

from .plugin import RolloverSettings, inject_note
from .switch import RolloverError
from .window_ids import is_uuid7, next_window_id

__all__ = ["RolloverError", "RolloverSettings", "inject_note", "is_uuid7", "next_window_id"]
