"""JSON bytes that are kept in memory: serialised once and held (a snapshot's nodes between
snapshots, a client history remembered for the next request), sized to what they hold.

``orjson.dumps`` returns a ``bytes`` object whose allocation is its working buffer: since orjson
3.12 at least 4 KiB, and for a larger document the buffer grown to a power of two past a
reservation of several times its size (its final resize is a no-op), while ``len`` and
``sys.getsizeof`` report only the bytes written. Held by the thousand, those buffers were most of
what ``serve`` kept per session: 12 times the client's body for a snapshot writer's nodes at
100k tokens, and 4 KiB for a one-character message (``tracemalloc``, ``bench_serve.py``). A
transient result (parsed, written, compared, then dropped) needs none of this.
"""

from __future__ import annotations

from typing import Any

import orjson


def kept(data: bytes) -> bytes:
    """``data`` in an allocation of its own size (one copy: ``bytes.join`` allocates exactly
    what it joins, the cheapest copy CPython has for this)."""
    return b"".join((data, b""))


def dumps_kept(value: Any, option: int | None = None) -> bytes:
    """``orjson.dumps(value, option=option)`` in an allocation of its own size, for bytes that are
    kept (:func:`kept`)."""
    return kept(orjson.dumps(value, option=option))
