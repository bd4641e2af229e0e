"""UUIDv7 window ids (RFC 9562), monotonic within a session's window chain.

``uuid6.uuid7()`` is monotonic within one process (it bumps the millisecond when the clock has
not advanced). A session's chain can outlive a process and move between hosts whose clocks
disagree, so :func:`next_window_id` also compares with the previous id of the chain, read from
the log, and when the clock is behind it takes the previous id's millisecond plus one: ids sort
in chain order whatever the clocks did.
"""

from __future__ import annotations

import uuid

import uuid6

from ctxkernel.events import now_seconds, random_bits, replaying

_TS_SHIFT = 80


def timestamp_ms(window_id: str) -> int:
    """The 48-bit Unix millisecond timestamp of a UUIDv7."""
    return uuid.UUID(window_id).int >> _TS_SHIFT


def is_uuid7(value: str) -> bool:
    try:
        parsed = uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return parsed.version == 7 and parsed.variant == uuid.RFC_4122 and str(parsed) == value


def next_window_id(previous: str | None = None) -> str:
    """A fresh UUIDv7 that sorts after ``previous`` (the chain's current window id); in a replay,
    from the replay's clock and seed (``ctxkernel.events.replay_clock``)."""
    if replaying():
        ms = int(now_seconds() * 1000) & ((1 << 48) - 1)
        candidate = uuid6.UUID(int=(ms << _TS_SHIFT) | random_bits(76), version=7)
    else:
        candidate = uuid6.uuid7()
    if previous is None:
        return str(candidate)
    prev = uuid.UUID(previous)
    if candidate.int > prev.int:
        return str(candidate)
    # the clock is behind the chain (another host, or a clock step back): advance the chain's
    # own millisecond so order still follows the chain, as RFC 9562 §6.2 allows
    ts = ((prev.int >> _TS_SHIFT) + 1) & ((1 << 48) - 1)
    # uuid6.UUID accepts version 7 on every Python (the standard class only from 3.14)
    return str(uuid6.UUID(int=(ts << _TS_SHIFT) | random_bits(76), version=7))
