"""LangChain v1 adapter: :class:`ContextMiddleware` for ``create_agent``.

::

    from langchain.agents import create_agent
    from ctxkernel.integrations.langchain import ContextMiddleware

    agent = create_agent(model, tools, middleware=[ContextMiddleware(profile="handoff")])

Before each model call (``wrap_model_call``) the request's messages are reconciled with the
session's log and replaced by the managed surface, the system prompt by the framework's prompt
plus the strategies' sections, and the strategies' tools are offered with the agent's own. The
reply is committed. The strategies' tools are registered as the middleware's ``tools`` (so the
agent's tool node runs them like any other) and are answered by ``wrap_tool_call``. The prompt
cache hints go in the request's ``model_settings`` as LangChain's own chat models take them: the
session's ``prompt_cache_key`` for OpenAI models, a ``cache_control`` breakpoint for Anthropic
ones, unless the agent set its own.

Install with ``pip install 'ctxkernel[langchain]'``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.config import get_config

from ..convert import arguments_from_json
from ..kernel import Kernel
from ..messages import Block, Message, ReasoningBlock, Source, TextBlock, ToolCallBlock
from ._core import ManagedSession, open_kernel, strategy_tool_schemas
from ._reconcile import IntegrationError

_ORIGIN = "langchain"
#: sessions kept open per middleware (by thread id); the least recently used is closed first
OPEN_SESSIONS = 128
#: chat models (by ``_llm_type``, as LangChain's ModelFallbackMiddleware tells them apart) that
#: take ``prompt_cache_key``, and those that take an Anthropic ``cache_control`` breakpoint
PROMPT_CACHE_KEY_MODELS = frozenset({"openai-chat", "azure-openai-chat"})
CACHE_CONTROL_MODELS = frozenset({"anthropic-chat", "anthropic-bedrock-chat", "anthropic-chat-vertexai"})


# -- messages --------------------------------------------------------------------------------------------
def _text_parts(content: Any, where: str) -> list[str]:
    """The text of a user or tool message's content; any other part is refused by name."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        msg = f"{where}: content must be a string or a list of parts, got {type(content).__name__}"
        raise IntegrationError(msg)
    parts = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            msg = f"{where}: content[{i}] is a {kind!r} part, which ctxkernel cannot hold; accepted: text parts"
            raise IntegrationError(msg)
    return parts


def _assistant_blocks(message: AIMessage, where: str) -> list[Block]:
    content = message.content
    blocks: list[Block] = []
    call_ids = {c.get("id") for c in message.tool_calls} | {c.get("id") for c in message.invalid_tool_calls}
    items = [content] if isinstance(content, str) else content
    if not isinstance(items, list):
        msg = f"{where}: content must be a string or a list of parts, got {type(content).__name__}"
        raise IntegrationError(msg)
    for i, part in enumerate(items):
        if isinstance(part, str):
            if part:
                blocks.append(TextBlock(part))
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            blocks.append(TextBlock(part["text"]))
        elif kind == "reasoning" and isinstance(part.get("reasoning", ""), str):
            blocks.append(ReasoningBlock(part.get("reasoning", "")))
        elif kind == "thinking" and isinstance(part.get("thinking", ""), str):
            signature = part.get("signature")
            blocks.append(ReasoningBlock(part.get("thinking", ""), signature if isinstance(signature, str) else None))
        elif kind in ("tool_use", "tool_call", "function_call") and part.get("id") in call_ids:
            continue  # the provider's own copy of a call that message.tool_calls holds
        else:
            shown = kind if kind else type(part).__name__
            msg = (
                f"{where}: content[{i}] is a {shown!r} part, which ctxkernel cannot hold; "
                "accepted: text, reasoning and thinking parts, and tool calls in tool_calls"
            )
            raise IntegrationError(msg)
    for call in message.tool_calls:
        if not isinstance(call.get("id"), str) or not call["id"]:
            msg = f"{where}: tool call {call.get('name')!r} has no id; ctxkernel pairs results by call id"
            raise IntegrationError(msg)
        blocks.append(ToolCallBlock(call["id"], call["name"], dict(call.get("args") or {})))
    for invalid in message.invalid_tool_calls:
        if not isinstance(invalid.get("id"), str) or not invalid["id"]:
            msg = f"{where}: invalid tool call {invalid.get('name')!r} has no id; ctxkernel pairs results by call id"
            raise IntegrationError(msg)
        # kept as the model sent it; the tool layer reports it as invalid JSON
        blocks.append(
            ToolCallBlock(str(invalid["id"]), invalid.get("name") or "", arguments_from_json(invalid.get("args") or ""))
        )
    return blocks


