"""A model that reuses a tool-call id (some providers number calls per reply: ``call_0`` in every
turn) behind the Pydantic AI and Agents SDK adapters, which see a reply only in the framework's
next history: the new reply and its result reach the log and the next request, nothing is
dropped, and a new adapter on the same session (a restart) reconciles the same history the same
way."""

from __future__ import annotations

import asyncio
from typing import Any

from agents import Agent as SdkAgent
from agents import RunConfig, Runner, function_tool, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from hypothesis import HealthCheck, given, settings
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ctxkernel import Message, ToolCallBlock
from ctxkernel.integrations import LogIndex, ManagedSession, reconcile
from ctxkernel.integrations.openai_agents import ContextSession, from_items
from ctxkernel.integrations.pydantic_ai import ContextProcessor, from_pydantic_ai
from ctxkernel.pairing import pairing_problems, renamed_calls
from ctxkernel.testing import build_kernel

from .conftest import conversations, event_types

set_tracing_disabled(True)


def _calls_and_results(home: Any, session_id: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(call id, arguments' path) of every logged call, (call id, text) of every logged result."""
    calls, results = [], []
    for e in event_types(home, session_id):
        blocks = e["data"].get("message", {}).get("content", [])
        if e["type"] == "assistant/message":
            calls += [(b["id"], b["arguments"].get("path", "")) for b in blocks if b["type"] == "tool_call"]
        elif e["type"] == "tool/result":
            results += [(b["call_id"], b["content"]) for b in blocks]
    return calls, results


# -- Pydantic AI ------------------------------------------------------------------------------------------
def _pai_agent(processor: ContextProcessor, seen: list[list[Any]], script: list[Any]) -> Agent[Any, str]:
    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.append(messages)
        return ModelResponse(parts=[script[len(seen) - 1]])

    agent = Agent(FunctionModel(model), capabilities=[ProcessHistory(processor)], toolsets=[processor.toolset])

    @agent.tool_plain
    def read_file(path: str) -> str:
        """Read a file."""
        return f"contents of {path}"

    return agent


def _texts(messages: list[Any]) -> list[str]:
    _, history, _ = from_pydantic_ai(messages)
    return [m.text if m.role != "tool" else m.tool_result.content for m in history]  # type: ignore[union-attr]


def test_pydantic_ai_keeps_a_reply_that_reuses_an_earlier_turns_call_id(home, profile_path):
    script = [
        ToolCallPart("read_file", {"path": "a.py"}, tool_call_id="call_0"),
        TextPart("read a"),
        ToolCallPart("read_file", {"path": "b.py"}, tool_call_id="call_0"),
        TextPart("read b"),
    ]
    seen: list[list[Any]] = []
    processor = ContextProcessor(profile=profile_path, session_id="pai-reuse")
    agent = _pai_agent(processor, seen, script)
    first = agent.run_sync("read a")
    second = agent.run_sync("read b", message_history=first.all_messages())
    assert second.output == "read b"
    # the model was given the second call's result, after the second question
    last = _texts(seen[3])
    assert last[-3:] == ["read b", "", "contents of b.py"]
    assert processor.sync(second.all_messages()) == 1  # the final reply; nothing else was missing
    calls, results = _calls_and_results(home, "pai-reuse")
    assert calls == [("call_0", "a.py"), ("call_0_1", "b.py")]
    assert results == [("call_0", "contents of a.py"), ("call_0_1", "contents of b.py")]
    events = event_types(home, "pai-reuse")

    # a restart: a new processor on the same session reconciles the same history the same way
    again = ContextProcessor(profile=profile_path, session_id="pai-reuse")
    assert again.sync(second.all_messages()) == 0
    assert event_types(home, "pai-reuse") == events
    more: list[list[Any]] = []
    third = _pai_agent(again, more, [TextPart("both read")]).run_sync("thanks", message_history=second.all_messages())
    assert third.output == "both read"
    assert _texts(more[0])[-2:] == ["read b", "thanks"]
    assert _calls_and_results(home, "pai-reuse") == (calls, results)


def test_pydantic_ai_keeps_a_call_that_repeats_the_last_one_in_the_same_turn(home, profile_path):
    # the same tool, the same arguments and the same id: only the position tells them apart
    script = [
        ToolCallPart("read_file", {"path": "a.py"}, tool_call_id="call_0"),
        ToolCallPart("read_file", {"path": "a.py"}, tool_call_id="call_0"),
        TextPart("read a twice"),
    ]
    seen: list[list[Any]] = []
    processor = ContextProcessor(profile=profile_path, session_id="pai-reuse-turn")
    result = _pai_agent(processor, seen, script).run_sync("read a twice")
    assert result.output == "read a twice"
    assert _texts(seen[2])[-4:] == ["", "contents of a.py", "", "contents of a.py"]
    processor.sync(result.all_messages())
    calls, results = _calls_and_results(home, "pai-reuse-turn")
    assert calls == [("call_0", "a.py"), ("call_0_1", "a.py")]
    assert [r[0] for r in results] == ["call_0", "call_0_1"]
    events = event_types(home, "pai-reuse-turn")
    assert ContextProcessor(profile=profile_path, session_id="pai-reuse-turn").sync(result.all_messages()) == 0
    assert event_types(home, "pai-reuse-turn") == events


# -- the Agents SDK ---------------------------------------------------------------------------------------
@function_tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


def test_openai_agents_keeps_a_reply_that_reuses_an_earlier_runs_call_id(home, profile_path):
    calls_seen: list[ModelCall] = []
    replies = [
        [function_call("read_file", {"path": "a.py"}, call_id="call_0")],
        [assistant_message("read a")],
        [function_call("read_file", {"path": "b.py"}, call_id="call_0")],
        [assistant_message("read b")],
        [assistant_message("both read")],
    ]

    def respond(call: ModelCall) -> Any:
        calls_seen.append(call)
        return replies[len(calls_seen) - 1]

    session = ContextSession("oa-reuse", profile=profile_path)
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(5)])
    agent = SdkAgent(name="a", model=model, tools=[read_file])
    config = RunConfig(call_model_input_filter=session.input_filter)

    async def runs() -> Any:
        await Runner.run(agent, "read a", session=session, run_config=config)
        return await Runner.run(agent, "read b", session=session, run_config=config)

    second = asyncio.run(runs())
    assert second.final_output == "read b"
    _, sent = from_items(calls_seen[3].input)
    assert [m.role for m in sent][-3:] == ["user", "assistant", "tool"]
    assert sent[-1].tool_result.content == "contents of b.py"  # type: ignore[union-attr]
    calls, results = _calls_and_results(home, "oa-reuse")
    assert calls == [("call_0", "a.py"), ("call_0_1", "b.py")]
    assert results == [("call_0", "contents of a.py"), ("call_0_1", "contents of b.py")]
    events = event_types(home, "oa-reuse")
    replies_logged = sum(e["type"] == "assistant/message" for e in events)
    assert replies_logged == 4

    # a restart: the SDK hands a new session object the same run's items again
    again = ContextSession("oa-reuse", profile=profile_path)
    asyncio.run(again.add_items(second.to_input_list()))
    assert event_types(home, "oa-reuse") == events
    agent = SdkAgent(name="a", model=model, tools=[read_file])
    asyncio.run(
        Runner.run(agent, "thanks", session=again, run_config=RunConfig(call_model_input_filter=again.input_filter))
    )
    assert _calls_and_results(home, "oa-reuse") == (calls, results)
    assert sum(e["type"] == "assistant/message" for e in event_types(home, "oa-reuse")) == replies_logged + 1


