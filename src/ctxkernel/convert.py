"""Converters between kernel messages and the two dominant wire formats.

OpenAI chat completions: ``system``/``user``/``assistant``/``tool`` messages, tool calls in
``assistant.tool_calls`` with JSON-string arguments, one ``tool`` message per result.
Anthropic messages: ``system`` is a top-level field, tool calls are ``tool_use`` blocks and
results are ``tool_result`` blocks inside a ``user`` message; roles must alternate, so
consecutive same-role messages are merged.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from . import media as media_rules
from .errors import EventError
from .messages import (
    MAX_NAME_CHARS,
    MediaBlock,
    Message,
    OpaqueBlock,
    Part,
    ReasoningBlock,
    Source,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)

#: what gives a medium's bytes back when it goes out (its ``data``, else the store's blob);
#: None when they cannot be had
MediaBytes = Callable[[MediaBlock], "bytes | None"]


def held_bytes(block: MediaBlock) -> bytes | None:
    """The bytes a medium still holds in memory (the default :data:`MediaBytes`)."""
    return block.data


# -- media -----------------------------------------------------------------------------------------
def _get_path(block: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = block
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def media_block(
    api: str, kind: str, block: dict[str, Any], path: tuple[str, ...], encoding: str, *, detail: str | None = None
) -> MediaBlock:
    """A client's medium as a :class:`MediaBlock`: the inline bytes at ``path`` in ``block``
    (``encoding``: ``base64``, ``data_url`` or ``text``) come out of its wire form and are held
    for the store; a block without inline bytes (a URL, a file id) is kept whole.
    ``wire`` is ``{"block": ..., "path": [...], "encoding": ...}``: where the bytes go back."""
    raw = _get_path(block, path)
    media_type: str | None = None
    data: bytes | None = None
    if encoding == "base64":
        data = media_rules.decode_b64(raw)
        source = block.get("source")
        found = source.get("media_type") if isinstance(source, dict) else None
        media_type = found if isinstance(found, str) else None
        if media_type is None:
            nested = _get_path(block, path[:-1])
            fmt = nested.get("format") if isinstance(nested, dict) else None
            media_type = f"audio/{fmt}" if isinstance(fmt, str) and kind == "audio" else None
    elif encoding == "data_url" and isinstance(raw, str):
        split = media_rules.split_data_url(raw)
        if split is not None:
            media_type, data = split
    elif encoding == "text" and isinstance(raw, str):
        data = raw.encode("utf-8", "surrogatepass")
        source = block.get("source")
        found = source.get("media_type") if isinstance(source, dict) else None
        media_type = found if isinstance(found, str) else "text/plain"
    if data is None:  # no inline bytes: a URL or a file id, kept as it came
        tokens = media_rules.media_tokens(api, kind, None, media_type, detail)
        return MediaBlock(kind, api, {"block": block}, tokens)
    wire_block = copy.deepcopy(block)
    parent = _get_path(wire_block, path[:-1]) if len(path) > 1 else wire_block
    assert isinstance(parent, dict)
    parent.pop(path[-1], None)
    tokens = media_rules.media_tokens(api, kind, data, media_type, detail)
    wire = {"block": wire_block, "path": list(path), "encoding": encoding}
    return MediaBlock(kind, api, wire, tokens, media_rules.blob_key(data), media_type, data)


def media_wire(block: MediaBlock, media: MediaBytes = held_bytes) -> dict[str, Any] | None:
    """A medium's wire block as the client sent it, bytes put back; None when they are lost."""
    wire = block.wire
    out = copy.deepcopy(wire.get("block") or {})
    path = wire.get("path")
    if not path:
        return out
    data = media(block)
    if data is None:
        return None
    encoding = wire.get("encoding")
    if encoding == "base64":
        value: str = media_rules.b64(data)
    elif encoding == "data_url":
        value = media_rules.data_url(block.media_type, data)
    else:
        value = data.decode("utf-8", "replace")
    parent = _get_path(out, tuple(path[:-1])) if len(path) > 1 else out
    if not isinstance(parent, dict):
        return None
    parent[path[-1]] = value
    return out


def lost_media_text(block: MediaBlock) -> dict[str, Any]:
    """What goes out in place of a medium whose bytes are gone from the store."""
    return {"type": "text", "text": f"[{block.kind} no longer available]"}


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
def _name(raw: dict[str, Any], where: str) -> str | None:
    name = raw.get("name")
    if name is None:
        return None
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        msg = f"{where}.name must be a string of 1-{MAX_NAME_CHARS} characters"
        raise EventError(msg)
    return name


