"""The built-in ``history`` strategy: history recall any profile can add (issue 15).

After ``basic`` summaries took the head off the surface, the model gets every message back with
the tools alone: paging from the start with ``next_cursor``, reading each ``item_<seq>`` in
full (``next_offset_chars``), or searching for words it saw.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
            assert session.may_offer_tool(tool), f"{name} lacks {tool}"
            assert tool in session.offerable_tools
        assert kernel.strategies["history"].capabilities >= {"history"}


def history_in(request: Any) -> list[str]:
    """The history tools a request (or a logged request header) carries."""
    tools = request["tools"] if isinstance(request, dict) else request.tools
    names = [t["function"]["name"] for t in tools]
    return [n for n in names if n in HISTORY_TOOL_NAMES]


def test_the_tools_come_once_something_is_hidden_and_stay_after_a_restart(tmp_path):
    kernel = build_kernel(tmp_path, strategies=["basic", "history"], model=WINDOW)
    session = kernel.open_session()
    session.user("step 0: please look at module0.py")
    first = session.prepare_request()
    # nothing hidden, nothing to recall: neither the four schemas nor their section (~830 tokens)
    assert history_in(first) == [] and "history_search_contents" not in first.system
    assert not any(session.owns_tool(name) for name in HISTORY_TOOL_NAMES)
    session.commit_reply(Message.assistant("looking"))
    session.end_turn()
    session = busy_session(kernel)  # a second session, summarised on the way
    compacted = [e.seq for e in session.events if e.type == "compaction/summary"]
    assert compacted
    # the request composed right after the first summary carries them: the summary is what
    # the tools read back, and the summary rewrote the cached prefix anyway
    headers = [e for e in session.events if e.type == "request/header"]
    assert [history_in(h.data) == [] for h in headers] == [True] + [False] * (len(headers) - 1)
    assert headers[1].seq > compacted[0]
    session.user("one more")
    request = session.prepare_request()
    assert history_in(request) == list(HISTORY_TOOL_NAMES) and "history_search_contents" in request.system
    session.commit_reply(Message.assistant("done"))
    session.end_turn()
    # a restart composes the same header from the log alone
    reopened = build_kernel(tmp_path, strategies=["basic", "history"], model=WINDOW).open_session(session.id)
    reopened.user("and another")
    again = reopened.prepare_request()
    assert again.tools == request.tools and again.system == request.system


def test_the_header_guard_counts_the_tools_before_they_come(tmp_path):
    from ctxkernel.errors import HeaderTooLargeError

    # a window where the header fits without the history tools and not with them
    lean = build_kernel(
        tmp_path / "lean", strategies=["basic"], model={"context_window": 1700, "reserved_output_tokens": 200}
    )
    session = lean.open_session()
    session.user("hi")
    assert session.prepare_request().tools == []
    kernel = build_kernel(
        tmp_path / "full",
        strategies=["basic", "history"],
        model={"context_window": 1700, "reserved_output_tokens": 200},
    )
    session = kernel.open_session()
    session.user("hi")
    logged = len(session.events)
    with pytest.raises(HeaderTooLargeError, match="4 tool schemas, 4 of them offered once something is hidden") as info:
        session.prepare_request()
    assert info.value.header_tokens > 750 and info.value.smallest_window > 1700
    assert len(session.events) == logged


def test_history_next_to_handoff_is_a_conflict_naming_both(tmp_path):
    profile = load_profile("handoff")
    profile.profile.strategies = ["handoff", "basic", "history"]
    kernel = Kernel(profile, store=JsonlStore(tmp_path), home=tmp_path)
    session = kernel.open_session()
    with pytest.raises((ToolError, PluginConflictError), match="history") as info:
        session.owns_tool("history_read_item")
    assert "handoff" in str(info.value)


def test_the_header_at_its_fullest_is_only_the_callers(tmp_path):
    import threading

    # validate or the guard asking for every tool must not change what another thread composes
    session = build_kernel(tmp_path, strategies=["basic", "history"], model=WINDOW).open_session()
    seen: list[Any] = []
    with session.offering_everything():
        other = threading.Thread(target=lambda: seen.append((session.header_in_full, session.request_header().tools)))
        other.start()
        other.join()
        assert session.header_in_full
    assert seen == [(False, [])]
    assert not session.header_in_full and session.request_header().tools == []


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(window=st.integers(1_800, 6_000), system_words=st.integers(0, 1_600))
def test_a_session_the_header_guard_admits_is_never_refused_later(tmp_path_factory, window, system_words):
    from ctxkernel.errors import HeaderTooLargeError

    # whatever the window and the system prompt: refused before the first request, or never
    home = tmp_path_factory.mktemp("guard")
    model = {"context_window": window, "reserved_output_tokens": window // 8}
    session = build_kernel(home, strategies=["basic", "history"], model=model).open_session()
    session.set_harness_system("rule " * system_words or None)
    session.user("step 0")
    try:
        session.prepare_request()
    except HeaderTooLargeError:
        return
    session.commit_reply(Message.assistant("ok"))
    session.end_turn()
    for i in range(1, 20):
        session.user(f"step {i}: please look at module{i}.py " + "and more " * 20)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"reading {i}", [ToolCallBlock(f"c{i}", "read", {"path": f"m{i}"})]))
        session.tool_result(f"c{i}", "x = 1\n" * 60)
        request = session.prepare_request()
        session.commit_reply(Message.assistant(f"done {i}"))
        session.end_turn()
    # once a summary hid something, the tools came with the requests after it
    if session.surface.hides_anything():
        assert history_in(request) == list(HISTORY_TOOL_NAMES)


def test_the_frameworks_register_every_tool_a_strategy_may_offer(tmp_path):
    from ctxkernel.integrations import strategy_tool_schemas

    # a framework binds its tools before any session exists: the history tools must be among
    # them, though a session's requests carry them only once something is hidden
    kernel = build_kernel(tmp_path, strategies=["basic", "history"], model=WINDOW)
    assert [s["function"]["name"] for s in strategy_tool_schemas(kernel)] == list(HISTORY_TOOL_NAMES)
    session = kernel.open_session()
    session.user("hi")
    assert history_in(session.prepare_request()) == []
