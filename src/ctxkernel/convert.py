"""Converters between kernel messages and the two dominant wire formats.

OpenAI chat completions: ``system``/``user``/``assistant``/``tool`` messages, tool calls in
``assistant.tool_calls`` with JSON-string arguments, one ``tool`` message per result.
Anthropic messages: ``system`` is a top-level field, tool calls are ``tool_use`` blocks and
results are ``tool_result`` blocks inside a ``user`` message; roles must alternate, so
consecutive same-role messages are merged.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from .errors import EventError
from .messages import Message, ReasoningBlock, Source, TextBlock, ToolCallBlock, ToolResultBlock


def arguments_from_json(text: str) -> dict[str, Any]:
    """Tool call arguments from the JSON string a provider sent: an object as is, any other JSON
    value as ``{"_value": value}``, and text that does not parse as ``{"_raw": text}`` (kept as
    the model sent it, so the tool layer can report it as invalid JSON)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_value": value}


def _parse_arguments(raw: Any, where: str) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        return arguments_from_json(raw)
    msg = f"{where}: tool call arguments must be a JSON object or string, got {type(raw).__name__}"
    raise EventError(msg)


def _string(block: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    """``block[key]`` when it is a string (missing: ``""``, or None when ``optional``); any other
    value is refused naming the field, never turned into text with ``str()``."""
    value = block.get(key)
    if value is None:
        return None if optional else ""
    if not isinstance(value, str):
        msg = (
            f"{where}.{key} must be a string{' or null' if optional else ''}, got {type(value).__name__} {value!r:.60}"
        )
        raise EventError(msg)
    return value


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and (
                "text" in part or part.get("type") in ("text", "input_text", "output_text")
            ):
                parts.append(_string(part, "text", f"{where}: content[{i}]"))
            elif isinstance(part, dict):
                kind = part.get("type")
                parts.append(f"[{kind if isinstance(kind, str) else 'part'}]")
            else:
                msg = f"{where}: content[{i}] must be a string or an object, got {type(part).__name__}"
                raise EventError(msg)
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
        tool_calls = raw.get("tool_calls") or []
        if not isinstance(tool_calls, list):
            msg = f"{where}: tool_calls must be a list, got {type(tool_calls).__name__}"
            raise EventError(msg)
        for i, call in enumerate(tool_calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(call.get("id"), str) or not isinstance(fn.get("name"), str):
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
        return Message.tool(
            call_id, _content_text(raw.get("content"), where), name=_string(raw, "name", where, optional=True)
        )
    msg = f"{where}: unknown role {role!r}; accepted: system, developer, user, assistant, tool"
    raise EventError(msg)


def _arguments_json(arguments: dict[str, Any]) -> str:
    """Arguments as the JSON string the model sent; an unparsable string is sent back verbatim."""
    if set(arguments) == {"_raw"} and isinstance(arguments["_raw"], str):
        return arguments["_raw"]
    if set(arguments) == {"_value"}:
        return orjson.dumps(arguments["_value"]).decode()
    return orjson.dumps(arguments).decode()


def to_openai_message(message: Message, *, reasoning_content: bool = False) -> dict[str, Any]:
    """One kernel message as a chat-completions message.

    Reasoning is dropped unless ``reasoning_content`` (DeepSeek's thinking mode wants it back
    within a tool-calling turn; other providers reject the field). A tool result's error flag
    has no chat-completions field and is carried by its content.
    """
    if message.role == "tool":
        result = message.content[0]
        assert isinstance(result, ToolResultBlock)
        return {"role": "tool", "tool_call_id": result.call_id, "content": result.content}
    text = "\n".join(b.text for b in message.content if isinstance(b, TextBlock))
    out: dict[str, Any] = {"role": message.role, "content": text}
    if reasoning_content and message.role == "assistant":
        reasoning = "\n".join(b.text for b in message.content if isinstance(b, ReasoningBlock))
        if reasoning:
            out["reasoning_content"] = reasoning
    calls = message.tool_calls
    if calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_json(c.arguments)}}
            for c in calls
        ]
        if not text:
            out["content"] = None
    return out


