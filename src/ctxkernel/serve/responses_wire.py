"""The OpenAI Responses API wire format (``POST /v1/responses``): requests, replies, errors and
the SSE stream, towards a Chat Completions upstream (translated) or a Responses upstream.

Shapes follow the official ``openai`` SDK's types (``openai.types.responses``). A request's
``input`` (a string, or a list of items) becomes kernel messages:

- ``message`` items of role ``user`` are user messages (``input_text``, ``input_image`` and
  ``input_file`` parts kept in order, media as blobs); ``system`` and ``developer`` ones join
  ``instructions`` in the system prompt, as the Chat Completions front door does;
- a run of output items (assistant ``message``, ``reasoning``, ``function_call``,
  ``custom_tool_call``, server tools' calls) is one assistant message: text, tool calls, and
  every item the kernel does not read (a ``reasoning`` item with its ``encrypted_content``)
  kept as an opaque block, sent back as it came to a Responses upstream;
- ``function_call_output`` and ``custom_tool_call_output`` are tool results (content arrays
  kept as parts).

``previous_response_id`` is answered from what ``serve`` kept of that response (``app.py``):
the client sends only the new items. A reply is a ``response`` object whose ``output`` holds the
client's own calls only; streamed, it is the Responses event sequence (``response.created`` ...
``response.completed``) with ``sequence_number`` counting from 0 and output indexes renumbered.

Error shape (what the ``openai`` SDK reads)::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "input", "code": null}}
"""

from __future__ import annotations

import functools
import re
import secrets
import time
from collections.abc import Sequence
from typing import Any

from ..convert import (
    MediaBytes,
    _arguments_json,
    _parse_arguments,
    arguments_from_json,
    held_bytes,
    lost_media_text,
    media_block,
    media_wire,
    result_parts,
    to_openai_message,
)
from ..errors import EventError
from ..messages import (
    MediaBlock,
    Message,
    OpaqueBlock,
    Source,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from ..pairing import CallIds, claim_raw_calls
from ..session import Request
from . import openai_wire
from .reconcile import message_hash
from .upstream import UpstreamError
from .wire import (
    ClientRequest,
    Converted,
    MessageMemo,
    ParsedBody,
    WireError,
    add_usage,
    check_depth,
    check_model,
    check_size,
    check_tools,
    depth_refusal,
    expect,
    fits,
    load_json_object,
    model_name,
    obj,
    parsed_whole,
    sse,
)

API = "responses"
#: the memo's name for this wire format (:class:`MessageMemo`)
MEMO_API = API.encode()
#: the upstream kinds a Responses client can be served by
CHAT, RESPONSES = "chat", "responses"
CHAT_PATH = "/chat/completions"
RESPONSES_PATH = "/responses"
FORWARD_HEADERS = openai_wire.FORWARD_HEADERS

#: output items that belong to the model's turn (a run of them is one assistant message)
ASSISTANT_ITEMS = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "web_search_call",
        "file_search_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "tool_search_call",
        "compaction",
    }
)
#: request fields a Chat Completions upstream understands under the same name
CHAT_FIELDS = ("temperature", "top_p", "parallel_tool_calls", "user", "service_tier", "prompt_cache_key")
#: fields that describe a stored conversation: ``serve`` answers them itself
CONVERSATION_FIELDS = ("input", "previous_response_id", "conversation", "instructions")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


#: the ids serve gives responses (``new_id("resp")``): anything else is no response of ours
RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")


def unknown_response(response_id: str) -> WireError:
    return WireError(
        400,
        f"previous_response_id: no stored response {response_id[:100]!r} for this credential (ctxkernel serve "
        "keeps the responses it gave, unless they were created with store: false, and reads each only with the "
        "credential that made it); send the whole input instead",
        param="previous_response_id",
        code="previous_response_not_found",
    )


# -- items -> kernel messages --------------------------------------------------------------------------
def _part(part: Any, where: str) -> Any:
    """One input content part as a kernel block."""
    if isinstance(part, str):
        return TextBlock(part)
    if not isinstance(part, dict):
        raise EventError(f"{where} must be an object, got {type(part).__name__}")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text")
        if not isinstance(text, str):
            raise EventError(f"{where}.text must be a string")
        return TextBlock(text)
    if kind == "input_image":
        detail = part.get("detail")
        return media_block(
            API, "image", part, ("image_url",), "data_url", detail=detail if isinstance(detail, str) else None
        )
    if kind == "input_file":
        return media_block(API, "file", part, ("file_data",), "data_url")
    if kind == "input_audio":
        return media_block(API, "audio", part, ("input_audio", "data"), "base64")
    return OpaqueBlock(API, part)