# -- the shared reconcile ---------------------------------------------------------------------------------
def test_a_reused_id_in_a_history_is_mapped_to_the_id_the_log_gave_it(tmp_path):
    kernel = build_kernel(tmp_path / "home")
    managed = ManagedSession(kernel, "reuse", origin="test")
    history = [
        Message.user("read a"),
        Message.assistant("", [ToolCallBlock("call_0", "read_file", {"path": "a.py"})]),
        Message.tool("call_0", "contents of a.py"),
        Message.assistant("read a"),
        Message.user("read b"),
        Message.assistant("", [ToolCallBlock("call_0", "read_file", {"path": "b.py"})]),
        Message.tool("call_0", "contents of b.py"),
    ]
    managed.prepare(history[:1])
    request = managed.prepare(history)
    assert [m.text or (m.tool_result.content if m.tool_result else "") for m in request.messages][-3:] == [
        "read b",
        "",
        "contents of b.py",
    ]
    assert request.messages[-2].tool_calls[0].id == "call_0_1"
    messages = [e for e in managed.session.events if e.type in ("assistant/message", "tool/result")]
    # a restart (the open step is closed as interrupted when the session is opened again)
    restarted = ManagedSession(kernel, "reuse", origin="test")
    assert restarted.sync(history) == 0
    assert [e for e in restarted.session.events if e.type in ("assistant/message", "tool/result")] == messages


