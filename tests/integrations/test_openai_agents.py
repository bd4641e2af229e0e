"""OpenAI Agents SDK: ContextSession keeps one 60-step run (with its input filter) and 60
one-step runs (the session alone) within the profile's window, on the SDK's ScriptedModel."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from ctxkernel.integrations import IntegrationError
from ctxkernel.integrations.openai_agents import ContextSession, from_items

from .conftest import NOTE, STEPS, big_result, event_types, run_child

set_tracing_disabled(True)


def _measure(probe: Any, call: ModelCall) -> int:
    system, history = from_items(call.input)
    system = "\n\n".join(s for s in (call.system_instructions or "", system) if s)
    tools = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.params_json_schema},
        }
        for t in call.tools
    ]
    return probe.measure(system, history, tools)


def _reader(reads: list[str]) -> Any:
    @function_tool
    def read_file(path: str) -> str:
        """Read a source file."""
        reads.append(path)
        return big_result(int(path.split("_")[1].split(".")[0]))

    return read_file


def _output(call: ModelCall, call_id: str) -> str:
    return next(
        i["output"]
        for i in call.input
        if isinstance(i, dict) and i.get("type") == "function_call_output" and i.get("call_id") == call_id
    )


def test_one_long_run_stays_within_the_window(home, profile_path, probe):
    calls: list[ModelCall] = []

    def respond(call: ModelCall) -> Any:
        calls.append(call)
        k = len(calls) - 1
        if k == 5:
            return [
                function_call("notes_write_file", {"path": "self/notes/plan.md", "content": NOTE}, call_id="note-w")
            ]
        if k == 50:
            return [function_call("notes_read_file", {"path": "self/notes/plan.md"}, call_id="note-r")]
        if k > STEPS:
            return [assistant_message("done: every module read")]
        return [
            assistant_message(f"reading module {k}", item_id=f"msg-{k}"),
            function_call("read_file", {"path": f"src/module_{k}.py"}, call_id=f"read-{k}"),
        ]

    session = ContextSession("oa-long", profile=profile_path)
    reads: list[str] = []
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(STEPS + 2)])
    agent = Agent(
        name="coder", instructions="You refactor code.", model=model, tools=[_reader(reads), *session.tools()]
    )
    run_config = RunConfig(call_model_input_filter=session.input_filter)
    result = asyncio.run(
        Runner.run(
            agent, "Read every module of the project.", session=session, run_config=run_config, max_turns=STEPS + 10
        )
    )

    assert result.final_output == "done: every module read"
    model.assert_complete()
    assert len(reads) == STEPS - 1
    unmanaged = sum(probe.meter.count_text(big_result(i)) for i in range(STEPS))
    assert unmanaged > 4 * probe.window
    assert max(_measure(probe, c) for c in calls) <= probe.window
    assert probe.unpaired == []
    assert {"notes_write_file", "new_context"} <= {t.name for t in calls[0].tools}
    assert NOTE in _output(calls[51], "note-r")
    events = event_types(home, "oa-long")
    assert sum(e["type"] == "compaction/summary" for e in events) >= 3
    assert sum(e["type"] == "tool/result" for e in events) == STEPS + 1
    assert sum(e["type"] == "assistant/message" for e in events) == STEPS + 2

    child = run_child("openai-agents", home, profile_path, "oa-long")
    assert child["prompt_tokens"] <= probe.window
    after = event_types(home, "oa-long")
    assert after[: len(events)] == events
    new = [e["type"] for e in after[len(events) :] if e["type"].endswith("message") or e["type"] == "tool/result"]
    assert new == ["user/message", "assistant/message"]
    assert any("done: every module read" in text for text in child["seen"])


def test_sixty_one_step_runs_on_one_session_stay_within_the_window(home, profile_path, probe):
    calls: list[ModelCall] = []

    def respond(call: ModelCall) -> Any:
        calls.append(call)
        k = len(calls) - 1
        run = k // 2
        if k % 2:
            return [assistant_message(f"module {run} read")]
        if run == 5:
            return [
                function_call("notes_write_file", {"path": "self/notes/plan.md", "content": NOTE}, call_id="note-w")
            ]
        if run == 50:
            return [function_call("notes_read_file", {"path": "self/notes/plan.md"}, call_id="note-r")]
        return [function_call("read_file", {"path": f"src/module_{run}.py"}, call_id=f"read-{run}")]

    session = ContextSession("oa-runs", profile=profile_path)
    reads: list[str] = []
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(2 * STEPS)])
    agent = Agent(
        name="coder", instructions="You refactor code.", model=model, tools=[_reader(reads), *session.tools()]
    )

    async def runs() -> None:
        for run in range(STEPS):
            # the session alone: the SDK reads it when each run starts
            await Runner.run(agent, f"Read module {run}.", session=session)

    asyncio.run(runs())
    model.assert_complete()
    assert len(reads) == STEPS - 2
    assert max(_measure(probe, c) for c in calls) <= probe.window
    assert probe.unpaired == []
    assert NOTE in _output(calls[101], "note-r")
    events = event_types(home, "oa-runs")
    assert sum(e["type"] == "compaction/summary" for e in events) >= 3
    assert sum(e["type"] == "assistant/message" for e in events) == 2 * STEPS
    assert sum(e["type"] == "turn/start" for e in events) == STEPS
    user_texts = [
        e["data"]["message"]["content"][0]["text"]
        for e in events
        if e["type"] == "user/message" and e["data"]["message"]["source"]["kind"] == "user"
    ]
    assert user_texts == [f"Read module {run}." for run in range(STEPS)]


def test_pop_and_clear_take_items_off_the_surface_but_not_out_of_the_log(home, profile_path):
    session = ContextSession("oa-pop", profile=profile_path)
    model = ScriptedModel([ModelStep.respond(lambda call: [assistant_message("hi there")])])
    agent = Agent(name="a", model=model)
    asyncio.run(Runner.run(agent, "hello", session=session))
    kernel_session = session.managed.session
    logged = len(kernel_session.events)
    popped = asyncio.run(session.pop_item())
    assert popped["content"][0]["text"] == "hi there"
    assert [n.message.text for n in kernel_session.surface.nodes] == ["hello"]
    asyncio.run(session.clear_session())
    assert asyncio.run(session.get_items()) == []
    assert len(kernel_session.events) > logged
    assert any(e.type == "assistant/message" for e in kernel_session.events)


def test_an_item_the_kernel_cannot_hold_is_refused_by_name():
    items = [{"role": "user", "content": "hi"}, {"type": "computer_call", "call_id": "c1", "action": {}}]
    with pytest.raises(IntegrationError, match=r"input\[1\]: ctxkernel cannot hold a 'computer_call' item"):
        from_items(items)
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]
    with pytest.raises(IntegrationError, match=r"input\[0\]: content\[0\] is a 'input_image' part"):
        from_items(image)


def test_a_limited_read_never_starts_with_a_tool_output(home, profile_path):
    session = ContextSession("oa-limit", profile=profile_path)
    reads: list[str] = []
    model = ScriptedModel(
        [[function_call("read_file", {"path": "src/module_1.py"}, call_id="r1")], [assistant_message("read")]]
    )
    agent = Agent(name="a", model=model, tools=[_reader(reads)])
    asyncio.run(Runner.run(agent, "read module 1", session=session))
    # the surface: user, call, output, reply; the last two items would start with the output
    items = asyncio.run(session.get_items(limit=2))
    assert [i.get("type", "message") for i in items] == ["message"]
    assert items[0]["content"][0]["text"] == "read"


def test_the_model_settings_carry_the_sessions_prompt_cache_key(home, profile_path):
    from agents import ModelSettings

    from ctxkernel.convert import prompt_cache_key

    calls: list[ModelCall] = []

    def respond(call: ModelCall) -> Any:
        calls.append(call)
        return [assistant_message("hi there")]

    session = ContextSession("oa-cache", profile=profile_path)
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(2)])
    settings = session.model_settings(ModelSettings(temperature=0.2))
    agent = Agent(name="a", model=model, model_settings=settings)
    for prompt in ("hello", "again"):
        asyncio.run(Runner.run(agent, prompt, session=session))
    assert len(calls) == 2
    key = prompt_cache_key(session.managed.id)
    for call in calls:
        assert call.model_settings.extra_args["prompt_cache_key"] == key
        assert call.model_settings.temperature == 0.2
    # a key of the caller's own is kept
    own = session.model_settings(ModelSettings(extra_args={"prompt_cache_key": "mine"}))
    assert own.extra_args == {"prompt_cache_key": "mine"}


def test_the_session_offers_every_strategy_tool_the_agent_is_given(home):
    from ctxkernel.recall.history_tools import HISTORY_TOOL_NAMES
    from ctxkernel.testing import build_kernel

    # the SDK sends the agent's tools with every call, so the kernel counts and runs them all
    # from the first request, also the history tools basic offers once something is hidden
    kernel = build_kernel(
        home, strategies=["basic", "history"], model={"context_window": 8000, "reserved_output_tokens": 500}
    )
    session = ContextSession("oa-every-tool", profile=kernel)
    assert [t.name for t in session.tools()] == list(HISTORY_TOOL_NAMES)
    managed = session.managed.session
    managed.user("hi")
    request = managed.prepare_request()
    assert [t["function"]["name"] for t in request.tools] == list(HISTORY_TOOL_NAMES)
    assert all(managed.owns_tool(name) for name in HISTORY_TOOL_NAMES)


def test_an_agent_tool_with_a_strategy_tools_name_wins(home, profile_path):
    # the SDK sent the agent's notes_write_file and the strategy's (a provider refuses a name
    # twice), and the session counted the agent's as the strategy's
    written: list[str] = []

    @function_tool
    def notes_write_file(path: str, content: str) -> str:
        """The agent's own notes tool."""
        written.append(path)
        return "saved by the agent"

    calls: list[ModelCall] = []

    def respond(call: ModelCall) -> Any:
        calls.append(call)
        if len(calls) == 1:
            return [function_call("notes_write_file", {"path": "mine.md", "content": "x"}, call_id="w1")]
        return [assistant_message("saved")]

    session = ContextSession("oa-clash", profile=profile_path)
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(2)])
    agent = Agent(name="coder", model=model, tools=[notes_write_file, *session.tools()])
    run_config = RunConfig(call_model_input_filter=session.input_filter)
    result = asyncio.run(Runner.run(agent, "save the plan", session=session, run_config=run_config))

    assert result.final_output == "saved"
    names = [t.name for t in calls[0].tools]
    assert names.count("notes_write_file") == 1 and "notes_read_file" in names
    assert next(t for t in calls[0].tools if t.name == "notes_write_file").description == "The agent's own notes tool."
    assert written == ["mine.md"] and _output(calls[1], "w1") == "saved by the agent"
    managed = session.managed.session
    assert not managed.owns_tool("notes_write_file")
    header = next(e for e in managed.events if e.type == "request/header")
    assert [t["function"]["name"] for t in header.data["tools"]].count("notes_write_file") == 1
    assert "notes/write" not in [e.type for e in managed.events]
