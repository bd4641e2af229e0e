"""Pydantic AI: an Agent with ContextProcessor runs 60+ steps of large tool results within the
profile's window, on Pydantic AI's own FunctionModel."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, UsageLimits
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ImageUrl,
    ModelRequest,
    ModelResponse,
    RequestUsage,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ctxkernel.integrations import IntegrationError
from ctxkernel.integrations.pydantic_ai import ContextProcessor, from_pydantic_ai

from .conftest import NOTE, STEPS, big_result, event_types, run_child


def _schemas(info: AgentInfo) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description or "", "parameters": t.parameters_json_schema},
        }
        for t in [*info.function_tools, *info.output_tools]
    ]


def test_a_long_agent_stays_within_the_window(home, profile_path, probe):
    seen: list[tuple[list[Any], AgentInfo]] = []

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.append((messages, info))
        k = len(seen) - 1
        system, history, _ = from_pydantic_ai(messages)
        system = "\n\n".join(s for s in (info.instructions, system) if s)
        # the double reports usage as a provider would: the size of what it was sent
        usage = RequestUsage(input_tokens=probe.measure(system, history, _schemas(info)), output_tokens=20)
        if k == 5:
            parts: list[Any] = [
                ToolCallPart("notes_write_file", {"path": "self/notes/plan.md", "content": NOTE}, tool_call_id="note-w")
            ]
        elif k == 50:
            parts = [ToolCallPart("notes_read_file", {"path": "self/notes/plan.md"}, tool_call_id="note-r")]
        elif k > STEPS:
            parts = [TextPart("done: every module read")]
        else:
            parts = [
                TextPart(f"reading module {k}"),
                ToolCallPart("read_file", {"path": f"src/module_{k}.py"}, tool_call_id=f"read-{k}"),
            ]
        return ModelResponse(parts=parts, usage=usage)

    processor = ContextProcessor(profile=profile_path, session_id="pai-1")
    agent = Agent(
        FunctionModel(model),
        instructions="You refactor code.",
        capabilities=[ProcessHistory(processor)],
        toolsets=[processor.toolset],
    )
    reads: list[str] = []

    @agent.tool_plain
    def read_file(path: str) -> str:
        """Read a source file."""
        reads.append(path)
        return big_result(int(path.split("_")[1].split(".")[0]))

    result = agent.run_sync("Read every module of the project.", usage_limits=UsageLimits(request_limit=STEPS + 10))

    assert result.output == "done: every module read"
    assert len(seen) == STEPS + 2
    assert len(reads) == STEPS - 1
    unmanaged = sum(probe.meter.count_text(big_result(i)) for i in range(STEPS))
    assert unmanaged > 4 * probe.window
    assert max(probe.sizes) <= probe.window
    assert probe.unpaired == []
    assert {"notes_write_file", "new_context"} <= {t.name for t in seen[0][1].function_tools}
    answer = next(
        p
        for m in seen[51][0]
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_call_id == "note-r"
    )
    assert NOTE in answer.content and answer.outcome == "success"
    # the final reply is in no later request: sync() commits it from the run's messages
    assert processor.sync(result.all_messages()) == 1
    assert processor.sync(result.all_messages()) == 0
    events = event_types(home, "pai-1")
    assert sum(e["type"] == "compaction/summary" for e in events) >= 3
    assert sum(e["type"] == "tool/result" for e in events) == STEPS + 1
    assert sum(e["type"] == "assistant/message" for e in events) == STEPS + 2

    child = run_child("pydantic-ai", home, profile_path, "pai-1")
    assert child["prompt_tokens"] <= probe.window
    after = event_types(home, "pai-1")
    assert after[: len(events)] == events
    surface_events = [
        e["type"] for e in after[len(events) :] if e["type"].endswith("message") or e["type"] == "tool/result"
    ]
    assert surface_events == ["user/message"]  # the child's reply is committed by its next request or sync
    assert any("done: every module read" in text for text in child["seen"])


def test_passing_the_run_history_back_continues_the_session(home, profile_path):
    seen: list[list[Any]] = []

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.append(messages)
        return ModelResponse(parts=[TextPart(f"answer {len(seen)}")])

    processor = ContextProcessor(profile=profile_path)
    agent = Agent(FunctionModel(model), capabilities=[ProcessHistory(processor)], toolsets=[processor.toolset])
    first = agent.run_sync("first question")
    agent.run_sync("second question", message_history=first.all_messages())
    _, history, _ = from_pydantic_ai(seen[1])
    assert [m.text for m in history] == ["first question", "answer 1", "second question"]
    events = processor.managed.session.events
    assert [e.type for e in events].count("assistant/message") == 1  # the second answer awaits sync()
    assert [e.type for e in events].count("user/message") == 2


def test_a_part_the_kernel_cannot_hold_is_refused_by_name():
    request = ModelRequest(parts=[UserPromptPart(["look", ImageUrl("https://example.invalid/a.png")])])
    with pytest.raises(
        IntegrationError, match=r"messages\[0\]\.parts\[0\] \(UserPromptPart\): content\[1\] is ImageUrl"
    ):
        from_pydantic_ai([request])


def test_a_foreign_history_is_refused_not_dropped(home, profile_path):
    processor = ContextProcessor(profile=profile_path)
    agent = Agent(
        FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("ok")])),
        capabilities=[ProcessHistory(processor)],
        toolsets=[processor.toolset],
    )
    agent.run_sync("hello")
    processor.sync([ModelRequest(parts=[UserPromptPart("hello")]), ModelResponse(parts=[TextPart("ok")])])
    before = len(processor.managed.session.events)
    stranger = [
        ModelRequest(parts=[UserPromptPart("x")]),
        ModelResponse(parts=[TextPart("a reply this session never gave")]),
    ]
    with pytest.raises(IntegrationError, match="does not continue session"):
        processor.sync(stranger)
    assert len(processor.managed.session.events) == before


def test_the_model_settings_carry_the_sessions_prompt_cache_key(home, profile_path):
    from ctxkernel.convert import prompt_cache_key

    settings_seen: list[Any] = []

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        settings_seen.append(info.model_settings)
        return ModelResponse(parts=[TextPart("ok")])

    processor = ContextProcessor(profile=profile_path, session_id="pai-cache")
    agent = Agent(
        FunctionModel(model),
        capabilities=[ProcessHistory(processor)],
        toolsets=[processor.toolset],
        model_settings=processor.model_settings(),
    )
    first = agent.run_sync("first question")
    agent.run_sync("second question", message_history=first.all_messages())
    assert len(settings_seen) == 2
    for settings in settings_seen:
        assert settings["openai_prompt_cache_key"] == prompt_cache_key(processor.session_id)
    # Pydantic AI's own breakpoints (Anthropic, Bedrock), taken up by models that support them
    assert processor.model_settings()["cache"] is True


def test_the_tools_the_framework_sends_are_the_ones_the_kernel_counts_and_runs(home):
    from pydantic_ai.messages import TextPart, ToolCallPart

    from ctxkernel.recall.history_tools import HISTORY_TOOL_NAMES
    from ctxkernel.testing import build_kernel

    # basic's history tools come once something is hidden, but Pydantic AI binds its toolset up
    # front and sends it with every call: the session offers them all from the first request
    kernel = build_kernel(
        home, strategies=["basic", "history"], model={"context_window": 8000, "reserved_output_tokens": 500}
    )
    seen: list[AgentInfo] = []

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        if len(seen) == 1:
            return ModelResponse(parts=[ToolCallPart("history_search_contents", {"query": "hello"}, tool_call_id="h1")])
        return ModelResponse(parts=[TextPart("done")])

    processor = ContextProcessor(profile=kernel, session_id="pai-every-tool")
    agent = Agent(FunctionModel(model), capabilities=[ProcessHistory(processor)], toolsets=[processor.toolset])
    agent.run_sync("hello")
    sent = [t.name for t in seen[0].function_tools]
    assert sent == list(HISTORY_TOOL_NAMES)
    session = processor.managed.session
    header = next(e for e in session.events if e.type == "request/header")
    assert [t["function"]["name"] for t in header.data["tools"]] == sent  # the meter counted them
    assert "history_search_contents" in header.data["system"]
    result = next(e for e in session.events if e.type == "tool/result")
    assert not result.data["message"]["content"][0].get("is_error")