def to_openai_messages(
    messages: list[Message], *, system: str = "", reasoning_content: bool = False
) -> list[dict[str, Any]]:
    """A chat-completions ``messages`` list: the system prompt first (when any), then the messages."""
    out = [{"role": "system", "content": system}] if system else []
    out.extend(to_openai_message(m, reasoning_content=reasoning_content) for m in messages)
    return out


def from_openai_messages(raw: list[dict[str, Any]]) -> tuple[str, list[Message]]:
    """A chat-completions ``messages`` list as ``(system, messages)``.

    ``system`` and ``developer`` messages are joined (blank line between) into the system text,
    wherever they appear: the kernel keeps the system prompt in the request header, not on the
    surface.
    """
    if not isinstance(raw, list):
        msg = f"messages must be a list, got {type(raw).__name__}"
        raise EventError(msg)
    system: list[str] = []
    messages: list[Message] = []
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        if isinstance(item, dict) and item.get("role") in ("system", "developer"):
            text = _content_text(item.get("content"), where)
            if text:
                system.append(text)
            continue
        message = from_openai_message(item, where=where)
        assert message is not None
        messages.append(message)
    return "\n\n".join(system), messages


# -- Anthropic messages ------------------------------------------------------------------------------
def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        msg = f"{where}: content must be a string or a list of blocks"
        raise EventError(msg)
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            msg = f"{where}: content[{i}] must be an object with a 'type'"
            raise EventError(msg)
    return content


def from_anthropic_message(raw: dict[str, Any], *, where: str = "message") -> list[Message]:
    """One Anthropic message; a user message holding tool results becomes several messages.

    Tool results come first (they answer the previous assistant turn), then the user's text.
    ``redacted_thinking`` has no readable text and is kept as an empty reasoning block.
    """
    if not isinstance(raw, dict) or raw.get("role") not in ("user", "assistant"):
        msg = f"{where}: expected an object with role 'user' or 'assistant'"
        raise EventError(msg)
    content = _blocks(raw.get("content"), where)
    if raw["role"] == "assistant":
        blocks: list[Any] = []
        for i, block in enumerate(content):
            kind = block["type"]
            at = f"{where}: content[{i}]"
            if kind == "text":
                blocks.append(TextBlock(_string(block, "text", at)))
            elif kind in ("thinking", "redacted_thinking"):
                blocks.append(
                    ReasoningBlock(_string(block, "thinking", at), _string(block, "signature", at, optional=True))
                )
            elif kind in ("tool_use", "server_tool_use"):
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    msg = f"{where}: content[{i}] ({kind}) needs a string 'id' and 'name'"
                    raise EventError(msg)
                blocks.append(ToolCallBlock(block["id"], block["name"], _parse_arguments(block.get("input"), where)))
        return [Message("assistant", tuple(blocks), Source(kind="model"))]
    out: list[Message] = []
    texts: list[str] = []
    for i, block in enumerate(content):
        kind = block["type"]
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                msg = f"{where}: content[{i}] (tool_result) needs a string 'tool_use_id'"
                raise EventError(msg)
            is_error = block.get("is_error")
            if is_error is not None and not isinstance(is_error, bool):
                msg = f"{where}: content[{i}].is_error must be true, false or null, got {is_error!r:.60}"
                raise EventError(msg)
            out.append(
                Message.tool(block["tool_use_id"], _content_text(block.get("content"), where), is_error=bool(is_error))
            )
        elif kind == "text":
            texts.append(_string(block, "text", f"{where}: content[{i}]"))
        else:
            texts.append(f"[{kind}]")
    if texts:
        out.append(Message.user("\n".join(texts)))
    return out


