"""docs/integrations.md stays honest: each framework's example runs on its test double."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from agents.testing import ScriptedModel, assistant_message, function_call
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from .conftest import REPO, event_types
from .test_langchain import ToolCallingFakeModel

DOC = REPO / "docs" / "integrations.md"


def example(section: str) -> dict[str, Any]:
    """Execute the first python block under ``## section`` and return its namespace."""
    text = DOC.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", body, re.DOTALL)[0]
    assert len(block.strip().splitlines()) <= 20, f"the {section} example should stay short"
    namespace: dict[str, Any] = {}
    exec(compile(block, f"docs/integrations.md ({section})", "exec"), namespace)  # our own docs
    return namespace


def test_the_doc_names_every_adapter_and_its_extra():
    text = DOC.read_text()
    pyproject = (REPO / "pyproject.toml").read_text()
    for extra in ("langchain", "pydantic-ai", "openai-agents"):
        assert f"pip install 'ctxkernel[{extra}]'" in text
        assert re.search(rf"(?m)^{extra} = \[", pyproject), f"pyproject.toml has no extra {extra!r}"


def test_the_langchain_example_runs(home):
    ran: list[str] = []

    @tool
    def run_tests(path: str) -> str:
        """Run the tests under a path."""
        ran.append(path)
        return "1 passed"

    model = ToolCallingFakeModel(
        messages=iter(
            [
                AIMessage("", tool_calls=[{"id": "t1", "name": "run_tests", "args": {"path": "tests/"}}]),
                AIMessage("The test passes now."),
            ]
        )
    )
    agent = example("LangChain")["make_agent"](model, [run_tests])
    out = agent.invoke({"messages": [("user", "Fix the failing test")]}, {"configurable": {"thread_id": "fix-42"}})
    assert out["messages"][-1].content == "The test passes now."
    assert ran == ["tests/"]
    assert [e["type"] for e in event_types(home, "fix-42")].count("assistant/message") == 2


def test_the_pydantic_ai_example_runs(home):
    def reply(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart(
                        "notes_write_file", {"path": "self/notes/todo.md", "content": "fix parser"}, tool_call_id="n1"
                    )
                ]
            )
        return ModelResponse(parts=[TextPart("Noted.")])

    agent = example("Pydantic AI")["make_agent"](FunctionModel(reply), "fix-42")
    result = agent.run_sync("Fix the failing test")
    assert result.output == "Noted."
    events = event_types(home, "fix-42")
    assert any(e["type"] == "notes/write" for e in events)
    assert [e["data"]["message"]["content"][0]["text"] for e in events if e["type"] == "user/message"] == [
        "Fix the failing test"
    ]


def test_the_openai_agents_example_runs(home):
    model = ScriptedModel(
        [
            [function_call("notes_write_file", {"path": "self/notes/todo.md", "content": "fix parser"}, call_id="n1")],
            [assistant_message("Noted.")],
        ]
    )
    answer = asyncio.run(example("OpenAI Agents SDK")["ask"](model, "Fix the failing test", "fix-42"))
    assert answer == "Noted."
    model.assert_complete()
    events = event_types(home, "fix-42")
    assert any(e["type"] == "notes/write" for e in events)
    assert [e["type"] for e in events].count("assistant/message") == 2