def _joined(blocks: list[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for block in blocks:
        if isinstance(block, TextBlock) and out and isinstance(out[-1], TextBlock):
            out[-1] = TextBlock(out[-1].text + "\n" + block.text)
        else:
            out.append(block)
    return tuple(out)


def _content(content: Any, where: str) -> tuple[Any, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return (TextBlock(content),)
    if not isinstance(content, list):
        raise EventError(f"{where}.content must be a string or a list of parts, got {type(content).__name__}")
    return _joined([_part(p, f"{where}.content[{i}]") for i, p in enumerate(content)])


def _text_of(content: Any, where: str) -> str:
    return "\n".join(b.text for b in _content(content, where) if isinstance(b, TextBlock))


def is_assistant_item(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    if kind in ASSISTANT_ITEMS:
        return True
    return item.get("role") == "assistant" and kind in (None, "message")


def assistant_message(items: Sequence[dict[str, Any]], where: str) -> Message:
    """A run of output items as one assistant message."""
    blocks: list[Any] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        kind = item.get("type")
        if kind in (None, "message"):
            content = item.get("content")
            if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "refusal" for p in content):
                blocks.append(OpaqueBlock(API, item))
                continue
            text = _text_of(content, at)
            if text:
                blocks.append(TextBlock(text))
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise EventError(f"{at}: a function_call needs a string 'call_id' and 'name'")
            blocks.append(ToolCallBlock(call_id, name, _parse_arguments(item.get("arguments"), at)))
        elif kind == "custom_tool_call":
            call_id, name, free_text = item.get("call_id"), item.get("name"), item.get("input")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(free_text, str):
                raise EventError(f"{at}: a custom_tool_call needs a string 'call_id', 'name' and 'input'")
            blocks.append(ToolCallBlock(call_id, name, {"input": free_text}))
        else:  # reasoning (encrypted content kept), server tools' calls: sent back as they came
            blocks.append(OpaqueBlock(API, item))
    return Message("assistant", _joined(blocks), Source(kind="model"))


def user_side(item: Any, where: str) -> tuple[list[Message], str | None]:
    """One input item that is not the model's: its messages, or its system text."""
    if not isinstance(item, dict):
        raise EventError(f"{where} must be an object, got {type(item).__name__}")
    kind = item.get("type")
    role = item.get("role")
    if kind in (None, "message") and role in ("system", "developer"):
        return [], _text_of(item.get("content"), where)
    if kind in (None, "message") and role == "user":
        content = _content(item.get("content"), where)
        return [Message("user", content or (TextBlock(""),))], None
    if kind in ("function_call_output", "custom_tool_call_output"):
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise EventError(f"{where}: a {kind} needs a string 'call_id'")
        output = item.get("output")
        if isinstance(output, str):
            return [Message.tool(call_id, output)], None
        if isinstance(output, list):
            text, parts = result_parts(_part(part, f"{where}.output[{i}]") for i, part in enumerate(output))
            block = ToolResultBlock(call_id, text, False, None, parts)
            return [Message("tool", (block,), Source(kind="tool", call_id=call_id))], None
        raise EventError(f"{where}.output must be a string or a list of parts")
    if kind == "item_reference":
        raise EventError(
            f"{where}: item_reference is not supported by ctxkernel serve; send the items themselves "
            "(or previous_response_id with the new items only)"
        )
    if kind in (None, "message"):
        raise EventError(f"{where}: unknown role {role!r}; accepted: user, assistant, system, developer")
    return [Message("user", (OpaqueBlock(API, item, whole=True),))], None


def _assistant_run(run: list[Any], where: str) -> list[Message]:
    return [assistant_message(run, where)]


def _user_messages(item: Any, where: str) -> list[Message]:
    return user_side(item, where)[0]


def convert_input(items: list[Any], memo: MessageMemo, first: int = 0) -> tuple[list[Message], list[str], list[str]]:
    """``input`` items as kernel messages, their hashes, and the system texts found among them.
    Each user-side item and each run of output items is converted once (``memo``). ``first``:
    the index of ``items[0]`` in the whole input (what an error names)."""
    messages: list[Message] = []
    hashes: list[str] = []
    system: list[str] = []
    i = 0
    while i < len(items):
        if is_assistant_item(items[i]):
            j = i
            while j < len(items) and is_assistant_item(items[j]):
                j += 1
            run, where = items[i:j], f"input[{first + i}]"
            found, digests = memo.convert(
                run, functools.partial(_assistant_run, where=where), message_hash, api=MEMO_API, where=where, level=2
            )
            messages += found
            hashes += digests
            i = j
            continue
        where = f"input[{first + i}]"
        item = items[i]
        if (
            isinstance(item, dict)
            and item.get("type") in (None, "message")
            and item.get("role") in ("system", "developer")
        ):
            if not fits(item, 3):  # a kept response holds the item as it came
                raise EventError(depth_refusal(where))
            system.append(_text_of(item.get("content"), where))
        else:
            found, digests = memo.convert(
                item, functools.partial(_user_messages, where=where), message_hash, api=MEMO_API, where=where
            )
            messages += found
            hashes += digests
        i += 1
    return messages, hashes, system


# -- the request ---------------------------------------------------------------------------------------
def load_body(raw: bytes, memo: MessageMemo) -> ParsedBody:
    """The body, parsed through ``memo``: a client that sends its whole input every time with
    items appended (Codex CLI with ``store: false``; ``responses.create`` in a loop, ``store``
    left true) has only its new items parsed (:meth:`MessageMemo.parse`, whose ``items`` are
    then those and ``previous`` the rest)."""
    return memo.parse(MEMO_API, raw, "input")


def parse_request(
    raw: bytes | dict[str, Any] | ParsedBody,
    memo: MessageMemo | None = None,
    *,
    earlier: list[Any] | None = None,
    upstream: str = CHAT,
) -> ClientRequest:
    """A Responses body, checked; a 400 names the field that is wrong. ``earlier`` are the items
    of the conversation up to ``previous_response_id`` (the caller found them). A body from
    :func:`load_body` that continues a remembered one converts only its new items."""
    memo = MessageMemo() if memo is None else memo
    if isinstance(raw, ParsedBody):
        parsed = raw
    else:
        parsed = ParsedBody(raw if isinstance(raw, dict) else load_json_object(raw), [], array="input")
    previous = parsed.previous
    if previous is not None and earlier is not None:
        # every item is wanted, joined after the earlier ones
        parsed, previous = parsed_whole(parsed.raw, "input", parsed.continued), None
    body = parsed.body
    model = check_model(body)
    value = body.get("input")
    if previous is not None:
        items: list[Any] = parsed.items  # the new ones: the body's ``input`` may hold them all
    elif isinstance(value, str):
        items = [{"role": "user", "content": value}]
    elif isinstance(value, list):
        items = value
    else:
        raise WireError(400, "input: field required (a string or a list of input items)", param="input")
    if body.get("conversation") is not None:
        raise WireError(
            400,
            "conversation: not supported by ctxkernel serve; use previous_response_id or send the items",
            param="conversation",
        )
    if body.get("background"):
        raise WireError(
            400, "background: background responses are not supported by ctxkernel serve", param="background"
        )
    stream = expect(body, "stream", bool, "a boolean") or False
    instructions = expect(body, "instructions", str, "a string") or ""
    every = [*(earlier or []), *items]
    check_size(ParsedBody(body, every, previous), "input")
    check_depth(parsed)
    raw_tools = expect(body, "tools", list, "a list of tools") or []
    check_tools(raw_tools)
    tools: list[dict[str, Any]] = []
    custom: set[str] = set()
    for i, tool in enumerate(raw_tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise WireError(400, f"tools[{i}]: expected an object with a 'type'", param=f"tools[{i}]")
        if tool["type"] == "function":
            if not isinstance(tool.get("name"), str):
                raise WireError(400, f"tools[{i}]: a function tool needs a 'name'", param=f"tools[{i}]")
            tools.append(chat_tool(tool))
        elif tool["type"] == "custom":
            if not isinstance(tool.get("name"), str):
                raise WireError(400, f"tools[{i}]: a custom tool needs a 'name'", param=f"tools[{i}]")
            custom.add(tool["name"])
            tools.append(chat_tool(tool))
        # any other tool (web_search, namespace, mcp ...) runs at the provider: a Responses upstream
        # gets it as sent; a Chat Completions upstream has nothing to run it with, and is not offered it
    try:
        converted, hashes, system_parts = convert_input(every, memo, previous.count if previous is not None else 0)
    except EventError as exc:
        raise WireError(400, str(exc), param="input") from None
    if previous is not None:  # it ended with a user-side item (it was accepted): no run continues
        converted, hashes = [*previous.messages, *converted], [*previous.hashes, *hashes]
        system_parts = [*previous.system, *system_parts]
    system = "\n\n".join(part for part in (instructions, *system_parts) if part)
    if not converted or converted[-1].role == "assistant":
        raise WireError(
            400, "input: the last item must be a user message or a tool output (not the model's own)", param="input"
        )
    remembered = None
    if earlier is None:  # what a next body that appends to this one continues from
        count = len(items) + (previous.count if previous is not None else 0)
        remembered = memo.remember(
            MEMO_API, parsed, Converted(count, None, list(converted), list(hashes), list(system_parts))
        )
    client = ClientRequest(API, body, model, system, converted, tools, raw_tools, stream, hashes=hashes)
    # what keeping the response needs (proxy.remember_response): ``new_items`` are the items after
    # the ``repeats`` the remembered body's ``after`` proves (its input, byte for byte), the body
    # is kept to read the whole input when that proof names no kept response, and the history
    # this body leaves for the next is tied to the response kept for it
    client.extra.update(
        upstream=upstream,
        custom=custom,
        new_items=items,
        media=held_bytes,
        repeats=previous.count if previous is not None else 0,
        after=previous.tag if previous is not None else None,
        raw=parsed.raw,
        remembered=remembered,
    )
    return client


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function or custom tool as a Chat Completions function (what the meter counts
    and what a Chat upstream receives); a custom tool takes its free text as ``input``."""
    if tool.get("type") == "custom":
        return {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description") or "",
                "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "string", "description": "the tool's free-form input"}},
                    "required": ["input"],
                },
            },
        }
    fn: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description"):
        fn["description"] = tool["description"]
    if tool.get("strict") is not None:
        fn["strict"] = tool["strict"]
    return {"type": "function", "function": fn}


def responses_tool(chat: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions function schema (a strategy's tool) as a Responses function tool."""
    fn = chat.get("function") or {}
    return {
        "type": "function",
        "name": fn.get("name", ""),
        "description": fn.get("description", ""),
        "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
        "strict": False,
    }


# -- kernel messages -> the upstream -----------------------------------------------------------------------
def chat_part(block: Any, media: MediaBytes) -> dict[str, Any] | None:
    """A user-side block as a Chat Completions content part (Responses media translated)."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, MediaBlock):
        wire = media_wire(block, media)
        if wire is None:
            return lost_media_text(block)
        if block.api == "openai":
            return wire
        if block.api == API and block.kind == "image":
            image: dict[str, Any] = {"url": wire.get("image_url") or ""}
            if isinstance(wire.get("detail"), str):
                image["detail"] = wire["detail"]
            if not image["url"] and isinstance(wire.get("file_id"), str):
                return {"type": "text", "text": "[image given by file id; not available to this provider]"}
            return {"type": "image_url", "image_url": image}
        if block.api == API and block.kind == "file":
            file = {k: wire[k] for k in ("file_data", "file_id", "filename") if isinstance(wire.get(k), str)}
            return {"type": "file", "file": file}
        if block.api == API and block.kind == "audio":
            return {"type": "input_audio", "input_audio": wire.get("input_audio") or {}}
    return None


def chat_messages(messages: Sequence[Message], media: MediaBytes = held_bytes) -> list[dict[str, Any]]:
    """Surface messages as Chat Completions messages. A Chat tool message holds text only: the
    images and files of tool results go in a user message after the run of tool messages they
    came in (between two tool messages it would part them from their call)."""
    out: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    for message in messages:
        if message.role != "tool" and held:
            out.append({"role": "user", "content": held})
            held = []
        if message.role == "user":
            if any(not isinstance(b, TextBlock) for b in message.content):
                content = [p for p in (chat_part(b, media) for b in message.content) if p is not None]
                if content:
                    out.append({"role": "user", "content": content})
                continue
            out.append(to_openai_message(message))
            continue
        if message.role == "tool":
            result = message.content[0]
            assert isinstance(result, ToolResultBlock)
            parts = result.kept_parts()
            if parts is not None:
                media_parts = [p for b in parts if not isinstance(b, TextBlock) and (p := chat_part(b, media))]
                if media_parts:
                    texts = [{"type": "text", "text": b.text} for b in parts if isinstance(b, TextBlock)]
                    out.append({"role": "tool", "tool_call_id": result.call_id, "content": texts or result.content})
                    held += media_parts
                    continue
        out.append(to_openai_message(message, media=media))
    if held:
        out.append({"role": "user", "content": held})
    return out


def response_items(
    messages: Sequence[Message], custom: set[str], media: MediaBytes = held_bytes
) -> list[dict[str, Any]]:
    """Surface messages as Responses ``input`` items (one pass: a tool output knows whether its
    call was a custom tool's)."""
    items: list[dict[str, Any]] = []
    custom_calls: set[str] = set()
    for message in messages:
        if message.role == "tool":
            result = message.content[0]
            assert isinstance(result, ToolResultBlock)
            parts = result.kept_parts()
            output: Any = result.content
            if parts is not None:
                output = [p for p in (response_part(b, media, output=True) for b in parts) if p is not None]
            kind = "custom_tool_call_output" if result.call_id in custom_calls else "function_call_output"
            items.append({"type": kind, "call_id": result.call_id, "output": output})
            continue
        if message.role == "user":
            whole = [b for b in message.content if isinstance(b, OpaqueBlock) and b.whole]
            if whole:
                items += [b.data for b in whole if b.api == API]
                continue
            content = [p for p in (response_part(b, media) for b in message.content) if p is not None]
            if content:
                item: dict[str, Any] = {"type": "message", "role": "user", "content": content}
                items.append(item)
            continue
        texts: list[str] = []
        for block in message.content:
            if isinstance(block, TextBlock):
                if block.text:
                    texts.append(block.text)
                continue
            _flush_text(items, texts)
            if isinstance(block, OpaqueBlock) and block.api == API:
                items.append(block.data)
            elif isinstance(block, ToolCallBlock):
                arguments = block.arguments
                if block.name in custom and set(arguments) == {"input"} and isinstance(arguments["input"], str):
                    custom_calls.add(block.id)
                    items.append(
                        {
                            "type": "custom_tool_call",
                            "call_id": block.id,
                            "name": block.name,
                            "input": arguments["input"],
                        }
                    )
                else:
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": block.id,
                            "name": block.name,
                            "arguments": _arguments_json(arguments),
                        }
                    )
        _flush_text(items, texts)
    return items


def _flush_text(items: list[dict[str, Any]], texts: list[str]) -> None:
    """The assistant texts gathered so far as one output message item."""
    if texts:
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "\n".join(texts), "annotations": []}],
            }
        )
        texts.clear()


