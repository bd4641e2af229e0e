"""The window strategies' recall tools come with the first edit that hides something (``[tools]
offer``), as ``basic``'s history tools do: before it a session sends none of their schemas.

Driven through the shipped profiles with a small window, so each switches (or archives) on its own.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.profile import load_profile
from ctxkernel.store.jsonl import JsonlStore

#: each shipped profile, the recall tools it offers once something is hidden, and a word of the
#: system prompt section that goes with them
RECALL = {
    "handoff": (
        ("history_list_windows", "history_list_items", "history_read_item", "history_search_contents"),
        "recover any earlier item",
    ),
    "rollover": (("history_lookup", "history_read"), "Look up what earlier windows archived"),
    "chapters": (("chapters_read", "chapters_search", "chapters_artifact"), "chapters_read and chapters_search read"),
}


def kernel_for(tmp_path: Any, name: str, **tools: Any) -> Kernel:
    profile = load_profile(name)
    profile.model = profile.model.model_copy(update={"context_window": 12_000, "reserved_output_tokens": 1_000})
    profile.tools = profile.tools.model_copy(update=tools)
    return Kernel(profile, store=JsonlStore(tmp_path), home=tmp_path)


def names(request: Any) -> list[str]:
    tools = request["tools"] if isinstance(request, dict) else request.tools
    return [t["function"]["name"] for t in tools]


def step(session: Any, i: int) -> Any:
    """One turn: a tool call, its result, a closing reply; returns the first request."""
    session.user(f"step {i}: look at module{i}.py " + "and more " * 30)
    request = session.prepare_request()
    session.commit_reply(Message.assistant(f"reading {i}", [ToolCallBlock(f"c{i}", "read", {"path": f"m{i}"})]))
    session.tool_result(f"c{i}", f"contents of module{i}:\n" + "x = 1\n" * 150)
    session.prepare_request()
    session.commit_reply(Message.assistant(f"done with module{i}"))
    session.end_turn()
    return request


@pytest.mark.parametrize("name", sorted(RECALL))
def test_the_recall_tools_come_with_the_first_edit_and_stay_after_a_restart(tmp_path, name):
    recall, section = RECALL[name]
    kernel = kernel_for(tmp_path, name)
    session = kernel.open_session()
    first = step(session, 0)
    # nothing hidden yet, nothing to recall: no schema and no prompt section
    assert not set(recall) & set(names(first)) and section not in first.system
    assert all(session.may_offer_tool(tool) for tool in recall)
    assert all(tool in session.offerable_tools for tool in recall)
    turns = 1
    while not session.surface.hides_anything():
        step(session, turns)
        turns += 1
        assert turns < 60, "the session never switched"
    # the request right after the first edit carries them, with their section
    headers = [e for e in session.events if e.type == "request/header"]
    offered = [bool(set(recall) & set(names(h.data))) for h in headers]
    assert offered == [False] * offered.index(True) + [True] * (len(offered) - offered.index(True))
    request = step(session, turns)
    assert set(recall) <= set(names(request)) and section in request.system
    # a restart composes the same header from the log alone
    reopened = kernel_for(tmp_path, name).open_session(session.id)
    assert reopened.request_header() == session.request_header()


@pytest.mark.parametrize("name", sorted(RECALL))
def test_offer_always_sends_every_tool_from_the_first_request(tmp_path, name):
    recall, section = RECALL[name]
    session = kernel_for(tmp_path, name, offer="always").open_session()
    first = step(session, 0)
    assert set(recall) <= set(names(first)) and section in first.system
    # the header guard weighed the same header either way
    lazy = kernel_for(tmp_path / "lazy", name).open_session()
    assert lazy.full_header() == session.full_header() == (session.request_header().tokens, len(first.tools))


#: a recall tool named in a prompt
RECALL_NAME = re.compile(r"\b(?:history|chapters)_(?:read|search|artifact|lookup|list)[a-z_]*")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(RECALL))
@pytest.mark.parametrize("offer", ["when_useful", "always"])
def test_a_reloaded_offer_key_brings_the_tools_with_their_section(tmp_path, name, offer):
    """The profile file is edited while the session runs ([tools] offer flipped either way); serve
    sets the harness's system prompt before every request, which recomposes the header."""
    text = (REPO / "profiles" / f"{name}.toml").read_text()
    text = re.sub(r"context_window = \d+", "context_window = 12000", text)
    text = re.sub(r"reserved_output_tokens = \d+", "reserved_output_tokens = 1000", text)
    path = tmp_path / "p.toml"
    path.write_text(text + f'\n[tools]\noffer = "{offer}"\n')
    session = Kernel(load_profile(path), store=JsonlStore(tmp_path), home=tmp_path).open_session()
    session.user("hello")
    session.prepare_request()
    session.commit_reply(Message.assistant("hi"))
    session.end_turn()
    flipped = "always" if offer == "when_useful" else "when_useful"
    time.sleep(0.01)  # a newer modification time
    path.write_text(text + f'\n[tools]\noffer = "{flipped}"\n')
    session.user("again")
    session.set_harness_system("You are a coding agent (v2).")
    request = session.prepare_request()
    named, carried = set(RECALL_NAME.findall(request.system)), set(names(request))
    assert named <= carried, f"the prompt names {sorted(named - carried)}; the request carries {sorted(carried)}"
    # and the tools never without their section: the session has hidden nothing, so they come
    # only with "always"
    assert (flipped == "always") == bool(named) == bool(set(RECALL[name][0]) & carried), request.system


def test_offer_always_with_mask_follows_the_routed_window(tmp_path):
    """mask offers its recall tools only where the window can carry them: routed from a window
    below ``recall_min_window`` to a larger one, "always" brings them, as a reopened session has."""

    def kernel() -> Kernel:
        profile = load_profile("mask")
        profile.tools = profile.tools.model_copy(update={"offer": "always"})
        profile.strategies["mask"] = {**profile.strategies.get("mask", {}), "tail_tokens": 0, "clear_at_least": 1}
        profile.cache.rule = "off"
        return Kernel(profile, store=JsonlStore(tmp_path), home=tmp_path)

    session = kernel().open_session()
    provider = session.kernel.profile.model.provider
    session.set_route(provider, "small", 6_000)
    for i in range(12):
        if i == 6:
            assert session.surface.hides_anything()
            session.set_route(provider, "big", 64_000)
        session.user(f"task {i}")
        session.prepare_request()
        session.commit_reply(Message.assistant("", [ToolCallBlock(f"c{i}", "read", {"p": i})]))
        session.tool_result(f"c{i}", "line of output\n" * 100)
        request = session.prepare_request()
        session.commit_reply(Message.assistant("done"))
        session.end_turn()
    shown = "\n".join(m.tool_result.content if m.role == "tool" else m.text for m in request.messages)
    assert "history_read_item" in shown and "history_read_item" in names(request)
    assert names(request) == names(kernel().open_session(session.id).request_header())


def test_a_frameworks_up_front_tool_list_writes_nothing_to_the_store(tmp_path):
    """LangChain, the OpenAI Agents SDK and Pydantic AI list every strategy tool when they are
    built, through a session that is never stored."""
    from ctxkernel.integrations import strategy_tool_schemas

    store = JsonlStore(tmp_path)
    listed = strategy_tool_schemas(Kernel(load_profile("chapters"), store=store, home=tmp_path))
    assert {s["function"]["name"] for s in listed} >= set(RECALL["chapters"][0])
    assert store.kv_list("chapters", "") == {}