def from_anthropic_request(body: dict[str, Any]) -> tuple[str, list[Message]]:
    """An Anthropic request body (``system`` string or text blocks, ``messages``) as
    ``(system, messages)``."""
    system = body.get("system") or ""
    if isinstance(system, list):
        system = "\n\n".join(b.get("text", "") for b in system if isinstance(b, dict) and b.get("type") == "text")
    if not isinstance(system, str):
        msg = "system must be a string or a list of text blocks"
        raise EventError(msg)
    messages: list[Message] = []
    for i, raw in enumerate(body.get("messages") or []):
        messages.extend(from_anthropic_message(raw, where=f"messages[{i}]"))
    return system, messages


def to_anthropic_blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    """One kernel message as ``(role, content blocks)`` of an Anthropic message (tool results
    are ``tool_result`` blocks of a user message; empty text and unsigned reasoning left out)."""
    if message.role == "tool":
        r = message.content[0]
        assert isinstance(r, ToolResultBlock)
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": r.call_id, "content": r.content}
        if r.is_error:
            block["is_error"] = True
        return "user", [block]
    if message.role == "assistant":
        blocks: list[dict[str, Any]] = []
        for b in message.content:
            if isinstance(b, ReasoningBlock) and b.signature:
                blocks.append({"type": "thinking", "thinking": b.text, "signature": b.signature})
            elif isinstance(b, TextBlock) and b.text:
                blocks.append({"type": "text", "text": b.text})
            elif isinstance(b, ToolCallBlock):
                blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.arguments})
        return "assistant", blocks
    return "user", ([{"type": "text", "text": message.text}] if message.text else [])


def merge_anthropic_blocks(parts: Any) -> list[dict[str, Any]]:
    """``(role, blocks)`` pairs as alternating Anthropic messages: consecutive same-role parts
    share one message. The block lists given are not modified."""
    out: list[dict[str, Any]] = []
    for role, blocks in parts:
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"] = [*out[-1]["content"], *blocks]
        else:
            out.append({"role": role, "content": list(blocks)})
    return out


