"""LangChain: a create_agent agent with ContextMiddleware runs 60+ steps of large tool results
within the profile's window, on LangChain's own fake chat model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from ctxkernel.integrations import IntegrationError
from ctxkernel.integrations.langchain import ContextMiddleware, from_langchain

from .conftest import NOTE, STEPS, big_result, event_types, run_child


class ToolCallingFakeModel(GenericFakeChatModel):
    """GenericFakeChatModel that accepts tools (bind_tools, as a real chat model does) and
    records every call's messages and tools; its replies come from ``messages``."""

    calls: list[tuple[list[Any], list[dict[str, Any]]]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        self.calls.append((list(messages), list(kwargs.get("tools") or [])))
        return super()._generate(messages, stop, run_manager, **kwargs)


def scripted_replies(model_calls: list[Any]) -> Iterator[AIMessage]:
    """The model's part: read 60 large files, write a note early, read it back late, answer."""
    while True:
        k = len(model_calls) - 1
        if k == 5:
            yield AIMessage(
                "",
                tool_calls=[
                    {
                        "id": "note-w",
                        "name": "notes_write_file",
                        "args": {"path": "self/notes/plan.md", "content": NOTE},
                    }
                ],
            )
        elif k == 50:
            yield AIMessage(
                "", tool_calls=[{"id": "note-r", "name": "notes_read_file", "args": {"path": "self/notes/plan.md"}}]
            )
        elif k > STEPS:
            yield AIMessage("done: every module read")
        else:
            yield AIMessage(
                f"reading module {k}",
                tool_calls=[{"id": f"read-{k}", "name": "read_file", "args": {"path": f"src/module_{k}.py"}}],
            )


def test_a_long_agent_stays_within_the_window(home, profile_path, probe):
    reads: list[str] = []

    @tool
    def read_file(path: str) -> str:
        """Read a source file."""
        reads.append(path)
        return big_result(int(path.split("_")[1].split(".")[0]))

    calls: list[Any] = []
    model = ToolCallingFakeModel(messages=iter(()))
    model.calls = calls
    model.messages = scripted_replies(calls)
    middleware = ContextMiddleware(profile=profile_path)
    agent = create_agent(
        model, [read_file], middleware=[middleware], system_prompt="You refactor code.", checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "lc-thread-1"}, "recursion_limit": 1000}
    out = agent.invoke({"messages": [HumanMessage("Read every module of the project.")]}, config)

    assert out["messages"][-1].content == "done: every module read"
    assert len(calls) == STEPS + 2
    # the framework's own tool ran for every read
    assert len(reads) == STEPS - 1
    unmanaged = sum(probe.meter.count_text(big_result(i)) for i in range(STEPS))
    assert unmanaged > 4 * probe.window
    for messages, tools in calls:
        system, history = from_langchain(messages)
        assert probe.measure(system, history, tools) <= probe.window
    assert probe.unpaired == []
    # the strategy's tools were offered, and the model's calls to them ran through the tool node
    assert {"notes_write_file", "new_context"} <= {t["function"]["name"] for t in calls[0][1]}
    after_read = calls[51][0]
    answer = next(m for m in after_read if isinstance(m, ToolMessage) and m.tool_call_id == "note-r")
    assert NOTE in answer.content and answer.status == "success"
    # the graph's thread id named the session; handoffs happened and the log keeps everything
    events = event_types(home, "lc-thread-1")
    assert sum(e["type"] == "compaction/summary" for e in events) >= 3
    assert sum(e["type"] == "tool/result" for e in events) == STEPS + 1
    assert sum(e["type"] == "assistant/message" for e in events) == STEPS + 2

    # a new process with the same home and session id continues it, without duplicating anything
    child = run_child("langchain", home, profile_path, "lc-thread-1")
    assert child["prompt_tokens"] <= probe.window
    after = event_types(home, "lc-thread-1")
    assert after[: len(events)] == events
    new = after[len(events) :]
    assert [e["type"] for e in new if e["type"].endswith("message") or e["type"] == "tool/result"] == [
        "user/message",
        "assistant/message",
    ]
    assert any("done: every module read" in text for text in child["seen"])