def from_langchain(messages: Sequence[BaseMessage]) -> tuple[str, list[Message]]:
    """LangChain messages as ``(system text, kernel messages)``; system messages (anywhere) are
    joined into the system text, as the kernel keeps the system prompt apart from the surface."""
    system: list[str] = []
    out: list[Message] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}] ({type(message).__name__})"
        if isinstance(message, SystemMessage):
            system.append("\n".join(_text_parts(message.content, where)))
        elif isinstance(message, HumanMessage):
            out.append(Message.user("\n".join(_text_parts(message.content, where))))
        elif isinstance(message, AIMessage):
            out.append(Message("assistant", tuple(_assistant_blocks(message, where)), Source(kind="model")))
        elif isinstance(message, ToolMessage):
            out.append(
                Message.tool(
                    message.tool_call_id,
                    "\n".join(_text_parts(message.content, where)),
                    is_error=message.status == "error",
                    name=message.name,
                )
            )
        else:
            msg = f"{where}: ctxkernel cannot hold a {type(message).__name__}; accepted: System, Human, AI and Tool messages"
            raise IntegrationError(msg)
    return "\n\n".join(system), out


def to_langchain(message: Message) -> HumanMessage | ToolMessage | AIMessage:
    """One kernel message as a LangChain message (a plugin's message becomes a HumanMessage)."""
    if message.role == "user":
        return HumanMessage(message.text)
    if message.role == "tool":
        result = message.tool_result
        assert result is not None
        return ToolMessage(
            result.content,
            tool_call_id=result.call_id,
            name=result.name,
            status="error" if result.is_error else "success",
        )
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ReasoningBlock):
            if block.signature is not None:
                parts.append({"type": "thinking", "thinking": block.text, "signature": block.signature})
            else:
                parts.append({"type": "reasoning", "reasoning": block.text})
        elif isinstance(block, ToolCallBlock):
            raw = block.arguments.get("_raw") if set(block.arguments) == {"_raw"} else None
            if isinstance(raw, str):
                invalid.append(
                    {"type": "invalid_tool_call", "id": block.id, "name": block.name, "args": raw, "error": None}
                )
            else:
                calls.append({"type": "tool_call", "id": block.id, "name": block.name, "args": dict(block.arguments)})
    content: str | list[str | dict[Any, Any]]
    if len(parts) == 1 and parts[0]["type"] == "text" and parts[0]["text"]:
        content = parts[0]["text"]
    elif not parts:
        content = ""
    else:
        content = [*parts]
    return AIMessage(content=content, tool_calls=calls, invalid_tool_calls=invalid)


