"""The built-in ``history`` strategy: history recall that any profile can add.

It compacts nothing. It gives the model the four history tools of
:mod:`ctxkernel.recall.history_tools` (list windows, list items, read an item, search), so that
whatever a compaction took off the surface (a ``basic`` summary's head, a ``decay`` compression)
stays reachable: by the ``item_<seq>`` ids the surface shows, by words the model saw, or by
paging through the log in order. ``handoff`` offers the same four tools itself; a profile lists
``history`` next to a strategy that does not (the shipped ``basic`` and ``decay`` profiles do).

The tools and their system prompt section come only once the surface hides something (their
schemas go with every request, about 830 tokens, and a session that has hidden nothing has
nothing to recall), and stay from then on. They come with the compaction (or the excerpt of an
oversized result) that first hides something: the tools lead the cached prefix, so that request
writes the header to the provider's cache again, once. The header guard counts them from the
first request (``StrategyHandle.offer_tools``), so a window too small to carry them later is
refused up front.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ctxkernel
from ctxkernel import NoSettings
from ctxkernel.recall.history_tools import SYSTEM_SECTION, history_tools

if TYPE_CHECKING:
    from ctxkernel import Context

NAME = "history"

STRATEGY: ctxkernel.Strategy[NoSettings] = ctxkernel.Strategy(
    NAME,
    capabilities={"history", "tools"},
    description="history recall: page, search and read the session's whole log (any profile can add it)",
)


@ctxkernel.hookimpl
def register_strategy(register: Any) -> None:
    register(STRATEGY.spec)


@ctxkernel.hookimpl
def session_opened(ctx: Context) -> None:
    STRATEGY.on(ctx).history()  # the index is built once per session, then folded incrementally


@ctxkernel.hookimpl
def register_tools(register: Any, ctx: Context) -> None:
    if STRATEGY.on(ctx).offer_tools(ctx.surface.hides_anything()):
        for tool in history_tools(STRATEGY):
            register(tool)


@ctxkernel.hookimpl
def system_prompt(ctx: Context) -> str | None:
    return SYSTEM_SECTION if STRATEGY.on(ctx).tools_offered else None