#: Anthropic accepts at most this many ``cache_control`` breakpoints in one request
MAX_CACHE_BREAKPOINTS = 4
#: a breakpoint with the default (5-minute) lifetime
EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
#: blocks that cannot carry a breakpoint themselves (the provider caches them with their message)
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def prompt_cache_key(session_id: str) -> str:
    """The OpenAI ``prompt_cache_key`` of a session: a digest of its id, so requests of one
    session reach the same cache and the id itself is not sent."""
    return "ctxkernel-" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _marked(blocks: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``blocks`` with a breakpoint on the last block that may carry one (a copy), or None."""
    for i in range(len(blocks) - 1, -1, -1):
        if blocks[i].get("type") not in _UNMARKABLE:
            out = list(blocks)
            out[i] = {**blocks[i], "cache_control": dict(EPHEMERAL)}
            return out
    return None


def mark_message_breakpoints(
    parts: list[tuple[str, list[dict[str, Any]]]], unchanged: int, *, limit: int = 2
) -> list[tuple[str, list[dict[str, Any]]]]:
    """Per-message ``(role, blocks)`` parts with at most ``limit`` breakpoints: on the last
    message (whose prefix the next request reads) and on the last of the first ``unchanged``
    messages (the prefix this request shares with the previous one, read even when the new
    messages hold more blocks than the provider looks back over). Blocks are copied, never
    changed in place (a caller may keep them between requests)."""
    out = list(parts)
    wanted = [len(parts) - 1, unchanged - 1][: max(0, limit)]
    done: set[int] = set()
    for start in wanted:
        for index in range(min(start, len(out) - 1), -1, -1):
            if index in done:
                break  # this prefix is marked already
            role, blocks = out[index]
            marked = _marked(blocks)
            if marked is not None:
                out[index] = (role, marked)
                done.add(index)
                break
    return out


def to_anthropic_request(
    messages: list[Message],
    *,
    system: str = "",
    tools: list[dict[str, Any]] | None = None,
    cache_breakpoints: bool = False,
    unchanged_messages: int = 0,
) -> dict[str, Any]:
    """``{"system", "messages", "tools"}`` with alternating roles.

    Consecutive same-role messages are merged into one (tool results become ``tool_result``
    blocks of a user message, so a result and the user text after it share one message).
    Reasoning is sent back only when it carries a provider signature, the form Anthropic
    accepts; empty text blocks, which Anthropic rejects, are left out.

    ``cache_breakpoints`` places Anthropic's prompt-cache breakpoints, four at most: after the
    tools, after the system prompt (then a list of one text block), and with
    :func:`mark_message_breakpoints` at the last of the first ``unchanged_messages`` messages
    and at the last message.
    """
    parts = [to_anthropic_blocks(m) for m in messages]
    anthropic_tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"].get("parameters") or {"type": "object", "properties": {}},
        }
        for t in tools or []
        if t.get("type") == "function"
    ]
    system_out: str | list[dict[str, Any]] = system
    if cache_breakpoints:
        if anthropic_tools:
            anthropic_tools[-1] = {**anthropic_tools[-1], "cache_control": dict(EPHEMERAL)}
        if system:
            system_out = [{"type": "text", "text": system, "cache_control": dict(EPHEMERAL)}]
        parts = mark_message_breakpoints(parts, unchanged_messages)
    return {"system": system_out, "messages": merge_anthropic_blocks(parts), "tools": anthropic_tools}


def count_cache_breakpoints(body: dict[str, Any]) -> int:
    """The ``cache_control`` breakpoints of an Anthropic request body: the top-level one, the
    tools', the system blocks' and the message blocks'."""
    found = 1 if body.get("cache_control") else 0
    for key in ("tools", "system"):
        items = body.get(key)
        if isinstance(items, list):
            found += sum(1 for b in items if isinstance(b, dict) and b.get("cache_control"))
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            found += sum(1 for b in content if isinstance(b, dict) and b.get("cache_control"))
    return found


_ANTHROPIC_ONLY_BLOCKS = frozenset({"tool_use", "server_tool_use", "thinking", "redacted_thinking"})


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
        if isinstance(reply.get("content"), list) and (
            reply.get("type") == "message"  # an Anthropic response object
            or any(isinstance(b, dict) and b.get("type") in _ANTHROPIC_ONLY_BLOCKS for b in reply["content"])
        ):
            return from_anthropic_message(reply, where="reply")[0]
        converted = from_openai_message({**reply, "role": reply.get("role", "assistant")}, where="reply")
        if converted is not None:
            return converted
    msg = f"cannot read a model reply from {type(reply).__name__}; pass a ctxkernel.Message or a chat-completions message dict"
    raise EventError(msg)


def normalize_usage(usage: Any) -> dict[str, int] | None:
    """Provider usage as ``{input_tokens, output_tokens, cached_input_tokens}``.

    Accepts OpenAI (prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens) and
    Anthropic (input_tokens, output_tokens, cache_read/cache_creation_input_tokens) names.
    """
    if usage is None:
        return None
    if hasattr(usage, "model_dump"):
        usage = usage.model_dump()
    if not isinstance(usage, dict):
        msg = f"usage must be a mapping of token counts, got {type(usage).__name__}"
        raise EventError(msg)

    def num(*keys: str) -> int:
        for key in keys:
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                if value < 0:
                    msg = f"usage.{key} must be >= 0, got {value}"
                    raise EventError(msg)
                return value
        return 0

    cached = num("cached_input_tokens", "cache_read_input_tokens")
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        cached = details["cached_tokens"]
    if "prompt_tokens" in usage:
        input_tokens = num("prompt_tokens")
    else:  # Anthropic counts cache reads and writes apart from input_tokens
        input_tokens = num("input_tokens") + num("cache_read_input_tokens") + num("cache_creation_input_tokens")
    return {
        "input_tokens": input_tokens,
        "output_tokens": num("completion_tokens", "output_tokens"),
        "cached_input_tokens": cached,
    }
