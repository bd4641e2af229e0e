"""The built-in ``history`` strategy: history recall any profile can add (issue 15).

After ``basic`` summaries took the head off the surface, the model gets every message back with
the tools alone: paging from the start with ``next_cursor``, reading each ``item_<seq>`` in
full (``next_offset_chars``), or searching for words it saw.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.errors import PluginConflictError, ToolError
from ctxkernel.events import ASSISTANT_MESSAGE, TOOL_RESULT, USER_MESSAGE
from ctxkernel.profile import load_profile
from ctxkernel.recall.history_tools import HISTORY_TOOL_NAMES
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import build_kernel

WINDOW = {"context_window": 4000, "reserved_output_tokens": 500}


def call(session: Any, name: str, **arguments: Any) -> dict[str, Any]:
    outcome = session.run_tool(ToolCallBlock(f"t_{name}_{session.next_seq}", name, arguments))
    assert not outcome.is_error, outcome.content
    return json.loads(outcome.content)


def busy_session(kernel: Kernel) -> Any:
    session = kernel.open_session()
    for i in range(30):
        session.user(f"step {i}: please look at module{i}.py " + "and more " * 20)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"reading {i}", [ToolCallBlock(f"c{i}", "read", {"path": f"m{i}"})]))
        session.tool_result(f"c{i}", f"contents of module{i}: " + "x = 1\n" * (40 + 60 * (i % 3)))
        session.prepare_request()
        session.commit_reply(Message.assistant(f"done with module{i}"))
        session.end_turn()
    return session


def message_events(session: Any) -> list[Any]:
    return [
        e
        for e in session.events
        if e.type in (USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT) and (e.surface or {}).get("op") == "append"
    ]


def read_whole(session: Any, item: str) -> str:
    parts, offset = [], 0
    while True:
        page = call(session, "history_read_item", id=item, offset_chars=offset, max_chars=1000)
        parts.append(page["content"])
        if "next_offset_chars" not in page:
            return "".join(parts)
        offset = page["next_offset_chars"]


def test_every_message_comes_back_through_the_tools_after_summaries(tmp_path):
    kernel = build_kernel(tmp_path, strategies=["basic", "history"], model=WINDOW)
    session = busy_session(kernel)
    assert any(e.data.get("strategy") == "basic" for e in session.events if e.type == "compaction/summary")
    visible = {n.seq for n in session.surface}
    gone = [e for e in message_events(session) if e.seq not in visible]
    assert len(gone) > 40  # most of the session is off the surface
    # paging from the start with the cursor reaches every item
    listed: list[str] = []
    cursor = None
    while True:
        page = call(session, "history_list_items", limit=50, **({"cursor": cursor} if cursor else {}))
        listed += [i["id"] for i in page["items"]]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    for event in gone:
        assert f"item_{event.seq}" in listed
        text = Message.from_dict(event.data["message"]).text
        assert text and text in read_whole(session, f"item_{event.seq}")
    # and search by words the model saw finds the one it wants
    found = call(session, "history_search_contents", query="contents of module4:")
    assert [i["id"] for i in found["items"]] == [f"item_{e.seq}" for e in gone if "contents of module4:" in str(e.data)]


def test_the_shipped_basic_and_decay_profiles_carry_the_history_tools(tmp_path):
    for name in ("basic", "decay"):
        kernel = Kernel(load_profile(name), store=JsonlStore(tmp_path / name), home=tmp_path / name)
        session = kernel.open_session()
        for tool in HISTORY_TOOL_NAMES:
            assert session.owns_tool(tool), f"{name} lacks {tool}"
        assert kernel.strategies["history"].capabilities >= {"history"}


def test_history_next_to_handoff_is_a_conflict_naming_both(tmp_path):
    profile = load_profile("handoff")
    profile.profile.strategies = ["handoff", "basic", "history"]
    kernel = Kernel(profile, store=JsonlStore(tmp_path), home=tmp_path)
    session = kernel.open_session()
    with pytest.raises((ToolError, PluginConflictError), match="history") as info:
        session.owns_tool("history_read_item")
    assert "handoff" in str(info.value)
