"""The history tools mask offers once something is masked, the system prompt section that goes
with them, and what they add to every request (weighed against a batch's saving)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ctxkernel.recall.history_tools import HISTORY_TOOL_NAMES, SYSTEM_SECTION, history_tools

from .strategy import STRATEGY

if TYPE_CHECKING:
    from ctxkernel import Context, Tool

    from .settings import MaskSettings

#: the handle's state key of the header tokens the tools add, by the settings' tool list
HEADER_KEY = "recall_header"

#: what each tool is for, in the section a subset of the tools gets
_USES = {
    "history_search_contents": "history_search_contents finds any earlier message by words you saw",
    "history_list_items": "history_list_items pages through all of them in order",
    "history_list_windows": "history_list_windows lists the context windows",
}


def offered_tools(settings: MaskSettings) -> list[Tool]:
    """The history tools ``recall_tools`` names, in the kernel's order, with the brief schemas
    (mask has no windows to filter by, and every request after the first mask carries them)."""
    chosen = set(settings.recall_tools)
    return [tool for tool in history_tools(STRATEGY, brief=True) if tool.name in chosen]


def system_section(settings: MaskSettings) -> str:
    """The kernel's section when all four tools are offered, else one naming only those offered."""
    if set(settings.recall_tools) == set(HISTORY_TOOL_NAMES):
        return SYSTEM_SECTION
    uses = [_USES[name] for name in HISTORY_TOOL_NAMES if name in settings.recall_tools and name in _USES]
    return (
        "Nothing in this session is ever deleted: an output marked [masked ...] stays in its log. "
        + "".join(f"{use}; " for use in uses)
        + "history_read_item(id=...) reads one in full by the id the mark names."
    )


def header_tokens(ctx: Context, settings: MaskSettings) -> int:
    """Tokens the tools' schemas and their section add to every request (counted once per list)."""
    state = STRATEGY.on(ctx).state
    key = tuple(settings.recall_tools)
    known = state.get(HEADER_KEY)
    if known is None or known[0] != key:
        schemas = json.dumps([tool.schema() for tool in offered_tools(settings)], separators=(",", ":"))
        known = (key, ctx.meter.count_text(schemas) + ctx.meter.count_text(system_section(settings)))
        state[HEADER_KEY] = known
    return int(known[1])