def response_part(block: Any, media: MediaBytes, *, output: bool = False) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        return {"type": "input_text", "text": block.text}
    if isinstance(block, MediaBlock) and block.api == API:
        wire = media_wire(block, media)
        if wire is None:
            return {"type": "input_text", "text": lost_media_text(block)["text"]}
        return wire
    if isinstance(block, OpaqueBlock) and block.api == API and not block.whole:
        return block.data
    return None


def upstream_payload(
    client: ClientRequest,
    request: Request,
    strategy_tools: list[dict[str, Any]],
    *,
    stream: bool,
    cache: dict[Any, Any] | None = None,
) -> dict[str, Any] | bytes:
    """The upstream body: a Chat Completions body built from the Responses request, or (with a
    Responses upstream) the client's body with the managed input and the strategies' tools."""
    media = client.extra.get("media") or held_bytes
    if client.extra.get("upstream") == RESPONSES:
        body = {k: v for k, v in client.body.items() if k not in CONVERSATION_FIELDS}
        body["input"] = response_items(request.messages, client.extra.get("custom") or set(), media)
        if request.system:
            body["instructions"] = request.system
        tools = list(client.raw_tools) + [responses_tool(t) for t in strategy_tools]
        if tools:
            body["tools"] = tools
        else:
            body.pop("tools", None)
        _cache_key(body, request)
        body["stream"] = stream
        return body
    return chat_body(client, request, strategy_tools, stream=stream, media=media)


