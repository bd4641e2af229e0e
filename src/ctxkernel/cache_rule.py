"""The prompt cache's break-even rule: an edit that rewrites the cached prefix must pay for itself.

A provider serves the prefix a request shares with the one before it from its prompt cache, at a
tenth of the input price (:mod:`ctxkernel.pricing`). An edit at surface position ``p`` (a
compaction, a cleared tool result, a window switch) changes everything from ``p`` on, so the next
request writes it again instead of reading it. Over the next ``n`` requests, with

- ``R`` the tokens of the cached prefix from ``p`` on (what the edit makes the provider write
  again; 0 when the previous request was under the model's cache minimum),
- ``S`` the tokens the edit saves (what it replaces less its replacement),
- ``w`` the price of a cache write (Anthropic 1.25x input; OpenAI caches automatically and bills
  a miss as input), ``r`` the price of a cache read,
- ``C`` what the edit itself costs (a summary call; 0 for clearing),

waiting costs ``R·r + U·w + (n-1)·T·r`` for the region from ``p`` to the end (``U = T - R``, its
tokens that are not cached anyway) and editing costs ``(T-S)·w + (n-1)·(T-S)·r + C``. Their
difference gives the rule:

    edit  when  S·(w + (n-1)·r)  >  R·(w - r) + C

The left side is what the smaller request saves over the horizon; the right side is the edit's
own cache cost (the cached prefix it throws away, written again at the write price) and its call.
When the cache has already expired (more than the TTL since the previous request), waiting pays
the write price for ``R`` too and the right side is ``C`` alone. An edit the session needs to fit
its window (``overflow``) always goes ahead.

:func:`decide` answers for one edit, :func:`choose` picks the cheaper of several (clear or
compact) or ``wait``. The kernel applies the rule to every automatic edit a strategy commits
between steps (``pre_step``): see :func:`ctxkernel.compaction.run_transaction` and
``docs/cache.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .pricing import ModelPrice

#: what an edit does: ``clear`` replaces content by a placeholder (no model call), ``compact``
#: summarises it (a model call, priced as ``call_cost``)
EditKind = Literal["clear", "compact"]
Action = Literal["clear", "compact", "wait"]


@dataclass(frozen=True)
class Edit:
    """An edit a strategy proposes, in tokens of the next request."""

    kind: EditKind
    #: tokens of the cached prefix from the edit's first position on (what it rewrites)
    rewritten_tokens: int
    #: tokens the request loses (replaced less their replacement)
    saved_tokens: int
    #: US dollars the edit itself costs (a summary call); 0 for clearing
    call_cost: float = 0.0


@dataclass(frozen=True)
class Decision:
    """What the rule decided, and the two sides it compared (US dollars over the horizon)."""

    action: Action
    #: what the smaller request saves over the remaining steps: ``S·(w + (n-1)·r)``
    saving: float
    #: the edit's own cost: ``R·(w - r) + C`` (``C`` alone once the cache expired)
    cost: float
    reason: str

    @property
    def edits(self) -> bool:
        return self.action != "wait"


def _per_token(price: float) -> float:
    return price / 1_000_000


def cache_cost(price: ModelPrice, edit: Edit, *, idle_seconds: float = 0.0) -> float:
    """The edit's own cost: the cached prefix it rewrites, written again instead of read, and its
    call (the call alone once the cache expired: waiting would write the prefix too)."""
    rewrite = 0.0
    if idle_seconds <= price.cache_ttl_seconds:
        rewrite = max(0, edit.rewritten_tokens) * _per_token(max(0.0, price.cache_write - price.cache_read))
    return rewrite + max(0.0, edit.call_cost)


def saving(price: ModelPrice, edit: Edit, *, remaining_steps: int) -> float:
    """What the smaller request saves over ``remaining_steps`` requests: written once, read after."""
    steps = max(1, remaining_steps)
    return max(0, edit.saved_tokens) * _per_token(price.cache_write + (steps - 1) * price.cache_read)


def decide(
    price: ModelPrice,
    edit: Edit,
    *,
    remaining_steps: int,
    idle_seconds: float = 0.0,
    overflow: bool = False,
) -> Decision:
    """Edit (``edit.kind``) when it pays for itself over ``remaining_steps`` requests, or when the
    session needs it to fit its window (``overflow``); otherwise ``wait``."""
    gain = saving(price, edit, remaining_steps=remaining_steps)
    cost = cache_cost(price, edit, idle_seconds=idle_seconds)
    if overflow:
        return Decision(edit.kind, gain, cost, "the window needs it: an overflow always wins over waiting")
    if edit.saved_tokens <= 0:
        return Decision("wait", gain, cost, "the edit saves no tokens")
    if gain > cost:
        return Decision(edit.kind, gain, cost, f"saves ${gain:.6f} over {remaining_steps} steps, costs ${cost:.6f}")
    return Decision(
        "wait",
        gain,
        cost,
        f"rewriting {edit.rewritten_tokens} cached tokens costs ${cost:.6f}, more than the ${gain:.6f} "
        f"{edit.saved_tokens} fewer tokens save over {remaining_steps} steps",
    )


def choose(
    price: ModelPrice,
    edits: Sequence[Edit],
    *,
    remaining_steps: int,
    idle_seconds: float = 0.0,
    overflow: bool = False,
) -> tuple[Decision, Edit | None]:
    """The edit with the largest net saving among those that pay (under ``overflow``: the one that
    saves the most tokens), or ``wait`` and None when none does (or none is given)."""
    best: tuple[Decision, Edit] | None = None
    for edit in edits:
        d = decide(price, edit, remaining_steps=remaining_steps, idle_seconds=idle_seconds, overflow=overflow)
        if not d.edits:
            continue
        if best is None:
            best = (d, edit)
        elif overflow:
            if edit.saved_tokens > best[1].saved_tokens:
                best = (d, edit)
        elif d.saving - d.cost > best[0].saving - best[0].cost:
            best = (d, edit)
    if best is None:
        return Decision("wait", 0.0, 0.0, "no edit pays for itself"), None
    return best


__all__ = ["Action", "Decision", "Edit", "EditKind", "cache_cost", "choose", "decide", "saving"]
