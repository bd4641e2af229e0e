"""Model prices with the provider's prompt cache: a versioned table and a cache simulation.

``ctxkernel simulate`` prices every request with :class:`PromptCache`; a strategy that weighs
the cache (whether a compaction that breaks the cached prefix pays for itself) reads the same
figures: :attr:`ModelPrice.cache_write` and :attr:`ModelPrice.cache_read` against
:attr:`ModelPrice.input`, :attr:`ModelPrice.cache_ttl_seconds`, and
:meth:`ModelPrice.break_even_reads`.

::

    from ctxkernel.pricing import PromptCache, price_for
    price = price_for("claude-sonnet-4-5")
    cache = PromptCache(price)
    bill = cache.request(at=0.0, blocks=[("system", 3_000), ("msg 1", 200)])
    price.cost(bill, output_tokens=150)

The table (:data:`PRICES`, version :data:`PRICE_TABLE_VERSION`) holds list prices in US dollars
per million tokens, as the providers publish them (cross-checked with the ``genai-prices``
database, 0.2.5). Anthropic caches explicitly: a cache write costs 1.25x the input price with the
default 5-minute TTL, a cache read 0.1x, and a prefix shorter than the model's minimum is not
cached. OpenAI caches prompt prefixes of 1,024 tokens and more automatically, in steps of 128
tokens, at the model's cached-input price, with no write premium; a cached prefix lives 5 to 10
minutes of inactivity, and the table takes the lower bound.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Literal

#: the version of :data:`PRICES`; a change of any price is a new version
PRICE_TABLE_VERSION = "2026-12-07"
#: Anthropic's default cache lifetime (refreshed on every read), and OpenAI's lower bound
FIVE_MINUTES = 300.0


@dataclass(frozen=True)
class ModelPrice:
    """One model's prices, in US dollars per million tokens, and its prompt cache's rules."""

    model: str
    provider: Literal["anthropic", "openai"]
    input: float
    output: float
    #: a cached prefix read back (Anthropic 0.1x input; OpenAI the model's cached-input price)
    cache_read: float
    #: a prefix written to the cache (Anthropic 1.25x input for the 5-minute TTL; OpenAI: input)
    cache_write: float
    #: how long a cached prefix lives after its last use
    cache_ttl_seconds: float = FIVE_MINUTES
    #: prompts (Anthropic: cached prefixes) shorter than this are never cached
    cache_min_tokens: int = 1_024
    #: cached prefixes count in steps of this many tokens (OpenAI 128)
    cache_increment: int = 1
    #: ``explicit``: the harness marks the prefix to cache and every write is billed as one
    #: (Anthropic); ``automatic``: the provider caches on its own, writes cost the input price
    cache_mode: Literal["explicit", "automatic"] = "explicit"

    def cost(self, bill: Bill, output_tokens: int = 0) -> float:
        """US dollars for one bill (or a sum of bills) and ``output_tokens``."""
        total = (
            bill.uncached * self.input
            + bill.cache_read * self.cache_read
            + bill.cache_write * self.cache_write
            + output_tokens * self.output
        )
        return total / 1_000_000

    def break_even_reads(self) -> float | None:
        """How many reads of a cached prefix repay writing it: the write premium over the input
        price, divided by what a read saves (0 with no premium; None when a read saves nothing)."""
        saving = self.input - self.cache_read
        if saving <= 0:
            return None
        return max(0.0, self.cache_write - self.input) / saving

    def with_prices(self, input: float, cached_input: float, output: float) -> ModelPrice:
        """The same cache rules at other prices; a cache write keeps its ratio to the input price."""
        ratio = self.cache_write / self.input if self.input else 1.0
        return replace(self, input=input, cache_read=cached_input, output=output, cache_write=input * ratio)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "provider": self.provider,
            "input": self.input,
            "output": self.output,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
            "cache_ttl_seconds": self.cache_ttl_seconds,
            "cache_min_tokens": self.cache_min_tokens,
            "cache_increment": self.cache_increment,
            "cache_mode": self.cache_mode,
        }


def _anthropic(model: str, input: float, output: float, min_tokens: int) -> ModelPrice:
    return ModelPrice(model, "anthropic", input, output, input * 0.1, input * 1.25, cache_min_tokens=min_tokens)


def _openai(model: str, input: float, output: float, cached: float) -> ModelPrice:
    return ModelPrice(model, "openai", input, output, cached, input, cache_increment=128, cache_mode="automatic")


#: list prices by model name (a dated name such as ``gpt-4o-2024-08-06`` finds ``gpt-4o``)
PRICES: dict[str, ModelPrice] = {
    p.model: p
    for p in (
        _anthropic("claude-opus-4-6", 5.0, 25.0, 4_096),
        _anthropic("claude-opus-4-5", 5.0, 25.0, 4_096),
        _anthropic("claude-opus-4-1", 15.0, 75.0, 1_024),
        _anthropic("claude-opus-4", 15.0, 75.0, 1_024),
        _anthropic("claude-sonnet-4-6", 3.0, 15.0, 2_048),
        _anthropic("claude-sonnet-4-5", 3.0, 15.0, 1_024),
        _anthropic("claude-sonnet-4", 3.0, 15.0, 1_024),
        _anthropic("claude-3-7-sonnet", 3.0, 15.0, 1_024),
        _anthropic("claude-3-5-sonnet", 3.0, 15.0, 1_024),
        _anthropic("claude-haiku-4-5", 1.0, 5.0, 4_096),
        _anthropic("claude-3-5-haiku", 0.8, 4.0, 2_048),
        _openai("gpt-4o", 2.5, 10.0, 1.25),
        _openai("gpt-4o-mini", 0.15, 0.6, 0.075),
        _openai("gpt-4.1", 2.0, 8.0, 0.5),
        _openai("gpt-4.1-mini", 0.4, 1.6, 0.1),
        _openai("gpt-5", 1.25, 10.0, 0.125),
        _openai("gpt-5-codex", 1.25, 10.0, 0.125),
        _openai("gpt-5-mini", 0.25, 2.0, 0.025),
        _openai("o4-mini", 1.1, 4.4, 0.275),
    )
}


class UnknownModelError(ValueError):
    """A model name the price table does not hold."""


#: what follows a model's name in a dated release of it: ``-20241022``, ``-2024-08-06``, ``-latest``
_RELEASE = re.compile(r"\d{8}|\d{4}-\d{2}-\d{2}|latest")


def price_for(model: str, *, releases_only: bool = False) -> ModelPrice:
    """The table's entry for ``model``: its exact name, else the longest name it extends with a
    ``-`` (a dated or suffixed release: ``claude-3-5-sonnet-20241022``). With ``releases_only``
    (``ctxkernel simulate --model``, whose bill it is), only a dated release (``-20241022``,
    ``-2024-08-06``, ``-latest``) finds the model it extends: ``gpt-5-nano`` is another model
    than ``gpt-5``, at another price, and is refused as one the table does not hold."""
    name = model.strip().lower()
    if name in PRICES:
        return PRICES[name]
    known = [
        k for k in PRICES if name.startswith(k + "-") and (not releases_only or _RELEASE.fullmatch(name[len(k) + 1 :]))
    ]
    if known:
        return replace(PRICES[max(known, key=len)], model=name)
    msg = f"no price for model {model!r} (price table {PRICE_TABLE_VERSION}); known: {', '.join(sorted(PRICES))}"
    raise UnknownModelError(msg)


#: the prices a replay bills with (``ctxkernel simulate``): the break-even rule of every session
#: opened under :func:`priced_as` weighs edits with the prices its bill uses
_PRICED_AS: ContextVar[ModelPrice | None] = ContextVar("ctxkernel_priced_as", default=None)


@contextmanager
def priced_as(price: ModelPrice) -> Iterator[None]:
    """Within the block, sessions weigh the prompt cache with ``price`` (simulate's price)."""
    token = _PRICED_AS.set(price)
    try:
        yield
    finally:
        _PRICED_AS.reset(token)


def price_in_force() -> ModelPrice | None:
    """The price :func:`priced_as` set, or None."""
    return _PRICED_AS.get()


@dataclass
class Bill:
    """Input tokens of one request (or a sum of requests) by how the provider bills them."""

    uncached: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @property
    def input(self) -> int:
        return self.uncached + self.cache_read + self.cache_write

    def add(self, other: Bill) -> None:
        self.uncached += other.uncached
        self.cache_read += other.cache_read
        self.cache_write += other.cache_write


@dataclass
class _Entry:
    keys: list[Hashable]
    ends: list[int]  # tokens up to and including each block
    expires: float


@dataclass
class PromptCache:
    """A provider's prompt cache, simulated from the exact prefix each request shares with the
    requests before it that are still cached (their TTL, refreshed by every read, not run out).

    A request is a list of blocks ``(key, tokens)``: the system prompt and tools, then each
    message; two blocks are the same when their keys are equal. The cached prefix a request reads
    is the longest one it shares, block for block, with a live entry; with explicit caching the
    rest of the request is written (the harness marks the end of every request, as Claude Code
    does), with automatic caching the rest is billed as input. A request under the model's
    minimum is neither read from nor written to the cache. At most ``capacity`` entries are kept
    (the most recent)."""

    price: ModelPrice
    capacity: int = 8
    _entries: list[_Entry] = field(default_factory=list)

    def request(self, at: float, blocks: Sequence[tuple[Hashable, int]]) -> Bill:
        keys = [k for k, _ in blocks]
        ends: list[int] = []
        total = 0
        for _, tokens in blocks:
            total += tokens
            ends.append(total)
        self._entries = [e for e in self._entries if e.expires >= at]
        price = self.price
        if total < price.cache_min_tokens:
            return Bill(uncached=total)
        best, best_entry = 0, None
        for entry in self._entries:
            shared = _shared_blocks(keys, entry.keys)
            tokens = ends[shared - 1] if shared else 0
            if tokens > best:
                best, best_entry = tokens, entry
        if best_entry is not None:
            best_entry.expires = at + price.cache_ttl_seconds  # a read refreshes the entry
        if price.cache_mode == "automatic":
            read = best - best % price.cache_increment if best >= price.cache_min_tokens else 0
            bill = Bill(uncached=total - read, cache_read=read)
        else:
            read = best if best >= price.cache_min_tokens else 0
            bill = Bill(cache_read=read, cache_write=total - read)
        self._entries.append(_Entry(keys, ends, at + price.cache_ttl_seconds))
        del self._entries[: -self.capacity]
        return bill

    def fork(self) -> PromptCache:
        """An independent copy of the cache as it is now: requests priced on the copy (what-if
        requests, such as the recall calls ``simulate`` assumes) leave this cache as it was."""
        entries = [_Entry(e.keys, e.ends, e.expires) for e in self._entries]  # keys and ends are never mutated
        return PromptCache(self.price, self.capacity, entries)


def _shared_blocks(a: list[Hashable], b: list[Hashable]) -> int:
    """How many leading blocks ``a`` and ``b`` share (list comparisons run in C, identity first)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lengths = range(n + 1)
    # the largest k with a[:k] == b[:k]: prefixes agree up to some k, and disagree after it
    return bisect.bisect_left(lengths, True, key=lambda k: a[:k] != b[:k]) - 1


__all__ = [
    "FIVE_MINUTES",
    "PRICES",
    "PRICE_TABLE_VERSION",
    "Bill",
    "ModelPrice",
    "PromptCache",
    "UnknownModelError",
    "price_for",
    "price_in_force",
    "priced_as",
]