def _cache_key(body: dict[str, Any], request: Request) -> None:
    """Every request of the session reaches the same prompt cache, unless the client chose a key
    (docs/cache.md)."""
    key = request.cache_key
    if key is not None and not body.get("prompt_cache_key"):
        body["prompt_cache_key"] = key


def chat_body(
    client: ClientRequest, request: Request, strategy_tools: list[dict[str, Any]], *, stream: bool, media: MediaBytes
) -> dict[str, Any]:
    source = client.body
    body: dict[str, Any] = {"model": client.model}
    for key in CHAT_FIELDS:
        if source.get(key) is not None:
            body[key] = source[key]
    if isinstance(source.get("max_output_tokens"), int):
        body["max_tokens"] = source["max_output_tokens"]
    reasoning = obj(source.get("reasoning"))
    if isinstance(reasoning.get("effort"), str):
        body["reasoning_effort"] = reasoning["effort"]
    text_format = obj(obj(source.get("text")).get("format"))
    if text_format.get("type") == "json_schema":
        schema = {k: v for k, v in text_format.items() if k != "type"}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif text_format.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    choice = source.get("tool_choice")
    if isinstance(choice, str):
        body["tool_choice"] = choice
    elif (
        isinstance(choice, dict)
        and choice.get("type") in ("function", "custom")
        and isinstance(choice.get("name"), str)
    ):
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages += chat_messages(request.messages, media)
    body["messages"] = messages
    tools = list(client.tools) + strategy_tools
    if tools:
        body["tools"] = tools
    _cache_key(body, request)
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


