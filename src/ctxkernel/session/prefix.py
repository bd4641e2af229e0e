"""What a request repeats of the one before it: the prefix the provider's prompt cache can serve.

Each request the session composes is remembered as its header's hash and, per message, a key
(the surface node's seq; with a decoration, the seq and the decorated text) and the tokens up to
and including it, header first. The next request's ``cache_prefix_tokens`` is the longest run it
shares with that one, key for key, under the same header; a strategy's edit at a position throws
away what the previous request cached from there on (:meth:`PrefixTracker.cached_from`, the input
of the break-even rule, ``ctxkernel.cache_rule``).

A Session opened on an existing log rebuilds the previous request from the log: the surface nodes
older than the last ``step/start``, in order, under the header then in force. Decorations are
presentation and not in the log, so after a restart a decorated message counts as unchanged.
"""

from __future__ import annotations

import bisect
import datetime as _dt
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import events as ev
from ..events import now_seconds

if TYPE_CHECKING:
    from ..context import Request
    from ..meter import Meter
    from ..surface import Surface
    from .log import SessionLog
    from .tooling import Tooling
    from .track import Tracker


@dataclass(frozen=True)
class SentRequest:
    """The request sent last, as the cache sees it."""

    digest: str  # the header's hash
    header_tokens: int
    keys: list[Hashable]  # per message
    ends: list[int]  # tokens up to and including each message, the header included
    time: float  # seconds since the epoch (the replay clock's in a simulation)
    last_seq: int  # the seq of its last message (-1 when it held none)

    @property
    def tokens(self) -> int:
        return self.ends[-1] if self.ends else self.header_tokens


def _shared(a: list[Hashable], b: list[Hashable]) -> int:
    """How many leading keys ``a`` and ``b`` share (list comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    # the largest k with a[:k] == b[:k]: prefixes agree up to some k, and disagree after it
    return bisect.bisect_left(range(n + 1), True, key=lambda k: a[:k] != b[:k]) - 1


def _seconds(stamp: str) -> float | None:
    try:
        return _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class PrefixTracker:
    """One session's memory of the request it sent last."""

    def __init__(self, log: SessionLog, tracker: Tracker, surface: Surface, meter: Meter, tooling: Tooling) -> None:
        self.log = log
        self.tracker = tracker
        self.surface = surface
        self.meter = meter
        self.tooling = tooling
        self._previous: SentRequest | None = None
        self._rebuilt = False

    @property
    def previous(self) -> SentRequest | None:
        if self._previous is None and not self._rebuilt:
            self._rebuilt = True
            self._previous = self._from_log()
        return self._previous

    def sent(self, request: Request, header_tokens: int, digest: str) -> tuple[int, int]:
        """Remember ``request`` as the one sent last; returns ``(tokens, messages)`` it repeats of
        the request before it (the header's tokens count when the header is unchanged). A request
        that extends the previous one (the common case) counts only its new messages."""
        meter, nodes = self.meter, self.surface.nodes
        previous = self.previous
        keys: list[Hashable]
        if request.decorated:
            keys = []
            for index, node in enumerate(nodes):
                message = request.messages[index]
                keys.append((node.seq, hash(message.text)) if index in request.decorated else node.seq)
        else:
            keys = list(request.seqs)
        kept = 0
        if previous is not None and previous.header_tokens == header_tokens:
            kept = _shared(previous.keys, keys)
        ends = previous.ends[:kept] if previous is not None and kept else []
        total = ends[-1] if ends else header_tokens
        for index in range(kept, len(nodes)):
            node = nodes[index]
            if index in request.decorated:
                total += meter.decorated_tokens(node.seq, request.messages[index])
            else:
                total += meter.node_tokens(node)
            ends.append(total)
        last = nodes[-1].seq if nodes else -1
        self._previous = SentRequest(digest, header_tokens, keys, ends, now_seconds(), last)
        if previous is None or previous.digest != digest:
            return 0, 0
        shared = kept if previous.header_tokens == header_tokens else _shared(previous.keys, keys)
        return (previous.ends[shared - 1] if shared else header_tokens), shared

    def cached_from(self, position: int) -> int:
        """Tokens of the previous request, from surface position ``position`` to the end of what
        the surface still shares with it: what an edit starting there makes the provider write
        again. 0 when the header changed since (nothing of it is read from the cache anyway)."""
        previous = self.previous
        if previous is None or previous.digest != self.tracker.header_hash:
            return 0
        shared = _shared(previous.keys, [n.seq for n in self.surface.nodes])
        if position >= shared:
            return 0
        before = previous.ends[position - 1] if position > 0 else previous.header_tokens
        return previous.ends[shared - 1] - before

    def idle_seconds(self) -> float:
        """Seconds since the previous request (infinite before the first)."""
        previous = self.previous
        return float("inf") if previous is None else max(0.0, now_seconds() - previous.time)

    def _from_log(self) -> SentRequest | None:
        events = self.log.events
        start = None
        for i in range(len(events) - 1, -1, -1):
            if events[i].type == ev.STEP_START:
                start = events[i]
                break
        if start is None or self.tracker.header_hash is None:
            return None
        _, _, digest, header_tokens = self.tooling.compose()
        if digest != self.tracker.header_hash:
            return None
        keys: list[Hashable] = []
        ends: list[int] = []
        total = header_tokens
        for node in self.surface.nodes:
            if node.seq >= start.seq:
                break
            keys.append(node.seq)
            total += self.meter.node_tokens(node)
            ends.append(total)
        moment = _seconds(start.time)
        last = keys[-1] if keys else -1
        return SentRequest(digest, header_tokens, keys, ends, now_seconds() if moment is None else moment, last)  # type: ignore[arg-type]

    def calls_since(self) -> list[str]:
        """The names of the tools the model called since the request sent last (all of them
        before the first)."""
        previous = self.previous
        after = previous.last_seq if previous is not None else -1
        names: list[str] = []
        for node in reversed(self.surface.nodes):
            if node.seq <= after:
                break
            if node.role == "assistant":
                names.extend(c.name for c in node.message.tool_calls)
        return names


__all__ = ["PrefixTracker", "SentRequest"]
