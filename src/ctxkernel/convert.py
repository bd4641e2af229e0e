"""Converters between kernel messages and the two dominant wire formats.

OpenAI chat completions: ``system``/``user``/``assistant``/``tool`` messages, tool calls in
``assistant.tool_calls`` with JSON-string arguments, one ``tool`` message per result.
Anthropic messages: ``system`` is a top-level field, tool calls are ``tool_use`` blocks and
results are ``tool_result`` blocks inside a ``user`` message; roles must alternate, so
consecutive same-role messages are merged.
"""

from __future__ import annotations

from typing import Any

import orjson

from .errors import EventError
from .messages import Message, ReasoningBlock, Source, TextBlock, ToolCallBlock, ToolResultBlock


def _parse_arguments(raw: Any, where: str) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            # keep what the model sent: the tool layer reports it as invalid JSON
            return {"_raw": raw}
        if isinstance(value, dict):
            return value
        return {"_value": value}
    msg = f"{where}: tool call arguments must be a JSON object or string, got {type(raw).__name__}"
    raise EventError(msg)


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and "text" in part:
                parts.append(str(part["text"]))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
        return "\n".join(parts)
    msg = f"{where}: message content must be a string or a list of parts, got {type(content).__name__}"
    raise EventError(msg)


# -- OpenAI chat completions ----------------------------------------------------------------------
def from_openai_message(raw: dict[str, Any], *, where: str = "message") -> Message | None:
    """One chat-completions message as a kernel message (``system`` messages give None)."""
    if not isinstance(raw, dict):
        msg = f"{where}: expected an object with 'role', got {type(raw).__name__}"
        raise EventError(msg)
    role = raw.get("role")
    if role in ("system", "developer"):
        return None
    if role == "user":
        return Message.user(_content_text(raw.get("content"), where))
    if role == "assistant":
        calls = []
        for i, call in enumerate(raw.get("tool_calls") or []):
            fn = call.get("function") or {}
            if not isinstance(call.get("id"), str) or not isinstance(fn.get("name"), str):
                msg = f"{where}: tool_calls[{i}] needs an 'id' and a 'function.name'"
                raise EventError(msg)
            calls.append(ToolCallBlock(call["id"], fn["name"], _parse_arguments(fn.get("arguments"), where)))
        reasoning = raw.get("reasoning_content") or raw.get("reasoning")
        return Message.assistant(
            _content_text(raw.get("content"), where),
            calls,
            reasoning=reasoning if isinstance(reasoning, str) else None,
        )
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str):
            msg = f"{where}: a tool message needs a string 'tool_call_id'"
            raise EventError(msg)
        return Message.tool(call_id, _content_text(raw.get("content"), where), name=raw.get("name"))
    msg = f"{where}: unknown role {role!r}; accepted: system, developer, user, assistant, tool"
    raise EventError(msg)


def to_openai_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        result = message.content[0]
        assert isinstance(result, ToolResultBlock)
        return {"role": "tool", "tool_call_id": result.call_id, "content": result.content}
    text = "\n".join(b.text for b in message.content if isinstance(b, TextBlock))
    out: dict[str, Any] = {"role": message.role, "content": text}
    calls = message.tool_calls
    if calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()}}
            for c in calls
        ]
        if not text:
            out["content"] = None
    return out


def to_openai_messages(messages: list[Message], *, system: str = "") -> list[dict[str, Any]]:
    out = [{"role": "system", "content": system}] if system else []
    out.extend(to_openai_message(m) for m in messages)
    return out


# -- Anthropic messages ------------------------------------------------------------------------------
def from_anthropic_message(raw: dict[str, Any], *, where: str = "message") -> list[Message]:
    """One Anthropic message; a user message holding tool results becomes several messages."""
    if not isinstance(raw, dict) or raw.get("role") not in ("user", "assistant"):
        msg = f"{where}: expected an object with role 'user' or 'assistant'"
        raise EventError(msg)
    content = raw.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list):
        msg = f"{where}: content must be a string or a list of blocks"
        raise EventError(msg)
    if raw["role"] == "assistant":
        blocks: list[Any] = []
        for block in content:
            kind = block.get("type")
            if kind == "text":
                blocks.append(TextBlock(block.get("text", "")))
            elif kind in ("thinking", "redacted_thinking"):
                blocks.append(ReasoningBlock(block.get("thinking", ""), block.get("signature")))
            elif kind in ("tool_use", "server_tool_use"):
                blocks.append(ToolCallBlock(block["id"], block["name"], _parse_arguments(block.get("input"), where)))
        return [Message("assistant", tuple(blocks), Source(kind="model"))]
    out: list[Message] = []
    texts: list[str] = []
    for block in content:
        kind = block.get("type")
        if kind == "tool_result":
            out.append(
                Message.tool(
                    block["tool_use_id"],
                    _content_text(block.get("content"), where),
                    is_error=bool(block.get("is_error", False)),
                )
            )
        elif kind == "text":
            texts.append(block.get("text", ""))
        else:
            texts.append(f"[{kind}]")
    if texts:
        out.append(Message.user("\n".join(texts)))
    return out


def to_anthropic_request(messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``{"system", "messages", "tools"}`` with alternating roles (merged where needed)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            r = message.content[0]
            assert isinstance(r, ToolResultBlock)
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": r.call_id, "content": r.content}
            if r.is_error:
                block["is_error"] = True
            role, blocks = "user", [block]
        elif message.role == "assistant":
            role, blocks = "assistant", []
            for b in message.content:
                if isinstance(b, TextBlock) and b.text:
                    blocks.append({"type": "text", "text": b.text})
                elif isinstance(b, ToolCallBlock):
                    blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.arguments})
        else:
            role, blocks = "user", [{"type": "text", "text": message.text}]
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    anthropic_tools = [
        {"name": t["function"]["name"], "description": t["function"].get("description", ""), "input_schema": t["function"]["parameters"]}
        for t in tools or []
        if t.get("type") == "function"
    ]
    return {"system": system, "messages": out, "tools": anthropic_tools}


def reply_to_message(reply: Any) -> Message:
    """A model reply as a kernel message: a Message, an object with ``.message``, an OpenAI
    chat-completions message dict, or an Anthropic message dict."""
    if isinstance(reply, Message):
        return reply
    inner = getattr(reply, "message", None)
    if isinstance(inner, Message):
        return inner
    if isinstance(reply, dict):
        if "choices" in reply:  # a whole chat-completions response
            reply = reply["choices"][0]["message"]
        if isinstance(reply.get("content"), list) and any(
            isinstance(b, dict) and b.get("type") in ("tool_use", "thinking") for b in reply["content"]
        ):
            return from_anthropic_message(reply, where="reply")[0]
        converted = from_openai_message({**reply, "role": reply.get("role", "assistant")}, where="reply")
        if converted is not None:
            return converted
    msg = f"cannot read a model reply from {type(reply).__name__}; pass a ctxkernel.Message or a chat-completions message dict"
    raise EventError(msg)
