"""Steps of a drawn session, shared by the surface and instruction-ledger property tests.

Each test draws a list of ``(op, n)`` pairs and drives a real session with them; these are the
steps the tests have in common: a user turn answered by a reply with ``n`` tool calls, results
for some of the pending calls, and a summary of a head region of the surface.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ctxkernel import CompactionError, Message, Span, ToolCallBlock

PLEASE = ": " + "please " * 5  # a longer user message, for the tests that pad theirs


def drawn_turn(session: Any, calls: int, n: int, *, padding: str = "") -> int:
    """Close the open turn, open one with a user message, commit a reply calling ``n`` tools;
    returns the next call number."""
    if session.turn_open:
        session.end_turn()
    session.user(f"task {calls}{padding}")
    session.prepare_request()
    blocks = [ToolCallBlock(f"c{calls}x{i}", "read", {"path": f"f{i}.py"}) for i in range(n)]
    calls += 1
    session.commit_reply(Message.assistant(f"step {calls}", blocks))
    return calls


def drawn_results(session: Any, pending: list[str], n: int) -> None:
    """Results for the first ``max(1, n)`` pending calls."""
    for call_id in pending[: max(1, n)]:
        session.tool_result(call_id, f"content of {call_id}\n" * 8)


def drawn_head_summary(session: Any, n: int) -> None:
    """A summary of the surface's first nodes (how many drawn from ``n``); a refusal (a pending
    call in the span) is one of the drawn outcomes."""
    nodes = session.surface.nodes
    end = 1 + n % (len(nodes) - 1)
    with contextlib.suppress(CompactionError):
        session.compact(Span(nodes[0].seq, nodes[end - 1].seq, summary="s"), strategy="t", check_shrink=False)


def drawn_shared_step(session: Any, op: str, n: int, calls: int) -> tuple[int, bool]:
    """Run ``op`` when it is one of the steps above and the surface allows it (a turn when no
    call is pending, results when one is, a summary when the surface has more than three nodes);
    returns the next call number and whether a step ran."""
    surface = session.surface
    pending = list(surface.pending_calls)
    if op == "turn" and not pending:
        return drawn_turn(session, calls, n), True
    if op == "result" and pending:
        drawn_results(session, pending, n)
        return calls, True
    if op == "compact" and len(surface) > 3:
        drawn_head_summary(session, n)
        return calls, True
    return calls, False


def drawn_chat_step(session: Any, kind: str, value: Any, turn_open: bool) -> bool:
    """One step of a drawn chat (the instruction-ledger tests): ``user`` opens a turn with
    ``value``, ``reply`` answers an open turn with ``value`` and ends it, ``compact`` runs
    ``basic``'s compaction keeping ``value * 5`` tokens when the surface has more than two nodes.
    Returns whether a turn is open after it."""
    from ctxkernel.default_plugins.basic import compact

    if kind == "user":
        session.user(value)
        return True
    if kind == "reply" and turn_open:
        session.prepare_request()
        session.commit_reply(Message.assistant(value))
        session.end_turn()
        return False
    if kind == "compact" and len(session.surface) > 2:
        compact(session.context, value * 5, reason="manual")
    return turn_open
