"""Pydantic AI adapter: :class:`ContextProcessor`, a history processor with a toolset.

::

    from pydantic_ai import Agent
    from pydantic_ai.capabilities import ProcessHistory
    from ctxkernel.integrations.pydantic_ai import ContextProcessor

    processor = ContextProcessor(profile="handoff", session_id="chat-42")
    agent = Agent(model, capabilities=[ProcessHistory(processor)], toolsets=[processor.toolset])

Before each model request the processor reconciles the run's message history with the session's
log and returns the managed surface in its place (Pydantic AI then keeps that as the run's
history). The model's reply is committed when the history shows it, at the next request, or by
:meth:`ContextProcessor.sync` after the run. The strategies' system sections go in a
``SystemPromptPart``; the agent's instructions stay with Pydantic AI and are counted by the meter.

Install with ``pip install 'ctxkernel[pydantic-ai]'``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    RetryFeedbackPart,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.tools import Tool
from pydantic_ai.toolsets import FunctionToolset

from ..convert import arguments_from_json
from ..kernel import Kernel
from ..messages import Block, Message, ReasoningBlock, Source, TextBlock, ToolCallBlock
from ._core import ManagedSession, open_kernel, strategy_tool_schemas
from ._reconcile import IntegrationError

_ORIGIN = "pydantic-ai"
#: marks the system part that carries the strategies' sections: the processor's output becomes
#: the run's history, so the next request must not read it back as the agent's own system prompt
_MARK = {"ctxkernel": "strategy-sections"}


# -- messages --------------------------------------------------------------------------------------------
def _user_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for i, item in enumerate(content):
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, TextContent):
            parts.append(item.content)
        else:
            msg = f"{where}: content[{i}] is {type(item).__name__}, which ctxkernel cannot hold; accepted: text"
            raise IntegrationError(msg)
    return "\n".join(parts)


def _tool_content(part: ToolReturnPart) -> str:
    if isinstance(part.content, str):
        return part.content
    return part.model_response_str(wrap_if_error=False)


def from_pydantic_ai(messages: Sequence[ModelMessage]) -> tuple[str, list[Message], dict[int, Any]]:
    """Pydantic AI messages as ``(system text, kernel messages, usage by message index)``.

    System prompt parts are joined into the system text; a request's tool returns become tool
    messages and its user prompts user messages, in the request's order."""
    system: list[str] = []
    out: list[Message] = []
    usages: dict[int, Any] = {}
    for i, message in enumerate(messages):
        if isinstance(message, ModelResponse):
            where = f"messages[{i}] (ModelResponse)"
            usage = message.usage
            if usage.input_tokens or usage.output_tokens:
                usages[len(out)] = {
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "cached_input_tokens": usage.cache_read_tokens,
                }
            out.append(Message("assistant", tuple(_response_blocks(message.parts, where)), Source(kind="model")))
            continue
        if not isinstance(message, ModelRequest):
            msg = f"messages[{i}]: ctxkernel cannot hold a {type(message).__name__}; accepted: ModelRequest, ModelResponse"
            raise IntegrationError(msg)
        for j, part in enumerate(message.parts):
            where = f"messages[{i}].parts[{j}] ({type(part).__name__})"
            if isinstance(part, SystemPromptPart):
                if part.metadata != _MARK:
                    system.append(part.content)
            elif isinstance(part, UserPromptPart):
                out.append(Message.user(_user_text(part.content, where)))
            elif isinstance(part, ToolReturnPart):
                out.append(
                    Message.tool(
                        part.tool_call_id, _tool_content(part), is_error=part.outcome != "success", name=part.tool_name
                    )
                )
            elif isinstance(part, RetryFeedbackPart):
                out.append(Message.user(part.model_response()))
            else:
                msg = (
                    f"{where}: ctxkernel cannot hold this part; accepted: SystemPromptPart, UserPromptPart, "
                    "ToolReturnPart, RetryFeedbackPart"
                )
                raise IntegrationError(msg)
    return "\n\n".join(system), out, usages


def _response_blocks(parts: Sequence[ModelResponsePart], where: str) -> list[Block]:
    blocks: list[Block] = []
    for j, part in enumerate(parts):
        if type(part) is TextPart:
            blocks.append(TextBlock(part.content))
        elif type(part) is ThinkingPart:
            blocks.append(ReasoningBlock(part.content, part.signature))
        elif type(part) is ToolCallPart:
            args = part.args
            arguments = arguments_from_json(args) if isinstance(args, str) else dict(args or {})
            blocks.append(ToolCallBlock(part.tool_call_id, part.tool_name, arguments))
        else:
            msg = (
                f"{where}.parts[{j}] ({type(part).__name__}): ctxkernel cannot hold this part; "
                "accepted: TextPart, ThinkingPart, ToolCallPart"
            )
            raise IntegrationError(msg)
    return blocks