def _join_texts(blocks: Iterable[Part]) -> tuple[Part, ...]:
    """Adjacent text blocks joined by newlines (a text-only content is one text block, as the
    kernel has always held it)."""
    out: list[Part] = []
    for block in blocks:
        if isinstance(block, TextBlock) and out and isinstance(out[-1], TextBlock):
            out[-1] = TextBlock(out[-1].text + "\n" + block.text)
        else:
            out.append(block)
    return tuple(out)


def openai_part(part: Any, where: str, *, api: str = "openai") -> Part:
    """One chat-completions content part as a kernel block: text, a medium (``image_url``,
    ``input_audio``, ``file``), or an opaque part kept as it came."""
    if isinstance(part, str):
        return TextBlock(part)
    if not isinstance(part, dict):
        msg = f"{where} must be a string or an object, got {type(part).__name__}"
        raise EventError(msg)
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text") or (kind is None and "text" in part):
        return TextBlock(_string(part, "text", where))
    if kind == "image_url":
        detail = _get_path(part, ("image_url", "detail"))
        return media_block(
            api, "image", part, ("image_url", "url"), "data_url", detail=detail if isinstance(detail, str) else None
        )
    if kind == "input_audio":
        return media_block(api, "audio", part, ("input_audio", "data"), "base64")
    if kind == "file":
        return media_block(api, "file", part, ("file", "file_data"), "data_url")
    return OpaqueBlock(api, part)


def _openai_content(content: Any, where: str) -> tuple[Part, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return (TextBlock(content),)
    if not isinstance(content, list):
        msg = f"{where}: message content must be a string or a list of parts, got {type(content).__name__}"
        raise EventError(msg)
    return _join_texts([openai_part(part, f"{where}: content[{i}]") for i, part in enumerate(content)])


def result_parts(blocks: Iterable[Part]) -> tuple[str, tuple[Part, ...] | None]:
    """A tool result sent as an array: its text and its parts, in order, as they came."""
    parts = tuple(blocks)
    text = "\n".join(b.text for b in parts if isinstance(b, TextBlock))
    return text, (parts or None)


def from_openai_message(raw: dict[str, Any], *, where: str = "message") -> Message | None:
    """One chat-completions message as a kernel message (``system`` messages give None)."""
    if not isinstance(raw, dict):
        msg = f"{where}: expected an object with 'role', got {type(raw).__name__}"
        raise EventError(msg)
    role = raw.get("role")
    if role in ("system", "developer"):
        return None
    if role == "user":
        content = _openai_content(raw.get("content"), where)
        return Message("user", content or (TextBlock(""),), name=_name(raw, where))
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
        message = Message.assistant(
            _content_text(raw.get("content"), where),
            calls,
            reasoning=reasoning if isinstance(reasoning, str) else None,
        )
        name = _name(raw, where)
        return message if name is None else Message("assistant", message.content, message.source, name)
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str):
            msg = f"{where}: a tool message needs a string 'tool_call_id'"
            raise EventError(msg)
        name = _string(raw, "name", where, optional=True)
        result = raw.get("content")
        if isinstance(result, list):
            text, parts = result_parts(openai_part(part, f"{where}: content[{i}]") for i, part in enumerate(result))
            block = ToolResultBlock(call_id, text, False, name, parts)
            return Message("tool", (block,), Source(kind="tool", call_id=call_id))
        return Message.tool(call_id, _content_text(result, where), name=name)
    msg = f"{where}: unknown role {role!r}; accepted: system, developer, user, assistant, tool"
    raise EventError(msg)


def _arguments_json(arguments: dict[str, Any]) -> str:
    """Arguments as the JSON string the model sent; an unparsable string is sent back verbatim."""
    if set(arguments) == {"_raw"} and isinstance(arguments["_raw"], str):
        return arguments["_raw"]
    if set(arguments) == {"_value"}:
        return orjson.dumps(arguments["_value"]).decode()
    return orjson.dumps(arguments).decode()


def openai_parts(blocks: Any, media: MediaBytes = held_bytes, *, api: str = "openai") -> list[dict[str, Any]]:
    """Kernel blocks as chat-completions content parts: text, media of the ``openai`` wire format
    as they came, opaque parts of it as they came (other formats' blocks are left out)."""
    out: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, TextBlock):
            out.append({"type": "text", "text": b.text})
        elif isinstance(b, MediaBlock) and b.api == api:
            wire = media_wire(b, media)
            out.append(wire if wire is not None else lost_media_text(b))
        elif isinstance(b, OpaqueBlock) and b.api == api and not b.whole:
            out.append(b.data)
    return out


