"""decay with the built-in ``history`` strategy (the shipped decay profile): the history tools come
with the first compression and stay, whatever later takes it off the surface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxkernel import Message, ToolCallBlock
from ctxkernel.recall.history_tools import HISTORY_TOOL_NAMES
from ctxkernel_decay.testing import decay_kernel

STRATEGIES = ("decay", "basic", "history")


def _history(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.tools if t["function"]["name"] in HISTORY_TOOL_NAMES]


def _two_turns(session: Any) -> None:
    for t in range(2):
        session.user(f"task {t}")
        session.prepare_request()
        session.commit_reply(Message.assistant(f"reading {t}", [ToolCallBlock(f"c{t}", "read", {"path": "f.py"})]))
        session.tool_result(f"c{t}", f"result {t}\n" * 30)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"finished {t}"))
        session.end_turn()


def test_a_drop_of_the_only_compressed_block_keeps_the_history_tools(tmp_path: Path) -> None:
    kernel = decay_kernel(tmp_path, strategies=STRATEGIES)
    session = kernel.open_session()
    _two_turns(session)
    session.user("now")
    session.prepare_request()
    compress = {"spans": [{"from": "p2", "to": "p4", "summary": "turn 0 summary"}]}
    session.commit_reply(Message.assistant("", [ToolCallBlock("k1", "compress", compress)]))
    session.tool_result("k1", session.run_tool(session.pending_calls[0]))
    request = session.prepare_request()
    assert _history(request) == list(HISTORY_TOOL_NAMES)
    # one reply drops the block, then reads back what it hid: the tool it was offered still runs
    calls = [
        ToolCallBlock("d1", "drop", {"left": "p2", "right": "p4"}),
        ToolCallBlock("h1", "history_read_item", {"id": "item_3"}),
    ]
    session.commit_reply(Message.assistant("", calls))
    for call in calls:
        assert session.owns_tool(call.name), call.name
        outcome = session.run_tool(call)
        assert not outcome.is_error, outcome.content
        session.tool_result(call.id, outcome)
    # a restart composes the same header: no tool turned into one of the harness's
    reopened = decay_kernel(tmp_path, strategies=STRATEGIES).open_session(session.id)
    assert reopened.harness_tools == []
    live = session.prepare_request()
    assert _history(live) == list(HISTORY_TOOL_NAMES) and "history_search_contents" in live.system
    again = reopened.prepare_request()
    assert again.tools == live.tools and again.system == live.system
    names = [t["function"]["name"] for t in again.tools]
    assert len(names) == len(set(names))