class _FailingOnce(ToolCallingFakeModel):
    """Raises on its ``fail_at``-th call (from 1), as a provider that is down."""

    fail_at: int = 0

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        if len(self.calls) + 1 == self.fail_at:
            self.calls.append((list(messages), []))
            raise RuntimeError("provider down")
        return super()._generate(messages, stop, run_manager, **kwargs)


@pytest.mark.parametrize("run", ["sync", "async"])
def test_a_model_call_that_raises_leaves_no_half_step(home, profile_path, run):
    model = _FailingOnce(messages=iter([AIMessage("first"), AIMessage("third")]), fail_at=2)
    middleware = ContextMiddleware(profile=profile_path)
    agent = create_agent(model, [], middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"lc-fail-{run}"}}

    def invoke(text: str) -> Any:
        state = {"messages": [HumanMessage(text)]}
        return agent.invoke(state, config) if run == "sync" else asyncio.run(agent.ainvoke(state, config))

    invoke("one")
    with pytest.raises(RuntimeError, match="provider down"):
        invoke("two")
    events = event_types(home, f"lc-fail-{run}")
    # the failed call's step is closed at once, not left open for the next call to find
    assert events[-1]["type"] == "step/end" and events[-1]["data"].get("reason") == "error"
    assert invoke("three")["messages"][-1].content == "third"
    events = event_types(home, f"lc-fail-{run}")
    assert [e["data"]["message"]["content"][0]["text"] for e in events if e["type"] == "user/message"] == [
        "one",
        "two",
        "three",
    ]
    assert not any(e["data"].get("reason") == "abandoned" for e in events if e["type"] == "step/end")


