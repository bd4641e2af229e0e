"""UUIDv7 window ids (RFC 9562), monotonic within a session's window chain.

Ids are monotonic within one process (the millisecond is bumped when the clock has not advanced
past the last id's, as ``uuid6.uuid7()`` does). A session's chain can outlive a process and move
between hosts whose clocks disagree, so :func:`next_window_id` also compares with the previous id
of the chain, read from the log, and when the clock is behind it takes the previous id's
millisecond plus one: ids sort in chain order whatever the clocks did.

The id is built from its integer and formatted directly (RFC 9562 §5.7 layout): ``uuid6.uuid7()``
and ``uuid.UUID`` objects cost ~3x as much, a switch's share of which was ~0.02-0.03 ms.
"""

from __future__ import annotations

import secrets
import time
import uuid

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


#: the millisecond of the last id this process made (ids are monotonic within the process)
_last_ms = -1
_MS_MASK = (1 << 48) - 1
#: the version (7) and variant (0b10) bits of a UUIDv7, around 76 random bits
_VERSION_BITS = 0x7 << 76
_VARIANT_BITS = 0x2 << 62
_LOW_62 = (1 << 62) - 1


def _format(value: int) -> str:
    """The canonical 8-4-4-4-12 lower-case text of a 128-bit UUID integer."""
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def next_window_id(previous: str | None = None) -> str:
    """A fresh UUIDv7 that sorts after ``previous`` (the chain's current window id) and after
    every id this process made before."""
    global _last_ms  # noqa: PLW0603 - the process-wide monotonic clock, as uuid6 keeps it
    ms = time.time_ns() // 1_000_000
    if ms <= _last_ms:
        ms = _last_ms + 1
    _last_ms = ms  # the process's clock only: a chain's bump below never moves it
    if previous is not None:
        # the clock is behind the chain (another host, or a clock step back): advance the chain's
        # own millisecond so order still follows the chain, as RFC 9562 §6.2 allows
        ms = max(ms, timestamp_ms(previous) + 1)
    ms &= _MS_MASK
    rand = secrets.randbits(76)  # 12 bits before the variant, 62 after it (2 spare bits dropped)
    value = (ms << _TS_SHIFT) | _VERSION_BITS | ((rand >> 62) & 0xFFF) << 64 | _VARIANT_BITS | (rand & _LOW_62)
    return _format(value)
