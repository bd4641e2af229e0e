"""Continue a session in a fresh process: ``python resume_child.py FRAMEWORK PROFILE SESSION_ID``.

Builds the framework's agent with the adapter on the same session id, sends one new user
message, and prints JSON: the texts the model was given and their size in the profile's tokens.
Run by the adapter tests as a subprocess (it is not a test module)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from ctxkernel import Message
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.profile import load_profile

PROMPT = "Now summarise what you found."


def measure(profile: str, system: str, messages: list[Message], tools: list[dict[str, Any]]) -> int:
    meter = Meter(get_tokenizer(load_profile(profile).model.tokenizer))
    return meter.count_header(system, tools) + sum(meter.count_message(m) for m in messages)


def langchain(profile: str, session_id: str) -> dict[str, Any]:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from ctxkernel.integrations.langchain import ContextMiddleware, from_langchain

    seen: list[Any] = []

    class Model(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            seen.append((list(messages), list(kwargs.get("tools") or [])))
            return super()._generate(messages, stop, run_manager, **kwargs)

    agent = create_agent(
        Model(messages=iter([AIMessage("summary")])), [], middleware=[ContextMiddleware(profile=profile)]
    )
    agent.invoke({"messages": [HumanMessage(PROMPT)]}, {"configurable": {"thread_id": session_id}})
    system, history = from_langchain(seen[0][0])
    return {"seen": [m.text for m in history], "prompt_tokens": measure(profile, system, history, seen[0][1])}


def pydantic_ai(profile: str, session_id: str) -> dict[str, Any]:
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import ProcessHistory
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from ctxkernel.integrations.pydantic_ai import ContextProcessor, from_pydantic_ai

    seen: list[Any] = []

    def reply(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.append((messages, info))
        return ModelResponse(parts=[TextPart("summary")])

    processor = ContextProcessor(profile=profile, session_id=session_id)
    agent = Agent(FunctionModel(reply), capabilities=[ProcessHistory(processor)], toolsets=[processor.toolset])
    agent.run_sync(PROMPT)
    system, history, _ = from_pydantic_ai(seen[0][0])
    return {"seen": [m.text for m in history], "prompt_tokens": measure(profile, system, history, [])}


def openai_agents(profile: str, session_id: str) -> dict[str, Any]:
    from agents import Agent, RunConfig, Runner, set_tracing_disabled
    from agents.testing import ModelStep, ScriptedModel, assistant_message

    from ctxkernel.integrations.openai_agents import ContextSession, from_items

    set_tracing_disabled(True)
    seen: list[Any] = []

    def reply(call: Any) -> Any:
        seen.append(call)
        return [assistant_message("summary")]

    session = ContextSession(session_id, profile=profile)
    agent = Agent(name="coder", model=ScriptedModel([ModelStep.respond(reply)]), tools=session.tools())
    asyncio.run(
        Runner.run(agent, PROMPT, session=session, run_config=RunConfig(call_model_input_filter=session.input_filter))
    )
    system, history = from_items(seen[0].input)
    system = "\n\n".join(s for s in (seen[0].system_instructions or "", system) if s)
    return {"seen": [m.text for m in history], "prompt_tokens": measure(profile, system, history, [])}


if __name__ == "__main__":
    framework, profile_path, sid = sys.argv[1:4]
    result = {"langchain": langchain, "pydantic-ai": pydantic_ai, "openai-agents": openai_agents}[framework](
        profile_path, sid
    )
    print(json.dumps(result))