def to_pydantic_ai(
    messages: Sequence[Message], *, system: str = "", instructions: str | None = None
) -> list[ModelMessage]:
    """Kernel messages as Pydantic AI messages: consecutive user and tool messages share one
    ``ModelRequest`` (the first holds ``system`` as a ``SystemPromptPart``; the last carries
    ``instructions``); each assistant message is a ``ModelResponse``."""
    out: list[ModelMessage] = []
    parts: list[Any] = [SystemPromptPart(system, metadata=dict(_MARK))] if system else []
    names: dict[str, str] = {}
    for message in messages:
        if message.role == "assistant":
            if parts:
                out.append(ModelRequest(parts=parts))
                parts = []
            response: list[Any] = []
            for block in message.content:
                if isinstance(block, TextBlock):
                    response.append(TextPart(block.text))
                elif isinstance(block, ReasoningBlock):
                    response.append(ThinkingPart(block.text, signature=block.signature))
                elif isinstance(block, ToolCallBlock):
                    names[block.id] = block.name
                    raw = block.arguments.get("_raw") if set(block.arguments) == {"_raw"} else None
                    response.append(
                        ToolCallPart(
                            block.name, raw if isinstance(raw, str) else dict(block.arguments), tool_call_id=block.id
                        )
                    )
            out.append(ModelResponse(parts=response))
        elif message.role == "tool":
            result = message.tool_result
            assert result is not None
            name = result.name or names.get(result.call_id, "")
            parts.append(
                ToolReturnPart(
                    name,
                    result.content,
                    tool_call_id=result.call_id,
                    outcome="failed" if result.is_error else "success",
                )
            )
        else:
            parts.append(UserPromptPart(message.text))
    if parts:
        out.append(ModelRequest(parts=parts))
    if instructions and out and isinstance(out[-1], ModelRequest):
        out[-1].instructions = instructions
    return out


# -- the processor ---------------------------------------------------------------------------------------
def _schema(definition: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": definition.name,
            "description": definition.description or "",
            "parameters": definition.parameters_json_schema,
        },
    }


class ContextProcessor:
    """A Pydantic AI history processor that gives the model a ctxkernel profile's managed surface.

    :param profile: a profile name, a path to a profile file, or a :class:`~ctxkernel.Kernel`.
    :param session_id: the ctxkernel session (resumed when it exists); None starts a new one.

    Register it as ``Agent(model, capabilities=[ProcessHistory(processor)],
    toolsets=[processor.toolset])``.
    """

    def __init__(self, profile: str | os.PathLike[str] | Kernel = "handoff", session_id: str | None = None) -> None:
        self.kernel = open_kernel(profile)
        # the framework sends the strategy tools it was given with every call: the session offers
        # them all from the first, so the meter counts and the kernel runs what the model sees
        self.managed = ManagedSession(self.kernel, session_id, origin=_ORIGIN, every_tool=True)
        self._own: set[str] = set()
        self.toolset: FunctionToolset[Any] = FunctionToolset(
            [self._tool(schema) for schema in strategy_tool_schemas(self.kernel)]
        )

    @property
    def session_id(self) -> str:
        return self.managed.id

    def _tool(self, schema: dict[str, Any]) -> Tool[Any]:
        function = schema["function"]
        name = function["name"]
        self._own.add(name)

        def run(ctx: RunContext[Any], **arguments: Any) -> str:
            call_id = ctx.tool_call_id
            if not call_id:
                msg = f"{name}: Pydantic AI gave no tool call id; ctxkernel pairs results by call id"
                raise IntegrationError(msg)
            # the reply that made this call is in the run's history: commit it before its tool runs
            self.sync(ctx.messages)
            return self.managed.run_tool(call_id, name, arguments).content

        return Tool.from_schema(
            run,
            name=name,
            description=function.get("description"),
            json_schema=function.get("parameters") or {},
            takes_ctx=True,
        )

    def model_settings(self) -> dict[str, Any]:
        """Pydantic AI model settings that keep the provider's prompt cache warm (docs/cache.md):
        ``openai_prompt_cache_key``, the session's key, and ``cache``, Pydantic AI's own
        ``cache_control`` breakpoints on Anthropic requests. Empty with ``[cache] hints = false``.
        Pass them as ``Agent(..., model_settings=processor.model_settings())``."""
        key = self.managed.prompt_cache_key
        return {} if key is None else {"openai_prompt_cache_key": key, "cache": True}

    def sync(self, messages: Sequence[ModelMessage]) -> int:
        """Append what ``messages`` hold that the log does not, e.g. ``result.all_messages()``
        after a run, whose final reply no later request showed the processor."""
        _, history, usages = from_pydantic_ai(messages)
        return self.managed.sync(history, usages)

    def __call__(self, ctx: RunContext[Any], messages: list[ModelMessage]) -> list[ModelMessage]:
        system, history, usages = from_pydantic_ai(messages)
        instructions = next((m.instructions for m in reversed(messages) if isinstance(m, ModelRequest)), None)
        harness: list[dict[str, Any]] = []
        if ctx.tool_manager is not None:
            try:
                harness = [_schema(d) for d in ctx.tool_manager.tool_defs if d.name not in self._own]
            except ValueError:  # a tool manager not prepared for this step: nothing to count
                harness = []
        # the instructions reach the model through Pydantic AI; they are part of the harness's
        # system prompt only so that the meter counts them
        own = "\n\n".join(s for s in (instructions, system) if s and s.strip()) or None
        request = self.managed.prepare(history, system=own, harness_tools=harness, usages=usages)
        extra = request.system
        if instructions and instructions.strip() and extra.startswith(instructions.strip()):
            extra = extra[len(instructions.strip()) :].lstrip("\n")
        return to_pydantic_ai(request.messages, system=extra, instructions=instructions)


__all__ = ["ContextProcessor", "from_pydantic_ai", "to_pydantic_ai"]