# -- tools ---------------------------------------------------------------------------------------------------
def _claim_call_ids(reply: AIMessage, ids: Any) -> None:
    """Give each of the reply's tool calls an id of its own (``ids``: a
    :class:`ctxkernel.pairing.CallIds`), renaming, in place, a reused one everywhere the message
    holds it: its ``tool_calls`` (then ``invalid_tool_calls``), the provider's copies in
    ``content`` and ``additional_kwargs["tool_calls"]``, in order of occurrence."""
    renames: list[tuple[str, str]] = []
    for call in [*reply.tool_calls, *reply.invalid_tool_calls]:
        old = call.get("id") or ""
        new = ids.claim(old)
        if new != old:
            call["id"] = new
        renames.append((old, new))
    if all(old == new for old, new in renames):
        return
    copies: list[Any] = [p for p in reply.content if isinstance(p, dict)] if isinstance(reply.content, list) else []
    raw = reply.additional_kwargs.get("tool_calls")
    for group in (copies, raw if isinstance(raw, list) else []):
        pending = list(renames)
        for part in group:
            if not isinstance(part, dict) or "id" not in part:
                continue
            for i, (old, new) in enumerate(pending):
                if part["id"] == old:
                    part["id"] = new
                    del pending[i]
                    break


class StrategyTool(BaseTool):
    """A strategy's tool as the agent's tool node sees it. Its schema is the strategy's own (so
    the model is sent what the meter counted); :class:`ContextMiddleware` answers its calls."""

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        msg = (
            f"{self.name} is a ctxkernel strategy tool: it runs through ContextMiddleware.wrap_tool_call; "
            "add the middleware to create_agent(middleware=[...]) instead of calling the tool directly"
        )
        raise IntegrationError(msg)


def _strategy_tool(schema: dict[str, Any]) -> StrategyTool:
    function = schema["function"]
    return StrategyTool(
        name=function["name"], description=function.get("description", ""), args_schema=function.get("parameters") or {}
    )


def _tool_name(tool: Any) -> str | None:
    if isinstance(tool, BaseTool):
        return tool.name
    if isinstance(tool, dict):
        return (tool.get("function") or {}).get("name") or tool.get("name")
    return None


# -- the middleware ------------------------------------------------------------------------------------------
def _cache_hints(request: ModelRequest, managed: ManagedSession) -> dict[str, Any]:
    """The request's ``model_settings`` with the session's prompt cache hint for its model
    (``docs/cache.md``): the agent's own setting wins, and ``[cache] hints = false`` adds none."""
    settings = dict(request.model_settings)
    key = managed.prompt_cache_key
    if key is None:
        return settings
    kind = getattr(request.model, "_llm_type", None)
    if kind in PROMPT_CACHE_KEY_MODELS:
        settings.setdefault("prompt_cache_key", key)
    elif kind in CACHE_CONTROL_MODELS:
        settings.setdefault("cache_control", {"type": "ephemeral"})
    return settings


