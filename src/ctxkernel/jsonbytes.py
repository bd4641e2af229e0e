"""JSON bytes read from outside, and JSON bytes kept in memory.

**Read.** :func:`loads` reads JSON as orjson does, except that a lone surrogate escape (what a
JavaScript string cut inside an emoji, or ``json.dumps`` of an undecodable file name, writes)
becomes U+FFFD instead of refusing the whole document: ``serve`` reads client bodies and
provider replies with it, the HTTP model adapter its replies, ``simulate`` recordings.

**Kept.** Bytes serialised once and held (a snapshot's nodes between snapshots, a client history
remembered for the next request) are sized to what they hold.

``orjson.dumps`` returns a ``bytes`` object whose allocation is its working buffer: since orjson
3.12 at least 4 KiB, and for a larger document the buffer grown to a power of two past a
reservation of several times its size (its final resize is a no-op), while ``len`` and
``sys.getsizeof`` report only the bytes written. Held by the thousand, those buffers were most of
what ``serve`` kept per session: 12 times the client's body for a snapshot writer's nodes at
100k tokens, and 4 KiB for a one-character message (``tracemalloc``, ``bench_serve.py``). A
transient result (parsed, written, compared, then dropped) needs none of this.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from .text import storable


def kept(data: bytes) -> bytes:
    """``data`` in an allocation of its own size (one copy: ``bytes.join`` allocates exactly
    what it joins, the cheapest copy CPython has for this)."""
    return b"".join((data, b""))


def dumps_kept(value: Any, option: int | None = None) -> bytes:
    """``orjson.dumps(value, option=option)`` in an allocation of its own size, for bytes that are
    kept (:func:`kept`)."""
    return kept(orjson.dumps(value, option=option))


def no_constant(name: str) -> Any:
    """``parse_constant`` for :func:`json.loads`: ``NaN`` and ``Infinity`` are not JSON (orjson
    refuses them too)."""
    msg = f"{name} is not JSON"
    raise ValueError(msg)


def int_or_float(text: str) -> int | float:
    """``parse_int`` for :func:`json.loads`: an integer as orjson reads it (past 64 bits, a float)."""
    value = int(text)
    return value if -(2**63) <= value < 2**64 else float(value)


def loads(raw: bytes | str) -> Any:
    """JSON as orjson reads it, except that a string holding a lone surrogate escape
    (``"\\udce9"``: what ``json.dumps`` writes for a file name ``os.listdir`` could not decode)
    is read too, each lone surrogate becoming U+FFFD (``ctxkernel.text.storable``), instead of
    refusing the whole body. Anything else orjson refuses is refused (``JSONDecodeError``).
    Used for what comes from outside: ``serve``'s clients and upstream, the HTTP model adapter,
    ``simulate``'s recordings."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "surrogate" not in str(exc):
            raise
        try:
            value = json.loads(raw, parse_constant=no_constant, parse_int=int_or_float)
        except (ValueError, RecursionError):
            raise exc from None
        return storable(value)