def _results(home: Any, session_id: str) -> list[tuple[str, bool]]:
    return [
        (b["call_id"], bool(b.get("is_error")))
        for e in event_types(home, session_id)
        if e["type"] == "tool/result"
        for b in e["data"]["message"]["content"]
    ]


def test_pydantic_ai_runs_a_strategy_tool_under_a_reused_id(home, profile_path):
    script = [
        ToolCallPart("read_file", {"path": "a.py"}, tool_call_id="call_0"),
        TextPart("read a"),
        ToolCallPart("notes_write_file", {"path": "self/notes/plan.md", "content": "b next"}, tool_call_id="call_0"),
        TextPart("noted"),
    ]
    processor = ContextProcessor(profile=profile_path, session_id="pai-reuse-tool")
    agent = _pai_agent(processor, [], script)
    first = agent.run_sync("read a")
    second = agent.run_sync("note it", message_history=first.all_messages())
    assert second.output == "noted"
    assert _results(home, "pai-reuse-tool") == [("call_0", False), ("call_0_1", False)]
    assert processor.managed._outcomes == {}  # the tool's own outcome was committed


def test_openai_agents_runs_a_strategy_tool_under_a_reused_id(home, profile_path):
    replies = [
        [function_call("read_file", {"path": "a.py"}, call_id="call_0")],
        [assistant_message("read a")],
        [function_call("notes_write_file", {"path": "self/notes/plan.md", "content": "b next"}, call_id="call_0")],
        [assistant_message("noted")],
    ]
    session = ContextSession("oa-reuse-tool", profile=profile_path)
    model = ScriptedModel([ModelStep.respond(lambda call, r=r: r) for r in replies])
    agent = SdkAgent(name="a", model=model, tools=[read_file, *session.tools()])
    config = RunConfig(call_model_input_filter=session.input_filter)

    async def runs() -> None:
        await Runner.run(agent, "read a", session=session, run_config=config)
        await Runner.run(agent, "note it", session=session, run_config=config)

    asyncio.run(runs())
    assert _results(home, "oa-reuse-tool") == [("call_0", False), ("call_0_1", False)]
    assert session.managed._outcomes == {}


def _numbered_per_reply(messages: list[Message]) -> list[Message]:
    """``messages`` with each reply's calls numbered from ``call_0``, as some providers do."""
    out: list[Message] = []
    ids: dict[str, str] = {}
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            ids = {c.id: f"call_{j}" for j, c in enumerate(message.tool_calls)}
            message = renamed_calls(message, list(ids.items()))
        elif message.role == "tool":
            result = message.tool_result
            assert result is not None
            message = Message.tool(ids[result.call_id], result.content, is_error=result.is_error, name=result.name)
        out.append(message)
    return out


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    blocks = [{k: v for k, v in b.items() if k not in ("id", "call_id")} for b in message["content"]]
    source = {k: v for k, v in message.get("source", {}).items() if k != "call_id"}
    return {**message, "content": blocks, "source": source}


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(conversations())
def test_ids_numbered_per_reply_append_each_message_once_also_after_a_restart(tmp_path, messages):
    messages = _numbered_per_reply(messages)
    kernel = build_kernel(tmp_path / "home")
    session = kernel.open_session()
    index = LogIndex()
    for end in range(1, len(messages) + 1):
        reconcile(session, messages[:end], index)
        reconcile(session, messages[:end], index)
    logged = [
        e.data["message"] for e in session.events if e.type in ("user/message", "assistant/message", "tool/result")
    ]
    assert [_without_ids(m) for m in logged] == [_without_ids(m.to_dict()) for m in messages]
    assert pairing_problems([Message.from_dict(m) for m in logged]) == []
    calls = [b["id"] for m in logged for b in m["content"] if b["type"] == "tool_call"]
    assert len(calls) == len(set(calls))
    assert reconcile(session, messages, LogIndex()) == 0  # a new index: as after a restart
