"""OpenAI Agents SDK adapter: :class:`ContextSession`, a ``Session`` with a per-call filter.

::

    from agents import Agent, RunConfig, Runner
    from ctxkernel.integrations.openai_agents import ContextSession

    session = ContextSession("chat-42", profile="handoff")
    agent = Agent(name="coder", instructions="...", tools=[*my_tools, *session.tools()])
    await Runner.run(agent, "fix the test", session=session,
                     run_config=RunConfig(call_model_input_filter=session.input_filter))

The SDK reads a session when a run starts (``get_items``: the strategies act, then the managed
surface is returned) and hands it the run's new items (``add_items``: appended to the log). Inside
one run it sends the run's own items from memory, so only ``input_filter``, called before every
model call, can bound a long run: it reconciles the call's input with the log and replaces it by
the managed surface, and the instructions by the agent's plus the strategies' sections.

The log is append-only: ``pop_item`` and ``clear_session`` take items off the managed surface
(a cited ``surface/drop``), never out of the log.

Install with ``pip install 'ctxkernel[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Sequence
from typing import Any, cast

import orjson
from agents import FunctionTool, ModelSettings, RunContextWrapper
from agents.items import TResponseInputItem
from agents.run_config import CallModelData, ModelInputData
from agents.tool_context import ToolContext

from ..compaction import Span
from ..convert import arguments_from_json
from ..kernel import Kernel
from ..messages import Block, Message, ReasoningBlock, Source, TextBlock, ToolCallBlock
from ._core import ManagedSession, open_kernel, strategy_tool_schemas
from ._reconcile import IntegrationError

_ORIGIN = "openai-agents"
#: the strategy name recorded on the surface drops that pop_item and clear_session write
_DROPPER = "openai-agents"
_ASSISTANT_ITEMS = ("reasoning", "function_call")


# -- items -----------------------------------------------------------------------------------------------
def _item_dict(item: Any, where: str) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    if hasattr(item, "model_dump"):
        dumped = item.model_dump(exclude_unset=True)
        if isinstance(dumped, dict):
            return dumped
    msg = f"{where}: an input item must be a mapping, got {type(item).__name__}"
    raise IntegrationError(msg)


def _content_text(content: Any, where: str, accepted: tuple[str, ...]) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        msg = f"{where}: content must be a string or a list of parts, got {type(content).__name__}"
        raise IntegrationError(msg)
    parts = []
    for i, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") in accepted and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            msg = f"{where}: content[{i}] is a {kind!r} part, which ctxkernel cannot hold; accepted: {list(accepted)}"
            raise IntegrationError(msg)
    return parts


def _kind(item: dict[str, Any]) -> str:
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return str(kind)


def from_items(items: Sequence[Any]) -> tuple[str, list[Message]]:
    """Responses input items as ``(system text, kernel messages)``.

    Consecutive assistant-side items (reasoning, assistant messages, function calls) form one
    assistant message; each ``function_call_output`` is a tool message; system and developer
    messages are joined into the system text."""
    system: list[str] = []
    out: list[Message] = []
    pending: list[Block] = []

    def flush() -> None:
        if pending:
            out.append(Message("assistant", tuple(pending), Source(kind="model")))
            pending.clear()

    for i, raw in enumerate(items):
        where = f"input[{i}]"
        item = _item_dict(raw, where)
        kind = _kind(item)
        role = item.get("role")
        if kind == "message" and role == "assistant":
            content = item.get("content")
            if content == []:  # an empty reply is a message of its own
                flush()
                out.append(Message("assistant", (), Source(kind="model")))
                continue
            for text in _content_text(content, where, ("output_text", "text", "input_text")):
                pending.append(TextBlock(text))
        elif kind == "reasoning":
            summary = item.get("summary") or []
            texts = _content_text(summary, f"{where}.summary", ("summary_text",)) if summary else [""]
            signature = item.get("encrypted_content")
            for j, text in enumerate(texts):
                pending.append(ReasoningBlock(text, signature if j == 0 and isinstance(signature, str) else None))
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                msg = f"{where}: a function_call needs a string 'call_id' and 'name'"
                raise IntegrationError(msg)
            arguments = item.get("arguments")
            pending.append(
                ToolCallBlock(call_id, name, arguments_from_json(arguments) if isinstance(arguments, str) else {})
            )
        elif kind == "function_call_output":
            flush()
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                msg = f"{where}: a function_call_output needs a string 'call_id'"
                raise IntegrationError(msg)
            output = item.get("output")
            text = (
                output
                if isinstance(output, str)
                else "\n".join(_content_text(output, where, ("input_text", "output_text", "text")))
            )
            out.append(Message.tool(call_id, text))
        elif kind == "message" and role in ("system", "developer"):
            flush()
            system.append("\n".join(_content_text(item.get("content"), where, ("input_text", "text"))))
        elif kind == "message" and role == "user":
            flush()
            out.append(Message.user("\n".join(_content_text(item.get("content"), where, ("input_text", "text")))))
        else:
            msg = (
                f"{where}: ctxkernel cannot hold a {kind!r} item (role {role!r}); accepted: user, system, developer "
                "and assistant messages, reasoning, function_call and function_call_output items"
            )
            raise IntegrationError(msg)
    flush()
    return "\n\n".join(system), out


def to_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Kernel messages as Responses input items (what the SDK sends the model)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "user":
            out.append({"role": "user", "content": message.text})
            continue
        if message.role == "tool":
            result = message.tool_result
            assert result is not None
            out.append({"type": "function_call_output", "call_id": result.call_id, "output": result.content})
            continue
        if not message.content:
            out.append({"type": "message", "role": "assistant", "content": []})
        for block in message.content:
            if isinstance(block, TextBlock):
                out.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": block.text, "annotations": []}],
                    }
                )
            elif isinstance(block, ReasoningBlock):
                item: dict[str, Any] = {"type": "reasoning", "summary": [{"type": "summary_text", "text": block.text}]}
                if block.signature is not None:
                    item["encrypted_content"] = block.signature
                out.append(item)
            elif isinstance(block, ToolCallBlock):
                raw = block.arguments.get("_raw") if set(block.arguments) == {"_raw"} else None
                arguments = raw if isinstance(raw, str) else orjson.dumps(block.arguments).decode()
                out.append({"type": "function_call", "call_id": block.id, "name": block.name, "arguments": arguments})
    return out


def _fingerprint(item: Any) -> bytes:
    return orjson.dumps(_item_dict(item, "item"), option=orjson.OPT_SORT_KEYS, default=str)


# -- the session -----------------------------------------------------------------------------------------
class ContextSession:
    """An Agents SDK ``Session`` whose items are a ctxkernel profile's managed surface.

    :param session_id: the ctxkernel session id (resumed from the profile's store when it exists).
    :param profile: a profile name, a path to a profile file, or a :class:`~ctxkernel.Kernel`.
    """

    session_settings = None

    def __init__(self, session_id: str, profile: str | os.PathLike[str] | Kernel = "handoff") -> None:
        self.session_id = session_id
        self.kernel = open_kernel(profile)
        # the framework sends the strategy tools it was given with every call: the session offers
        # them all from the first, so the meter counts and the kernel runs what the model sees
        self.managed = ManagedSession(self.kernel, session_id, origin=_ORIGIN, every_tool=True)
        self._schemas = strategy_tool_schemas(self.kernel)
        self._own = {s["function"]["name"] for s in self._schemas}
        #: the FunctionTools :meth:`tools` made, by id (each kept, so no id is reused): the agent's
        #: own tools are all the others, those of a strategy tool's name included
        self._made: dict[int, FunctionTool] = {}
        self._served: list[bytes] = []  # fingerprints of the items get_items returned last
        self._instructions = ""  # the agent's instructions, as the last input_filter call saw them

    # -- the Session protocol ------------------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The managed surface as input items (the strategies act first when a turn is open)."""
        return await asyncio.to_thread(self._get_items, limit)

    def _get_items(self, limit: int | None) -> list[dict[str, Any]]:
        managed = self.managed
        with managed._lock:
            session = managed.session
            items: list[dict[str, Any]] = []
            if session.turn_open and not session.surface.pending_calls:
                request = managed.prepare([], system=self._instructions)
                # the strategies' sections: the SDK sends the agent's instructions itself
                sections = _without_prefix(request.system, self._instructions)
                if sections:
                    items.append({"role": "developer", "content": sections})
                messages = request.messages
            else:
                messages = [n.message for n in session.surface.nodes]
            items += to_items(messages)
            if limit is not None:
                items = items[-limit:] if limit > 0 else []
                # a limit must not leave a tool output without the call it answers
                while items and items[0].get("type") == "function_call_output":
                    items.pop(0)
            self._served = [_fingerprint(i) for i in items]
            return items

    async def add_items(self, items: list[Any]) -> None:
        """Append the run's new items to the log (items it already holds are skipped)."""
        await asyncio.to_thread(self._add_items, items)

    def _add_items(self, items: list[Any]) -> None:
        _, messages = from_items(items)
        self.managed.sync(messages, partial=True)

    async def pop_item(self) -> dict[str, Any] | None:
        """Take the newest item off the managed surface (the log keeps it) and return it."""
        return await asyncio.to_thread(self._pop_item)

    def _pop_item(self) -> dict[str, Any] | None:
        with self.managed._lock:
            session = self.managed.session
            nodes = session.surface.nodes
            if not nodes:
                return None
            last = nodes[-1]
            if session.surface.pending_calls or last.role == "tool" or last.message.tool_calls:
                msg = (
                    f"pop_item would split a tool call from its result in session {session.id!r} "
                    f"(the newest item is a {last.role} message); pop only user messages and final replies"
                )
                raise IntegrationError(msg)
            items = to_items([last.message])
            session.compact(
                Span(last.seq, last.seq, remove=True),
                strategy=_DROPPER,
                kind="drop",
                check_shrink=False,
                keep_instructions=False,
            )
            return items[-1] if items else None

    async def clear_session(self) -> None:
        """Take every item off the managed surface and end the turn; the log keeps them all."""
        await asyncio.to_thread(self._clear)

    def _clear(self) -> None:
        with self.managed._lock:
            session = self.managed.session
            session.end_turn()
            nodes = session.surface.nodes
            if nodes:
                session.compact(
                    Span(nodes[0].seq, nodes[-1].seq, remove=True),
                    strategy=_DROPPER,
                    kind="drop",
                    check_shrink=False,
                    keep_instructions=False,
                )

    # -- the per-call seam -----------------------------------------------------------------------------
    async def input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """``RunConfig(call_model_input_filter=session.input_filter)``: the managed surface for
        every model call of a run."""
        # the session fsyncs and tokenises: keep that off the event loop
        return await asyncio.to_thread(self._filter, data)

    def _filter(self, data: CallModelData[Any]) -> ModelInputData:
        items = list(data.model_data.input)
        fingerprints = [_fingerprint(i) for i in items]
        served = self._served
        if served and fingerprints[: len(served)] == served:
            items = items[len(served) :]  # the session's own items, read at the start of the run
        system, history = from_items(items)
        instructions = data.model_data.instructions or ""
        self._instructions = instructions
        own = "\n\n".join(s for s in (instructions, system) if s and s.strip()) or None
        harness = [
            _tool_schema(t)
            for t in getattr(data.agent, "tools", [])
            if isinstance(t, FunctionTool) and self._made.get(id(t)) is not t
        ]
        request = self.managed.prepare(history, system=own, harness_tools=harness)
        # to_items writes the Responses API's JSON items; the SDK's TypedDicts require fields (an
        # output message's id and status) that an input item may leave out, and it sends them as given
        items = cast("list[TResponseInputItem]", to_items(request.messages))
        return ModelInputData(input=items, instructions=request.system or None)

    # -- strategy tools --------------------------------------------------------------------------------
    def model_settings(self, base: ModelSettings | None = None) -> ModelSettings:
        """``base`` (default: none) with the session's ``prompt_cache_key`` in ``extra_args``
        (docs/cache.md), unless it carries one already or ``[cache] hints = false``. Pass it as
        ``Agent(..., model_settings=session.model_settings())``: every model call of the
        conversation then reaches the same cache, whatever model adapter the agent uses."""
        base = base or ModelSettings()
        key = self.managed.prompt_cache_key
        extras = dict(base.extra_args or {})
        body = base.extra_body if isinstance(base.extra_body, dict) else {}
        if key is None or "prompt_cache_key" in extras or "prompt_cache_key" in body:
            return base
        extras["prompt_cache_key"] = key
        return dataclasses.replace(base, extra_args=extras)

    def tools(self) -> list[FunctionTool]:
        """The strategies' tools as the SDK's function tools (add them to the agent's tools). One
        whose name a tool of the agent's own has is disabled for that agent (``is_enabled``):
        the agent's tool wins, as the session leaves the strategy's out of its requests."""
        made = [self._tool(schema) for schema in self._schemas]
        for tool in made:
            self._made[id(tool)] = tool
        return made

    def _yields_to(self, tool: FunctionTool, agent: Any) -> bool:
        """Whether ``agent`` has a function tool of its own (not one :meth:`tools` made) of
        ``tool``'s name."""
        return any(
            isinstance(t, FunctionTool) and t.name == tool.name and self._made.get(id(t)) is not t
            for t in getattr(agent, "tools", ())
        )

    def _tool(self, schema: dict[str, Any]) -> FunctionTool:
        function = schema["function"]
        name = function["name"]

        async def invoke(ctx: ToolContext[Any] | RunContextWrapper[Any], arguments: str) -> str:
            call_id = getattr(ctx, "tool_call_id", None)
            if not call_id:
                msg = f"{name}: the SDK gave no tool call id; ctxkernel pairs results by call id"
                raise IntegrationError(msg)
            parsed = arguments_from_json(arguments or "{}")
            outcome = await asyncio.to_thread(self.managed.run_tool, call_id, name, parsed)
            return outcome.content

        made = FunctionTool(
            name=name,
            description=function.get("description", ""),
            params_json_schema=function.get("parameters") or {"type": "object", "properties": {}},
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )
        made.is_enabled = lambda _ctx, agent: not self._yields_to(made, agent)
        return made


def _without_prefix(system: str, prefix: str) -> str:
    prefix = prefix.strip()
    if prefix and system.startswith(prefix):
        return system[len(prefix) :].lstrip("\n")
    return system


def _tool_schema(tool: FunctionTool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.params_json_schema},
    }


__all__ = ["ContextSession", "from_items", "to_items"]