def test_a_message_the_kernel_cannot_hold_is_refused_by_name():
    image = HumanMessage(
        content=[{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    )
    with pytest.raises(IntegrationError, match=r"messages\[0\] \(HumanMessage\): content\[1\] is a 'image_url' part"):
        from_langchain([image])


def test_a_strategy_tool_outside_the_middleware_says_how_to_use_it(home, profile_path):
    middleware = ContextMiddleware(profile=profile_path)
    note = next(t for t in middleware.tools if t.name == "notes_write_file")
    with pytest.raises(IntegrationError, match="runs through ContextMiddleware.wrap_tool_call"):
        note.invoke({"path": "self/notes/x.md", "content": "x"})


def test_without_a_thread_id_the_middleware_keeps_one_session_across_invocations(home, profile_path):
    calls: list[Any] = []
    model = ToolCallingFakeModel(messages=iter([AIMessage("first answer"), AIMessage("second answer")]))
    model.calls = calls
    middleware = ContextMiddleware(profile=profile_path)
    agent = create_agent(model, [], middleware=[middleware])
    agent.invoke({"messages": [HumanMessage("first question")]})
    agent.invoke({"messages": [HumanMessage("second question")]})
    # no checkpointer: the second run's state holds only its own message, the session has both
    texts = [m.content for m in calls[1][0] if m.type != "system"]
    assert texts == ["first question", "first answer", "second question"]
    session = middleware.managed(None).session
    assert [e.type for e in session.events].count("turn/start") == 2


def test_the_middleware_keeps_a_bounded_number_of_thread_sessions_open(home, profile_path, monkeypatch):
    from ctxkernel.integrations import langchain as adapter

    monkeypatch.setattr(adapter, "OPEN_SESSIONS", 2)
    middleware = ContextMiddleware(profile=profile_path)
    first = middleware.managed({"configurable": {"thread_id": "t1"}})
    first.prepare(from_langchain([HumanMessage("hello")])[1])
    for thread in ("t2", "t3"):
        middleware.managed({"configurable": {"thread_id": thread}})
    assert list(middleware._sessions) == ["t2", "t3"]
    again = middleware.managed({"configurable": {"thread_id": "t1"}})
    assert again is not first
    assert [n.message.text for n in again.session.surface.nodes] == ["hello"]  # reopened from the store


@pytest.mark.parametrize("run", ["sync", "async"])
def test_an_agent_tool_with_a_strategy_tools_name_wins(home, profile_path, run):
    # the request carried the agent's notes_write_file and the strategy's (a provider refuses a
    # name twice), and wrap_tool_call ran the strategy's for the agent's own call
    import asyncio

    written: list[str] = []

    @tool
    def notes_write_file(path: str, content: str) -> str:
        """The agent's own notes tool."""
        written.append(path)
        return "saved by the agent"

    calls: list[Any] = []
    replies = iter(
        [
            AIMessage(
                "", tool_calls=[{"id": "w1", "name": "notes_write_file", "args": {"path": "mine.md", "content": "x"}}]
            ),
            AIMessage("saved"),
        ]
    )
    model = ToolCallingFakeModel(messages=replies)
    model.calls = calls
    middleware = ContextMiddleware(profile=profile_path, session_id=f"lc-clash-{run}")
    agent = create_agent(model, [notes_write_file], middleware=[middleware])
    invoke = {"messages": [HumanMessage("save the plan")]}
    out = agent.invoke(invoke) if run == "sync" else asyncio.run(agent.ainvoke(invoke))
    names = [t["function"]["name"] for t in calls[0][1]]
    assert names.count("notes_write_file") == 1 and "notes_read_file" in names  # the other strategy tools stay
    schema = next(t for t in calls[0][1] if t["function"]["name"] == "notes_write_file")
    assert schema["function"]["description"] == "The agent's own notes tool."
    result = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert written == ["mine.md"] and result.content == "saved by the agent"
    session = middleware.managed(None).session
    assert not session.owns_tool("notes_write_file")
    header = next(e for e in session.events if e.type == "request/header")
    assert [t["function"]["name"] for t in header.data["tools"]].count("notes_write_file") == 1
    assert "notes/write" not in [e.type for e in session.events]


def test_the_async_agent_takes_the_same_path(home, profile_path):
    import asyncio

    calls: list[Any] = []
    replies = iter(
        [
            AIMessage(
                "",
                tool_calls=[
                    {"id": "w1", "name": "notes_write_file", "args": {"path": "self/notes/a.md", "content": NOTE}}
                ],
            ),
            AIMessage("saved"),
        ]
    )
    model = ToolCallingFakeModel(messages=replies)
    model.calls = calls
    middleware = ContextMiddleware(profile=profile_path, session_id="lc-async")
    agent = create_agent(model, [], middleware=[middleware])
    out = asyncio.run(agent.ainvoke({"messages": [HumanMessage("save the plan")]}))
    assert out["messages"][-1].content == "saved"
    result = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert result.status == "success" and '"written":true' in result.content.replace(" ", "")
    events = [e["type"] for e in event_types(home, "lc-async")]
    assert events.count("assistant/message") == 2 and "notes/write" in events


@pytest.mark.parametrize("run", ["sync", "async"])
def test_a_tool_call_id_the_model_reuses_is_renamed_not_an_error(home, profile_path, run):
    # a provider that reuses a call id made commit raise SurfaceError out of the middleware
    import asyncio

    @tool
    def read_file(path: str) -> str:
        """Read a source file."""
        return f"contents of {path}"

    def call(call_id: str, path: str) -> dict[str, Any]:
        return {"id": call_id, "name": "read_file", "args": {"path": path}}

    replies = iter(
        [
            AIMessage("", tool_calls=[call("same", "a.py")]),
            AIMessage("", tool_calls=[call("same", "b.py")]),
            AIMessage("", tool_calls=[call("x", "c.py"), call("x", "d.py")]),
            AIMessage("read them all"),
        ]
    )
    model = ToolCallingFakeModel(messages=replies)
    middleware = ContextMiddleware(profile=profile_path, session_id=f"lc-reuse-{run}")
    agent = create_agent(model, [read_file], middleware=[middleware])
    question = {"messages": [HumanMessage("read the files")]}
    out = agent.invoke(question) if run == "sync" else asyncio.run(agent.ainvoke(question))
    assert out["messages"][-1].content == "read them all"
    asked = [c["id"] for m in out["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    answered = [m.tool_call_id for m in out["messages"] if isinstance(m, ToolMessage)]
    assert asked == answered and len(set(asked)) == 4 and asked[0] == "same"
    assert [m.content for m in out["messages"] if isinstance(m, ToolMessage)] == [
        f"contents of {p}" for p in ("a.py", "b.py", "c.py", "d.py")
    ]
    events = event_types(home, f"lc-reuse-{run}")
    logged = [
        b["id"]
        for e in events
        if e["type"] == "assistant/message"
        for b in e["data"]["message"]["content"]
        if b["type"] == "tool_call"
    ]
    assert logged == asked


class _SettingsRecorder(ToolCallingFakeModel):
    """The fake chat model standing for a provider's (``kind``: its ``_llm_type``), recording the
    model settings each call was bound with."""

    kind: str = "generic-fake-chat-model"
    bound: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return self.kind

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        self.bound.append({k: v for k, v in kwargs.items() if k != "tools"})
        return super()._generate(messages, stop, run_manager, **kwargs)


@pytest.mark.parametrize(
    ("kind", "hint"),
    [("openai-chat", "prompt_cache_key"), ("anthropic-chat", "cache_control"), ("generic-fake-chat-model", None)],
)
def test_the_model_settings_carry_the_prompt_cache_hint_for_the_model(home, profile_path, kind, hint):
    from ctxkernel.convert import prompt_cache_key

    model = _SettingsRecorder(messages=iter([AIMessage("first answer"), AIMessage("second answer")]), kind=kind)
    agent = create_agent(model, [], middleware=[ContextMiddleware(profile=profile_path)], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "lc-cache"}}
    agent.invoke({"messages": [HumanMessage("first question")]}, config)
    agent.invoke({"messages": [HumanMessage("second question")]}, config)
    assert len(model.bound) == 2
    expected = {
        "prompt_cache_key": {"prompt_cache_key": prompt_cache_key("lc-cache")},
        "cache_control": {"cache_control": {"type": "ephemeral"}},
        None: {},
    }[hint]
    for bound in model.bound:
        assert {k: v for k, v in bound.items() if k in ("prompt_cache_key", "cache_control")} == expected


def test_the_agents_own_cache_settings_win_and_hints_off_adds_none(home, profile_path, tmp_path):
    from langchain.agents.middleware import wrap_model_call

    @wrap_model_call
    def own_key(request, handler):
        return handler(request.override(model_settings={**request.model_settings, "prompt_cache_key": "mine"}))

    model = _SettingsRecorder(messages=iter([AIMessage("answer")]), kind="openai-chat")
    agent = create_agent(model, [], middleware=[own_key, ContextMiddleware(profile=profile_path)])
    agent.invoke({"messages": [HumanMessage("question")]})
    assert model.bound[-1]["prompt_cache_key"] == "mine"

    off = tmp_path / "hints-off.toml"
    off.write_text(profile_path.read_text() + "\n[cache]\nhints = false\n")
    model = _SettingsRecorder(messages=iter([AIMessage("answer")]), kind="openai-chat")
    agent = create_agent(model, [], middleware=[ContextMiddleware(profile=off)])
    agent.invoke({"messages": [HumanMessage("question")]})
    assert "prompt_cache_key" not in model.bound[-1]
