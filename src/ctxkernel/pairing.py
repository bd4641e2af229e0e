"""Tool-call pairing: the invariant every request keeps (each group of calls is followed by
exactly its results). One definition, used by the conformance suite and by the simulator's
invariant checker, which word the problems differently. And the ids a model's calls may take
(:class:`CallIds`), which the front doors (serve, the framework adapters) give a reply before
committing it, so that a provider reusing an id never breaks the pairing.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from .messages import MAX_CALL_ID_CHARS, Message, ToolCallBlock


@dataclass(frozen=True)
class PairingProblem:
    """One break of tool-call pairing in a request's messages.

    ``orphan_result``: a tool result with no group of calls right before it; ``split_group``: a
    result inside a group whose calls do not include it (or answer it twice; ``group`` holds that
    group's calls); ``orphan_calls``: calls of a group left without results, ``index`` being the
    message that ended the group (``len(messages)`` at the end of the request).
    """

    kind: str
    index: int
    call_ids: tuple[str | None, ...]
    group: tuple[str, ...] = ()


def pairing_problems(messages: list[Message]) -> list[PairingProblem]:
    """Every pairing problem in ``messages``, in order. Shared by :func:`request_orphans` and the
    simulator's invariant checker, which word them differently."""
    problems: list[PairingProblem] = []
    i, n = 0, len(messages)
    while i < n:
        message = messages[i]
        if message.role == "tool":
            problems.append(PairingProblem("orphan_result", i, (_result_call_id(message),)))
            i += 1
            continue
        calls = [c.id for c in message.tool_calls]
        i += 1
        if not calls:
            continue
        answered: set[str | None] = set()
        while i < n and messages[i].role == "tool":
            call_id = _result_call_id(messages[i])
            if call_id not in calls or call_id in answered:
                problems.append(PairingProblem("split_group", i, (call_id,), tuple(calls)))
            answered.add(call_id)
            i += 1
        missing = tuple(c for c in calls if c not in answered)
        if missing:
            problems.append(PairingProblem("orphan_calls", i, missing))
    return problems


def _result_call_id(message: Message) -> str | None:
    result = message.tool_result
    return result.call_id if result else None


__all__ = ["PairingProblem", "pairing_problems"]


#: what a provider's tool-call id may hold when sent back (Anthropic's pattern, OpenAI's too)
_CALL_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def renamed_calls(message: Message, renames: list[tuple[str, str]]) -> Message:
    """``message`` with its tool calls' ids renamed: each ``(old, new)`` pair, in order, is the
    id of the next call whose id is ``old`` (``claim_raw_calls``' answer, one pair per call)."""
    pending = list(renames)
    content: list[Any] = []
    for block in message.content:
        if isinstance(block, ToolCallBlock):
            for i, (old, new) in enumerate(pending):
                if block.id == old:
                    block = ToolCallBlock(new, block.name, block.arguments)
                    del pending[i]
                    break
        content.append(block)
    return message.with_content(content)  # its source and name kept


def claim_calls(message: Message, ids: CallIds) -> tuple[Message, list[tuple[str, str]]]:
    """``message`` with each tool call's id claimed from ``ids`` (a reused, empty or overlong one renamed,
    :class:`CallIds`), and the ``(old, new)`` pair of every call."""
    renames = [(call.id, ids.claim(call.id)) for call in message.tool_calls]
    changed = any(old != new for old, new in renames)
    return (renamed_calls(message, renames) if changed else message), renames


def claim_raw_calls(raw_calls: list[dict[str, Any]], ids: CallIds) -> list[tuple[str, str]] | None:
    """Give each of a reply's raw tool calls (dicts with an ``id``) an id of its own
    (:class:`CallIds`), in place; the ``(old, new)`` pair of every call, or None when none was
    renamed (the usual case)."""
    pairs = []
    renamed = False
    for call in raw_calls:
        found = call.get("id")
        old = found if isinstance(found, str) else ""
        new = ids.claim(old)
        if new != old:
            call["id"] = new
            renamed = True
        pairs.append((old, new))
    return pairs if renamed else None


class CallIds:
    """The tool-call ids a reply may use: not one the session or the client's history holds
    already, nor one an earlier call of the same reply took. A provider that reuses an id
    (some do, across turns or within one reply) gets its call renamed to a fresh one
    (``<id>_<n>``), which the client sees and answers; else the session would refuse the
    reply (a call id used twice) on every retry."""

    def __init__(self, *taken: Container[str]) -> None:
        self.taken = taken
        self.claimed: set[str] = set()

    def claim(self, call_id: str) -> str:
        """``call_id`` when it is free (and not longer than :data:`MAX_CALL_ID_CHARS`), else a fresh
        id like it; either way taken from now on."""
        if (
            call_id
            and len(call_id) <= MAX_CALL_ID_CHARS
            and call_id not in self.claimed
            and not any(call_id in t for t in self.taken)
        ):
            self.claimed.add(call_id)
            return call_id
        base = claim_base(call_id)
        n = 1
        while (fresh := f"{base}_{n}") in self.claimed or any(fresh in t for t in self.taken):
            n += 1
        self.claimed.add(fresh)
        return fresh


#: an id :meth:`CallIds.claim` gave in place of a reused one: ``<base>_<n>``
_CLAIMED = re.compile(r"^(.*)_([1-9][0-9]*)$")


def claim_base(call_id: str) -> str:
    """The stem of the fresh ids :meth:`CallIds.claim` gives in place of ``call_id``."""
    return _CALL_ID_CHARS.sub("", call_id)[:64] or "call"


def claimed_from(call_id: str) -> str | None:
    """The stem ``call_id`` would have been claimed from, when it has the form of a fresh id
    (``<base>_<n>``); None otherwise."""
    found = _CLAIMED.match(call_id)
    return found.group(1) if found else None


def may_be_claim_of(logged: str, call_id: str) -> bool:
    """Whether ``logged`` is ``call_id`` or an id :meth:`CallIds.claim` may have given a call
    that reused ``call_id``."""
    return logged == call_id or claimed_from(logged) == claim_base(call_id)