def _has_more_than_text(blocks: Any) -> bool:
    return any(not isinstance(b, TextBlock) for b in blocks)


def to_openai_message(
    message: Message, *, reasoning_content: bool = False, media: MediaBytes = held_bytes
) -> dict[str, Any]:
    """One kernel message as a chat-completions message.

    Reasoning is dropped unless ``reasoning_content`` (DeepSeek's thinking mode wants it back
    within a tool-calling turn; other providers reject the field). A tool result's error flag
    has no chat-completions field and is carried by its content. A user message with media
    and a tool result with content parts go out as content-part arrays, as they came.
    """
    if message.role == "tool":
        result = message.content[0]
        assert isinstance(result, ToolResultBlock)
        parts = result.kept_parts()
        content: Any = result.content
        if parts is not None:
            content = openai_parts(parts, media) or result.content
        return {"role": "tool", "tool_call_id": result.call_id, "content": content}
    text = "\n".join(b.text for b in message.content if isinstance(b, TextBlock))
    out: dict[str, Any] = {"role": message.role, "content": text}
    if message.role == "user" and _has_more_than_text(message.content):
        out["content"] = openai_parts(message.content, media) or text
    if message.name is not None:
        out["name"] = message.name
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


def anthropic_block(block: dict[str, Any], where: str) -> Part:
    """One Anthropic user-side content block (not a tool result) as a kernel block: text, a
    medium (``image``, ``document``), or an opaque block kept as it came."""
    kind = block["type"]
    if kind == "text":
        if set(block) - {"type", "text", "cache_control", "citations"}:
            return OpaqueBlock("anthropic", block)
        return TextBlock(_string(block, "text", where))
    if kind in ("image", "document"):
        source = block.get("source")
        source_type = source.get("type") if isinstance(source, dict) else None
        if source_type == "base64":
            return media_block("anthropic", kind, block, ("source", "data"), "base64")
        if source_type == "text":
            return media_block("anthropic", kind, block, ("source", "data"), "text")
        return media_block("anthropic", kind, block, ("source",), "none")
    return OpaqueBlock("anthropic", block)


def from_anthropic_message(raw: dict[str, Any], *, where: str = "message") -> list[Message]:
    """One Anthropic message; a user message holding tool results becomes several messages.

    Tool results come first (they answer the previous assistant turn), then the user's content
    (text, images and documents in order). A mid-conversation ``{"role": "system"}`` message is
    kept whole, as an opaque block of a user message, and goes back upstream as it came.
    ``redacted_thinking``, server tools' calls and results (``server_tool_use``,
    ``web_search_tool_result`` ...) and any other block the kernel does not read are kept as
    opaque blocks: a server tool's call needs no result from the client.
    """
    role = raw.get("role") if isinstance(raw, dict) else None
    if role == "system":
        content = raw.get("content")
        if content is not None and not isinstance(content, (str, list)):
            msg = f"{where}: a system message's content must be a string or a list of blocks"
            raise EventError(msg)
        return [Message("user", (OpaqueBlock("anthropic", raw, whole=True),))]
    if role not in ("user", "assistant"):
        msg = f"{where}: expected an object with role 'user', 'assistant' or 'system'"
        raise EventError(msg)
    content = _blocks(raw.get("content"), where)
    if role == "assistant":
        blocks: list[Any] = []
        for i, block in enumerate(content):
            kind = block["type"]
            at = f"{where}: content[{i}]"
            if kind == "text" and not set(block) - {"type", "text", "citations", "cache_control"}:
                blocks.append(TextBlock(_string(block, "text", at)))
            elif kind == "thinking":
                blocks.append(
                    ReasoningBlock(_string(block, "thinking", at), _string(block, "signature", at, optional=True))
                )
            elif kind == "tool_use":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    msg = f"{where}: content[{i}] ({kind}) needs a string 'id' and 'name'"
                    raise EventError(msg)
                blocks.append(ToolCallBlock(block["id"], block["name"], _parse_arguments(block.get("input"), where)))
            else:  # redacted_thinking, server_tool_use, *_tool_result, text with citations ...
                blocks.append(OpaqueBlock("anthropic", block))
        return [Message("assistant", tuple(blocks), Source(kind="model"))]
    out: list[Message] = []
    rest: list[Any] = []
    for i, block in enumerate(content):
        kind = block["type"]
        at = f"{where}: content[{i}]"
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                msg = f"{where}: content[{i}] (tool_result) needs a string 'tool_use_id'"
                raise EventError(msg)
            is_error = block.get("is_error")
            if is_error is not None and not isinstance(is_error, bool):
                msg = f"{where}: content[{i}].is_error must be true, false or null, got {is_error!r:.60}"
                raise EventError(msg)
            call_id = block["tool_use_id"]
            result = block.get("content")
            if isinstance(result, list):
                text, kept = result_parts(
                    anthropic_block(part, f"{at}.content[{j}]")
                    for j, part in enumerate(_blocks(result, f"{at}.content"))
                )
                tool = ToolResultBlock(call_id, text, bool(is_error), None, kept)
                out.append(Message("tool", (tool,), Source(kind="tool", call_id=call_id)))
            else:
                out.append(Message.tool(call_id, _content_text(result, where), is_error=bool(is_error)))
        else:
            rest.append(anthropic_block(block, at))
    if rest:
        out.append(Message("user", _join_texts(rest)))
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