# -- replies ---------------------------------------------------------------------------------------------------
def read_reply(payload: Any, upstream: str = CHAT) -> tuple[Message, dict[str, Any] | None, dict[str, Any]]:
    """``(message, usage, raw)`` of an upstream reply: the Chat message, or the Responses object."""
    if upstream == CHAT:
        return openai_wire.read_reply(payload)
    if not isinstance(payload, dict) or not isinstance(payload.get("output"), list):
        raise ValueError("the upstream reply has no output list")
    items = [i for i in payload["output"] if isinstance(i, dict)]
    try:
        message = assistant_message(items, "upstream output")
    except EventError as exc:
        raise ValueError(str(exc)) from None
    usage = payload.get("usage")
    return message, usage if isinstance(usage, dict) else None, payload


#: output items whose ``call_id`` the client answers with a tool output
CALL_ITEMS = ("function_call", "custom_tool_call")


def claim_calls(raw: dict[str, Any], upstream: str, ids: CallIds) -> list[tuple[str, str]] | None:
    """Give each tool call of a reply (``read_reply``'s ``raw``) an id of its own (``CallIds``),
    in place: the ``(old, new)`` pair of every call, or None when none was renamed."""
    if upstream == CHAT:
        return claim_raw_calls(openai_wire.raw_calls(raw), ids)
    pairs = []
    renamed = False
    for item in raw.get("output") or []:
        if isinstance(item, dict) and item.get("type") in CALL_ITEMS and isinstance(item.get("call_id"), str):
            old = item["call_id"]
            new = ids.claim(old)
            if new != old:
                item["call_id"] = new
                renamed = True
            pairs.append((old, new))
    return pairs if renamed else None


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Chat Completions usage object in the Responses shape."""
    if not isinstance(usage, dict):
        return None
    if "input_tokens" in usage:
        return usage
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": _count(obj(usage.get("prompt_tokens_details")).get("cached_tokens"))},
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": _count(obj(usage.get("completion_tokens_details")).get("reasoning_tokens"))
        },
        "total_tokens": prompt + completion,
    }


def _count(value: Any) -> int:
    """A usage count as the upstream gave it, or 0 when it gave none (or not a number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def output_text_item(text: str, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id or new_id("msg"),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def function_item(
    call_id: str, name: str, arguments: str, custom: set[str], item_id: str | None = None
) -> dict[str, Any]:
    if name in custom:
        parsed = arguments_from_json(arguments)
        text = parsed.get("input") if isinstance(parsed.get("input"), str) else arguments
        return {
            "id": item_id or new_id("ctc"),
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": call_id,
            "name": name,
            "input": text,
        }
    return {
        "id": item_id or new_id("fc"),
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def chat_output_items(raw: dict[str, Any], strategy_tools: set[str], custom: set[str]) -> list[dict[str, Any]]:
    """A Chat reply message as the client's output items (its reasoning, text and own calls)."""
    items: list[dict[str, Any]] = []
    reasoning = raw.get("reasoning_content") or raw.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        items.append(reasoning_item(reasoning))
    content = raw.get("content")
    if isinstance(content, str) and content:
        items.append(output_text_item(content))
    for call in openai_wire.raw_calls(raw):
        name = openai_wire.call_name(call)
        if name in strategy_tools:
            continue
        arguments = obj(call.get("function")).get("arguments")
        call_id = call.get("id")
        items.append(
            function_item(
                call_id if isinstance(call_id, str) else new_id("call"),
                name,
                arguments if isinstance(arguments, str) else "",
                custom,
            )
        )
    return items


def reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "id": item_id or new_id("rs"),
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}],
    }


