"""Tool-call pairing: the invariant every request keeps (each group of calls is followed by
exactly its results). One definition, used by the conformance suite and by the simulator's
invariant checker, which word the problems differently."""

from __future__ import annotations

from dataclasses import dataclass

from .messages import Message


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