class ContextMiddleware(AgentMiddleware):
    """Run a ``create_agent`` agent on a ctxkernel profile.

    :param profile: a profile name, a path to a profile file, or a :class:`~ctxkernel.Kernel`.
    :param session_id: the ctxkernel session; None takes the graph's thread id
        (``config={"configurable": {"thread_id": ...}}``) when there is one, else one new
        session for this middleware.
    """

    def __init__(self, profile: str | os.PathLike[str] | Kernel = "handoff", session_id: str | None = None) -> None:
        super().__init__()
        self.kernel = open_kernel(profile)
        self.session_id = session_id
        self._sessions: OrderedDict[str | None, ManagedSession] = OrderedDict()
        self._sessions_lock = threading.Lock()
        self.tools = [_strategy_tool(schema) for schema in strategy_tool_schemas(self.kernel)]
        self._own = {tool.name: tool for tool in self.tools}

    def managed(self, config: Mapping[str, Any] | None = None) -> ManagedSession:
        """The session for a run's config: ``session_id``, else the thread id, else this
        middleware's own new session."""
        session_id = self.session_id
        if session_id is None and config:
            thread = (config.get("configurable") or {}).get("thread_id")
            session_id = str(thread) if thread is not None else None
        with self._sessions_lock:
            managed = self._sessions.get(session_id)
            if managed is None:
                managed = self._sessions[session_id] = ManagedSession(self.kernel, session_id, origin=_ORIGIN)
                # a server runs many threads: keep the recent ones open, reopen others from the store
                while len(self._sessions) > OPEN_SESSIONS:
                    self._sessions.popitem(last=False)
            self._sessions.move_to_end(session_id)
            return managed

    def _config(self) -> RunnableConfig | None:
        try:
            return get_config()
        except RuntimeError:  # called outside a graph run
            return None

    def _managed_request(self, request: ModelRequest, managed: ManagedSession) -> ModelRequest:
        system, history = from_langchain(request.messages)
        own_system = request.system_prompt or ""
        if system:
            own_system = f"{own_system}\n\n{system}" if own_system else system
        # the agent's own tools are every tool but the middleware's: one with a strategy tool's
        # name wins (the session leaves the strategy's out of the request, as serve does)
        theirs = [t for t in request.tools if not self._is_own(t)]
        harness = [t if isinstance(t, dict) else convert_to_openai_tool(t) for t in theirs]
        prepared = managed.prepare(history, system=own_system or None, harness_tools=harness)
        offered = [
            self._own[name]
            for name in (_tool_name(s) for s in prepared.tools)
            if name in self._own and managed.owns_tool(name)
        ]
        return request.override(
            messages=[to_langchain(m) for m in prepared.messages],
            system_message=SystemMessage(prepared.system) if prepared.system else None,
            tools=[*theirs, *offered],
            model_settings=_cache_hints(request, managed),
        )

    @staticmethod
    def _reply_of(response: Any) -> AIMessage:
        result = response.model_response if hasattr(response, "model_response") else response
        if isinstance(result, AIMessage):
            return result
        replies = [m for m in getattr(result, "result", []) if isinstance(m, AIMessage)]
        if not replies:
            msg = f"the model call returned no AIMessage ({type(result).__name__}); nothing to commit"
            raise IntegrationError(msg)
        return replies[0]

    def _commit(self, managed: ManagedSession, response: Any) -> None:
        reply = self._reply_of(response)
        _claim_call_ids(reply, managed.call_ids())
        _, (message,) = from_langchain([reply])
        managed.commit(message, usage=reply.usage_metadata)

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> Any:
        managed = self.managed(self._config())
        managed_request = self._managed_request(request, managed)
        try:
            response = handler(managed_request)
            self._commit(managed, response)
        except BaseException:
            managed.abandon()  # the model call raised, or its reply was refused: no half step
            raise
        return response

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> Any:
        managed = self.managed(self._config())
        # the session fsyncs and tokenises: keep that off the event loop
        managed_request = await asyncio.to_thread(self._managed_request, request, managed)
        try:
            response = await handler(managed_request)
            await asyncio.to_thread(self._commit, managed, response)
        except BaseException:
            managed.abandon()  # in this thread, once: a cancelled task closes its step too
            raise
        return response

    def _run_own(self, request: Any) -> ToolMessage:
        call = request.tool_call
        managed = self.managed(getattr(request.runtime, "config", None) if request.runtime is not None else None)
        outcome = managed.run_tool(call["id"], call["name"], call.get("args") or {})
        return ToolMessage(
            outcome.content,
            tool_call_id=call["id"],
            name=call["name"],
            status="error" if outcome.is_error else "success",
        )

    def _is_own(self, tool: Any) -> bool:
        """Whether ``tool`` is one of this middleware's strategy tools (not merely of that name)."""
        return isinstance(tool, StrategyTool) and self._own.get(tool.name) is tool

    def _answers(self, request: Any) -> bool:
        """Whether a tool call is a strategy tool's: its name is, and the tool node did not
        resolve it to an agent tool of that name (the agent's tool wins, :meth:`_managed_request`)."""
        if request.tool_call["name"] not in self._own:
            return False
        return request.tool is None or self._is_own(request.tool)

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        if self._answers(request):
            return self._run_own(request)
        return handler(request)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        if self._answers(request):
            return await asyncio.to_thread(self._run_own, request)
        return await handler(request)


__all__ = ["ContextMiddleware", "StrategyTool", "from_langchain", "to_langchain"]