def visible_items(items: list[Any], strategy_tools: set[str]) -> list[dict[str, Any]]:
    """A Responses upstream's output items the client may see: all but strategy calls."""
    return [
        i
        for i in items
        if isinstance(i, dict) and not (i.get("type") == "function_call" and i.get("name") in strategy_tools)
    ]


def response_object(
    client: ClientRequest,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    *,
    response_id: str,
    created: float,
    status: str = "completed",
    base: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``response`` object the client gets (the upstream's own fields when it was one)."""
    body = client.body
    out: dict[str, Any] = dict(base or {})
    out.update(
        {
            "id": response_id,
            "object": "response",
            "created_at": created,
            "status": status,
            "model": out.get("model") or client.model,
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": client.raw_tools,
            "instructions": body.get("instructions"),
            "previous_response_id": body.get("previous_response_id"),
            "store": body.get("store", True),
            "error": None,
            "incomplete_details": None,
            "metadata": body.get("metadata") or {},
            "usage": chat_usage(usage),
        }
    )
    for key in ("temperature", "top_p", "max_output_tokens", "reasoning", "text", "truncation", "user"):
        if key in body and key not in out:
            out[key] = body[key]
    return out


def client_view(output: list[dict[str, Any]]) -> Message:
    """The reply as the client holds it (what it sends back as items)."""
    return assistant_message(output, "reply")


def error_body(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return openai_wire.error_body(message, kind=kind, param=param, code=code)


def overflow_error(tokens: int, window: int) -> dict[str, Any]:
    return openai_wire.overflow_error(tokens, window) | {}


# -- streaming ---------------------------------------------------------------------------------------------
class StreamTranslator:
    """The client's one Responses event stream from the upstream's rounds (Chat chunks or
    Responses events). ``response.created`` and ``response.in_progress`` open it, every text,
    reasoning and client call item is streamed as it arrives (output indexes count the client's
    items only, strategy calls never appear), and ``response.completed`` closes it with the
    whole response and the summed usage."""

    def __init__(self, client: ClientRequest, strategy_tools: set[str], *, response_id: str) -> None:
        self.client = client
        self.upstream = client.extra.get("upstream", CHAT)
        self.custom: set[str] = client.extra.get("custom") or set()
        self.strategy_tools = strategy_tools
        #: the ids the round's tool calls may take (a reused one is renamed before the client sees it)
        self.ids = CallIds()
        self.response_id = response_id
        self.created = time.time()
        self.sequence = 0
        self.started = False
        self.output: list[dict[str, Any]] = []  # the client's finished items, in order
        self.usage: dict[str, Any] | None = None
        self.model = client.model
        self.base: dict[str, Any] | None = None
        self.added = 0  # client items announced so far (a Responses upstream's, renumbered)
        self.begin_round()

    # -- framing
    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return sse(payload, kind)

    def _response(self, status: str) -> dict[str, Any]:
        usage = self.usage if status == "completed" else None
        return response_object(
            self.client,
            list(self.output) if status == "completed" else [],
            usage,
            response_id=self.response_id,
            created=self.created,
            status=status,
            base=self.base,
        )

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        response = self._response("in_progress")
        return [
            self._event("response.created", {"response": response}),
            self._event("response.in_progress", {"response": response}),
        ]

    def begin_round(self) -> None:
        self.round_usage: dict[str, Any] | None = None
        self.round_done = False
        # chat upstream
        self.text_item: dict[str, Any] | None = None
        self.round_text: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_index: int | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        # responses upstream: upstream output index -> the client's (None: a strategy call)
        self.index_map: dict[int, int | None] = {}
        self.round_items: dict[int, dict[str, Any]] = {}
        self.call_ids: dict[int, str] = {}  # upstream output index -> the call's id as claimed

    @property
    def round_complete(self) -> bool:
        return self.round_done

    def upstream_error(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """The error an upstream event reports, or None."""
        if self.upstream == CHAT:
            error = data.get("error")
            return error if isinstance(error, dict) else ({"message": str(error)} if error else None)
        kind = data.get("type")
        if kind == "error":
            return {k: data.get(k) for k in ("type", "code", "message", "param") if k in data}
        if kind == "response.failed":
            error = obj(obj(data.get("response")).get("error"))
            return error or {"message": "the upstream response failed"}
        return None

    def feed_event(self, event: str | None, data: dict[str, Any]) -> list[bytes]:
        out = self._start()
        if self.upstream == CHAT:
            out += self._feed_chat(data)
        else:
            out += self._feed_responses(data)
        return out

    # -- a Chat upstream
    _reasoning_closed = True
    _reasoning_id = ""

    def _open_text(self) -> list[bytes]:
        out = self._close_reasoning()
        item = output_text_item("", status="in_progress")
        item["content"] = []
        self.text_item = {"item": item, "index": self._slot()}
        out.append(self._event("response.output_item.added", {"output_index": self.text_item["index"], "item": item}))
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        out.append(
            self._event(
                "response.content_part.added",
                {"item_id": item["id"], "output_index": self.text_item["index"], "content_index": 0, "part": part},
            )
        )
        return out

    def _slot(self) -> int:
        """The next output index the client sees."""
        return len(self.output) + self._open_count()

    def _open_count(self) -> int:
        count = 0
        if self.text_item is not None:
            count += 1
        if self.reasoning_index is not None and not self._reasoning_closed:
            count += 1
        count += sum(1 for c in self.calls.values() if c.get("client_index") is not None and not c.get("closed"))
        return count

    def _close_reasoning(self) -> list[bytes]:
        if self.reasoning_index is None or self._reasoning_closed:
            return []
        self._reasoning_closed = True
        item = reasoning_item("".join(self.reasoning), self._reasoning_id)
        self.output.append(item)
        return [self._event("response.output_item.done", {"output_index": self.reasoning_index, "item": item})]

    def _close_text(self) -> list[bytes]:
        if self.text_item is None:
            return []
        state, self.text_item = self.text_item, None
        item, index = state["item"], state["index"]
        text = "".join(self.round_text)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        done = output_text_item(text, item["id"])
        self.output.append(done)
        return [
            self._event(
                "response.output_text.done",
                {"item_id": item["id"], "output_index": index, "content_index": 0, "text": text, "logprobs": []},
            ),
            self._event(
                "response.content_part.done",
                {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part},
            ),
            self._event("response.output_item.done", {"output_index": index, "item": done}),
        ]

    def _feed_chat(self, data: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if "model" in data:
            self.model = model_name(data["model"], self.model)
        if isinstance(data.get("usage"), dict):
            self.round_usage = data["usage"]
        choices = data.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = obj(choice.get("delta"))
            reasoning = delta.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                if self.reasoning_index is None:
                    self._reasoning_closed = False
                    self._reasoning_id = new_id("rs")
                    self.reasoning_index = self._slot()
                    item = {"id": self._reasoning_id, "type": "reasoning", "summary": []}
                    out.append(
                        self._event("response.output_item.added", {"output_index": self.reasoning_index, "item": item})
                    )
                self.reasoning.append(reasoning)
            content = delta.get("content")
            if isinstance(content, str) and content:
                if self.text_item is None:
                    out += self._open_text()
                self.round_text.append(content)
                out.append(
                    self._event(
                        "response.output_text.delta",
                        {
                            "item_id": self.text_item["item"]["id"],  # type: ignore[index]
                            "output_index": self.text_item["index"],  # type: ignore[index]
                            "content_index": 0,
                            "delta": content,
                            "logprobs": [],
                        },
                    )
                )
            tool_calls = delta.get("tool_calls")
            for tc in tool_calls if isinstance(tool_calls, list) else []:
                out += self._tool_delta(tc)
            if isinstance(choice.get("finish_reason"), str):
                self.round_done = True
        return out

    def _tool_delta(self, tc: Any) -> list[bytes]:
        if not isinstance(tc, dict) or not isinstance(tc.get("index"), int):
            return []
        out = self._close_reasoning() + self._close_text()
        call = self.calls.setdefault(tc["index"], {"id": "", "name": "", "args": [], "client_index": None, "sent": 0})
        if isinstance(tc.get("id"), str) and call.get("owner") is None:
            call["id"] = tc["id"]
        fn = obj(tc.get("function"))
        if isinstance(fn.get("name"), str):
            call["name"] += fn["name"]
        if isinstance(fn.get("arguments"), str):
            call["args"].append(fn["arguments"])
        if call.get("owner") is None and call["name"] and call["args"]:
            out += self._decide(call)
        return out + self._flush(call)

    def _decide(self, call: dict[str, Any]) -> list[bytes]:
        call["id"] = self.ids.claim(call["id"])
        call["owner"] = "strategy" if call["name"] in self.strategy_tools else "client"
        if call["owner"] != "client":
            return []
        call["client_index"] = self._slot()
        call["item"] = function_item(call["id"], call["name"], "", self.custom)
        call["item"]["status"] = "in_progress"
        return [
            self._event(
                "response.output_item.added", {"output_index": call["client_index"], "item": dict(call["item"])}
            )
        ]

    def _flush(self, call: dict[str, Any]) -> list[bytes]:
        if call.get("owner") != "client" or call["item"]["type"] != "function_call":
            return []
        pending = "".join(call["args"][call["sent"] :])
        call["sent"] = len(call["args"])
        if not pending:
            return []
        return [
            self._event(
                "response.function_call_arguments.delta",
                {"item_id": call["item"]["id"], "output_index": call["client_index"], "delta": pending},
            )
        ]

    def _close_calls(self) -> list[bytes]:
        out: list[bytes] = []
        for call in self.calls.values():
            if call.get("owner") is None:
                out += self._decide(call)
                out += self._flush(call)
            if call.get("owner") != "client" or call.get("closed"):
                continue
            call["closed"] = True
            arguments = "".join(call["args"])
            item = function_item(call["item"]["call_id"], call["name"], arguments, self.custom, call["item"]["id"])
            if item["type"] == "function_call":
                out.append(
                    self._event(
                        "response.function_call_arguments.done",
                        {"item_id": item["id"], "output_index": call["client_index"], "arguments": arguments},
                    )
                )
            else:
                out.append(
                    self._event(
                        "response.custom_tool_call_input.done",
                        {"item_id": item["id"], "output_index": call["client_index"], "input": item["input"]},
                    )
                )
            self.output.append(item)
            out.append(self._event("response.output_item.done", {"output_index": call["client_index"], "item": item}))
        return out

    # -- a Responses upstream
    def _feed_responses(self, data: dict[str, Any]) -> list[bytes]:
        kind = data.get("type")
        if not isinstance(kind, str):
            return []
        if kind in ("response.created", "response.in_progress", "response.queued"):
            response = obj(data.get("response"))
            if "model" in response:
                self.model = model_name(response["model"], self.model)
            return []
        if kind in ("response.completed", "response.incomplete"):
            response = obj(data.get("response"))
            usage = response.get("usage")
            self.round_usage = usage if isinstance(usage, dict) else None
            if self.base is None:
                self.base = {
                    k: v
                    for k, v in response.items()
                    if k not in ("id", "output", "usage", "status", "created_at", "previous_response_id")
                }
                if "model" in self.base:
                    self.base["model"] = model_name(self.base["model"], self.client.model)
            self.round_done = True
            return []
        index = data.get("output_index")
        if not isinstance(index, int):
            return []
        if kind in ("response.output_item.added", "response.output_item.done"):
            data = self._claimed(index, data)
        if kind == "response.output_item.added":
            item = obj(data.get("item"))
            if item.get("type") == "function_call" and item.get("name") in self.strategy_tools:
                self.index_map[index] = None
                return []
            self.index_map[index] = self.added
            self.added += 1
        client_index = self.index_map.get(index)
        if client_index is None:
            if kind == "response.output_item.done":
                self.round_items[index] = obj(data.get("item"))
            return []
        if kind == "response.output_item.done":
            item = obj(data.get("item"))
            self.round_items[index] = item
            self.output.append(item)
        forwarded = {k: v for k, v in data.items() if k not in ("type", "sequence_number")}
        forwarded["output_index"] = client_index
        return [self._event(kind, forwarded)]

    def _claimed(self, index: int, data: dict[str, Any]) -> dict[str, Any]:
        """An ``output_item`` event with its call's id as claimed (``CallIds``) when first seen."""
        item = obj(data.get("item"))
        if item.get("type") not in CALL_ITEMS or not isinstance(item.get("call_id"), str):
            return data
        if index not in self.call_ids:
            self.call_ids[index] = self.ids.claim(item["call_id"])
        if self.call_ids[index] == item["call_id"]:
            return data
        return {**data, "item": {**item, "call_id": self.call_ids[index]}}

    # -- rounds
    def end_round(self) -> tuple[list[bytes], Message, dict[str, Any] | None, list[str]]:
        out: list[bytes] = []
        if self.upstream == CHAT:
            out += self._close_reasoning() + self._close_text() + self._close_calls()
            blocks = [
                ToolCallBlock(c["id"], c["name"], arguments_from_json("".join(c["args"]))) for c in self.calls.values()
            ]
            message = Message.assistant("".join(self.round_text), blocks, reasoning="".join(self.reasoning) or None)
            names = [c["name"] for c in self.calls.values()]
            self.reasoning_index = None
            self._reasoning_closed = True
        else:
            items = [self.round_items[k] for k in sorted(self.round_items)]
            try:
                message = assistant_message(items, "upstream output")
            except EventError as exc:
                raise UpstreamError(f"the upstream sent an unreadable reply: {exc}") from None
            names = [c.name for c in message.tool_calls]
        self.usage = add_usage(self.usage, self.round_usage)
        return out, message, self.round_usage, names

    def finish_stream(self) -> list[bytes]:
        out = self._start()
        response = self._response("completed")
        self.final = response
        out.append(self._event("response.completed", {"response": response}))
        return out

    def error_event(self, message: str, kind: str = "api_error") -> list[bytes]:
        return self.passthrough_error({"type": kind, "message": message, "code": None, "param": None})

    def passthrough_error(self, error: dict[str, Any]) -> list[bytes]:
        out = self._start()
        data = {
            "code": error.get("code") if isinstance(error.get("code"), str) else error.get("type"),
            "message": str(error.get("message") or "upstream error")[:1000],
            "param": error.get("param") if isinstance(error.get("param"), str) else None,
        }
        out.append(self._event("error", data))
        return out

    def client_view(self) -> Message:
        return client_view(self.output)