def anthropic_blocks(blocks: Any, media: MediaBytes = held_bytes) -> list[dict[str, Any]]:
    """User-side kernel blocks as Anthropic content blocks: text (empty left out), media of the
    ``anthropic`` wire format as they came, opaque blocks of it as they came."""
    out: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, TextBlock):
            if b.text:
                out.append({"type": "text", "text": b.text})
        elif isinstance(b, MediaBlock) and b.api == "anthropic":
            wire = media_wire(b, media)
            out.append(wire if wire is not None else lost_media_text(b))
        elif isinstance(b, OpaqueBlock) and b.api == "anthropic" and not b.whole:
            out.append(b.data)
    return out


#: the role :func:`to_anthropic_blocks` gives a message kept whole (it is sent as it came)
WHOLE = "whole"


def to_anthropic_blocks(message: Message, media: MediaBytes = held_bytes) -> tuple[str, list[dict[str, Any]]]:
    """One kernel message as ``(role, content blocks)`` of an Anthropic message (tool results
    are ``tool_result`` blocks of a user message; empty text and unsigned reasoning left out).
    A message kept whole (a mid-conversation system message) is ``("whole", [the message])``."""
    if message.role == "tool":
        r = message.content[0]
        assert isinstance(r, ToolResultBlock)
        parts = r.kept_parts()
        content: Any = r.content
        if parts is not None:
            content = anthropic_blocks(parts, media) or r.content
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": r.call_id, "content": content}
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
            elif isinstance(b, OpaqueBlock) and b.api == "anthropic" and not b.whole:
                blocks.append(b.data)
        return "assistant", blocks
    if len(message.content) == 1 and isinstance(message.content[0], OpaqueBlock) and message.content[0].whole:
        whole = message.content[0]
        return (WHOLE, [whole.data]) if whole.api == "anthropic" else ("user", [])
    if len(message.content) == 1 and isinstance(message.content[0], TextBlock):
        return "user", ([{"type": "text", "text": message.text}] if message.text else [])
    return "user", anthropic_blocks(message.content, media)


def merge_anthropic_blocks(parts: Any) -> list[dict[str, Any]]:
    """``(role, blocks)`` pairs as alternating Anthropic messages: consecutive same-role parts
    share one message; a message kept whole (``"whole"``) goes out as it came, on its own. The
    block lists given are not modified."""
    out: list[dict[str, Any]] = []
    for role, blocks in parts:
        if not blocks:
            continue
        if role == WHOLE:
            out.append(blocks[0])
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


#: a token count past this is not a count (the imports of ``ctxkernel simulate`` refuse it too)
MAX_USAGE_TOKENS = 2**53


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

    def num(*keys: str, source: dict[str, Any] = usage, where: str = "usage") -> int:
        for key in keys:
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                if not 0 <= value < MAX_USAGE_TOKENS:
                    got = value if abs(value) < 10**18 else f"an integer of {value.bit_length()} bits"
                    msg = f"{where}.{key} must be an integer from 0 to 2**53 - 1, got {got}"
                    raise EventError(msg)
                return value
        return 0

    cached = num("cached_input_tokens", "cache_read_input_tokens")
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and "cached_tokens" in details:
        # the same checks as every other counter: a negative, boolean or huge figure is no count
        cached = num("cached_tokens", source=details, where="usage.prompt_tokens_details")
    if "prompt_tokens" in usage:
        input_tokens = num("prompt_tokens")
    else:  # Anthropic counts cache reads and writes apart from input_tokens
        input_tokens = num("input_tokens") + num("cache_read_input_tokens") + num("cache_creation_input_tokens")
    return {
        "input_tokens": input_tokens,
        "output_tokens": num("completion_tokens", "output_tokens"),
        "cached_input_tokens": cached,
    }
