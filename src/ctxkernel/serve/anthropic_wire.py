"""The Anthropic Messages wire format: requests, replies, errors and the SSE stream.

Error shape (what the ``anthropic`` SDK reads)::

    {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}

``cache_control`` passes through on the system blocks and on the client's tools as sent. The
messages the upstream receives are the session's surface, rebuilt from the log, so a client's
``cache_control`` marks on message blocks cannot be carried block by block: when the client
marked any, the last block of the last message gets ``{"type": "ephemeral"}``, which is where
Claude Code and the SDK examples put their rolling breakpoint. Past the provider's limit of four
the marks after the fourth (tools, then system, then messages) are left out.

A client that sent no breakpoint at all gets the kernel's (``[cache] hints``, docs/cache.md):
after the last tool, after the system prompt, at the last message the previous request also
held, and at the last message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..convert import (
    EPHEMERAL,
    MAX_CACHE_BREAKPOINTS,
    arguments_from_json,
    from_anthropic_message,
    held_bytes,
    mark_message_breakpoints,
    merge_anthropic_blocks,
    to_anthropic_blocks,
    to_anthropic_request,
)
from ..errors import EventError
from ..messages import Message
from ..pairing import CallIds
from ..session import Request
from .reconcile import message_hash
from .upstream import UpstreamError
from .wire import (
    ClientRequest,
    MessageMemo,
    WireError,
    add_usage,
    check_depth,
    check_model,
    check_size,
    check_tools,
    expect,
    model_name,
    obj,
    sse,
    wire_forms,
)

API = "anthropic"
UPSTREAM_PATH = "/v1/messages"
FORWARD_HEADERS = ("anthropic-version", "anthropic-beta")


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        parts = []
        for i, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise WireError(
                    400, f"system[{i}]: expected a text block {{'type': 'text', 'text': ...}}", param=f"system[{i}]"
                )
            parts.append(block["text"])
        return "\n\n".join(parts)
    raise WireError(
        400, f"system: expected a string or a list of text blocks, got {type(system).__name__}", param="system"
    )


def _cache_marked(message: Any) -> bool:
    """Whether a client message carries a ``cache_control`` mark on one of its blocks."""
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(isinstance(b, dict) and "cache_control" in b for b in content)


def _header_marks(body: dict[str, Any]) -> int:
    """The client's breakpoints outside the messages: the top-level one, its tools', its system
    blocks'."""
    found = 1 if body.get("cache_control") else 0
    for key in ("tools", "system"):
        items = body.get(key)
        if isinstance(items, list):
            found += sum(1 for b in items if isinstance(b, dict) and b.get("cache_control"))
    return found


def _marked_last(items: list[Any]) -> list[Any]:
    """``items`` with a breakpoint on its last object (a copy)."""
    out = list(items)
    if out and isinstance(out[-1], dict):
        out[-1] = {**out[-1], "cache_control": dict(EPHEMERAL)}
    return out


def _within_limit(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    """Leave out the client's breakpoints after the fourth (in the provider's order: the
    top-level one, tools, system, messages); the lists changed are copies."""
    budget = MAX_CACHE_BREAKPOINTS - (1 if body.get("cache_control") else 0)
    for key in ("tools", "system"):
        items = body.get(key)
        if not isinstance(items, list):
            continue
        kept = []
        for item in items:
            if isinstance(item, dict) and item.get("cache_control"):
                if budget <= 0:
                    item = {k: v for k, v in item.items() if k != "cache_control"}
                budget -= 1
            kept.append(item)
        body[key] = kept
    if budget <= 0 and messages:
        last = messages[-1]["content"][-1]
        messages[-1]["content"][-1] = {k: v for k, v in last.items() if k != "cache_control"}


def parse_request(raw: bytes, memo: MessageMemo | None = None, *, count_only: bool = False) -> ClientRequest:
    """A Messages API body, checked; a 400 names the field that is wrong. ``count_only``: a
    ``count_tokens`` body (no ``max_tokens``)."""
    memo = MessageMemo() if memo is None else memo
    parsed = memo.parse(b"anthropic", raw)
    body = parsed.body
    model = check_model(body)
    expect(body, "max_tokens", int, "an integer", required=not count_only)
    messages = expect(body, "messages", list, "a list of messages", required=True)
    if not messages:
        raise WireError(400, "messages: at least one message is required", param="messages")
    check_size(parsed)
    check_depth(parsed)
    stream = expect(body, "stream", bool, "a boolean") or False
    system = _system_text(body.get("system"))
    raw_tools = expect(body, "tools", list, "a list of tools") or []
    check_tools(raw_tools)
    tools = []
    for i, tool in enumerate(raw_tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise WireError(400, f"tools.{i}: expected an object with a 'name'", param=f"tools.{i}")
        if "input_schema" in tool:  # a custom tool; server tools (type web_search_... ) pass through as sent
            schema = tool["input_schema"]
            if not isinstance(schema, dict):
                raise WireError(400, f"tools.{i}.input_schema: expected an object", param=f"tools.{i}.input_schema")
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "description": tool.get("description", ""),
                        "parameters": schema,
                    },
                }
            )

    total = (parsed.previous.count if parsed.previous is not None else 0) + len(messages)

    def one(i: int, item: Any) -> tuple[Sequence[Message], Sequence[str], str | None]:
        if isinstance(item, dict) and item.get("role") == "user" and item.get("content") == []:
            # refused here, before the memo remembers the body: a user message with no block
            # would otherwise leave no message at all (an empty string is kept: one empty text)
            if i == total - 1:
                msg = (
                    f"messages.{i}: the last message's content is an empty list; ctxkernel serve takes a "
                    "last message with role 'user' and a non-empty string or list of content blocks"
                )
            else:
                msg = (
                    f"messages.{i}: a user message's content is an empty list; ctxkernel serve takes a user "
                    "message's content as a string or a non-empty list of content blocks"
                )
            raise EventError(msg)
        found, digests = memo.convert(
            item,
            lambda m: from_anthropic_message(m, where=f"messages.{i}"),
            message_hash,
            api=b"anthropic",
            where=f"messages.{i}",
        )
        return found, digests, None

    try:
        history = memo.convert_history(b"anthropic", parsed, one, _cache_marked)
    except EventError as exc:
        raise WireError(400, str(exc), param="messages") from None
    converted, hashes = list(history.messages), list(history.hashes)
    last = messages[-1].get("role") if isinstance(messages[-1], dict) else None
    if not converted or last not in ("user", "system"):
        raise WireError(
            400,
            "messages: the last message must have role 'user' or 'system' (an assistant prefill is not supported)",
            param="messages",
        )
    return ClientRequest(
        API,
        body,
        model,
        system,
        converted,
        tools,
        raw_tools,
        stream,
        extra={"cache_marks": history.marked, "header_marks": _header_marks(body)},
        hashes=hashes,
    )


def upstream_body(
    client: ClientRequest,
    request: Request,
    strategy_tools: list[dict[str, Any]],
    *,
    stream: bool,
    cache: dict[Any, Any] | None = None,
) -> dict[str, Any]:
    """The client's body with the managed messages, its own system blocks (strategy sections
    appended as one more block) and its own tools followed by the strategy's. ``cache`` (one
    per session) keeps each surface node's blocks between requests."""
    body = dict(client.body)
    cache = {} if cache is None else cache
    media = client.extra.get("media") or held_bytes
    parts: list[Any] = wire_forms(request.seqs, request.messages, cache, lambda m: to_anthropic_blocks(m, media))
    client_marks = bool(client.extra.get("cache_marks")) or bool(client.extra.get("header_marks"))
    ours = request.cache_hints and not client_marks
    if ours:  # the client sent no breakpoint: the kernel's (the system and tools are marked below)
        parts = mark_message_breakpoints(parts, request.cache_prefix_messages)
    messages = merge_anthropic_blocks(parts)
    converted = to_anthropic_request([], tools=strategy_tools)
    if client.extra.get("cache_marks") and messages:
        last = messages[-1]["content"][-1]
        messages[-1]["content"][-1] = {**last, "cache_control": dict(EPHEMERAL)}
    body["messages"] = messages
    added = request.system[len(client.system) :].strip() if request.system.startswith(client.system) else request.system
    raw_system = client.body.get("system")
    if added and isinstance(raw_system, list):  # the client's blocks keep their cache_control
        body["system"] = [*raw_system, {"type": "text", "text": added}]
    elif added:
        body["system"] = request.system
    elif raw_system is None:
        body.pop("system", None)
    tools = list(client.raw_tools) + converted["tools"]
    if tools:
        body["tools"] = _marked_last(tools) if ours else tools
    if ours and body.get("system"):
        system = body["system"]
        body["system"] = _marked_last(system if isinstance(system, list) else [{"type": "text", "text": system}])
    if client_marks:
        _within_limit(body, messages)
    body["stream"] = stream
    return body


#: what the upstream call sends (``Upstream.request`` encodes the body)
upstream_payload = upstream_body


def read_reply(payload: Any) -> tuple[Message, dict[str, Any] | None, dict[str, Any]]:
    """``(message, usage, raw)`` of a Messages response; ValueError when it is something else."""
    if not isinstance(payload, dict) or not isinstance(payload.get("content"), list):
        msg = "the upstream reply has no content list"
        raise ValueError(msg)  # every unreadable reply is one kind of error to the caller
    try:
        message = from_anthropic_message({"role": "assistant", "content": payload["content"]}, where="upstream reply")[
            0
        ]
    except EventError as exc:
        raise ValueError(str(exc)) from None
    usage = payload.get("usage")
    return message, usage if isinstance(usage, dict) else None, payload


def raw_calls(raw: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in raw.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool_use"]


def call_name(raw_call: dict[str, Any]) -> str:
    name = raw_call.get("name")
    return name if isinstance(name, str) else ""


def visible_blocks(raw: dict[str, Any], strategy_tools: set[str]) -> list[dict[str, Any]]:
    """The content blocks the client may see: all but strategy ``tool_use`` blocks."""
    return [
        b
        for b in raw.get("content") or []
        if isinstance(b, dict) and not (b.get("type") == "tool_use" and b.get("name") in strategy_tools)
    ]


def client_reply(payload: dict[str, Any], blocks: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
    out = dict(payload)
    out["content"] = blocks
    has_calls = any(b.get("type") == "tool_use" for b in blocks)
    if has_calls:
        out["stop_reason"] = "tool_use"
    elif out.get("stop_reason") == "tool_use":
        out["stop_reason"] = "end_turn"
    if usage is not None:
        out["usage"] = usage
    return out


def client_view(blocks: list[dict[str, Any]]) -> Message:
    return from_anthropic_message({"role": "assistant", "content": blocks}, where="reply")[0]


def error_body(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    del code  # the Messages API's errors carry a type and a message only
    text = f"{param}: {message}" if param and not message.startswith(param) else message
    return {"type": "error", "error": {"type": kind, "message": text}}


def overflow_error(tokens: int, window: int) -> dict[str, Any]:
    return error_body(
        f"prompt is too long: {tokens} tokens > {window} maximum (after ctxkernel's context management; "
        "the profile's strategies could not shrink it further)"
    )


class StreamTranslator:
    """Turns the upstream's events (one or more rounds) into the client's single message stream.

    The client gets one ``message_start`` (the first round's), every text and thinking block as
    it arrives, the client's ``tool_use`` blocks (renumbered), never a strategy's, and one
    ``message_delta`` + ``message_stop`` after the last round.
    """

    def __init__(self, include_usage: bool, strategy_tools: set[str]) -> None:
        del include_usage  # the Messages stream always reports usage
        self.strategy_tools = strategy_tools
        #: the ids the round's tool calls may take (a reused one is renamed before the client sees it)
        self.ids = CallIds()
        #: the model name the client gets when the upstream's is not a name (the one asked for)
        self.model = ""
        self.started = False
        self.next_index = 0  # the client's next block index
        self.blocks: list[dict[str, Any]] = []  # every block the client got, as a reply holds them
        self.usage: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        self.stop_sequence: Any = None
        self.begin_round()

    def begin_round(self) -> None:
        self.round: dict[int, dict[str, Any]] = {}  # upstream index -> block state
        self.round_usage: dict[str, Any] | None = None
        self.round_complete = False  # message_stop seen: the reply is whole

    def feed_event(self, event: str | None, data: dict[str, Any]) -> list[bytes]:
        kind = data.get("type") or event
        out: list[bytes] = []
        state: dict[str, Any] | None
        if kind == "message_start":
            message = obj(data.get("message"))
            self.round_usage = dict(obj(message.get("usage")))
            if not self.started:
                self.started = True
                shown = {**message, "content": [], "model": model_name(message.get("model"), self.model)}
                out.append(sse({"type": "message_start", "message": shown}, "message_start"))
        elif kind == "content_block_start":
            index, block = data.get("index"), data.get("content_block")
            if not isinstance(index, int) or not isinstance(block, dict):
                return out
            if block.get("type") == "tool_use":
                block = {**block, "id": self.ids.claim(block["id"] if isinstance(block.get("id"), str) else "")}
            state = {
                "block": dict(block),
                "parts": [],
                "held": block.get("type") == "tool_use" and block.get("name") in self.strategy_tools,
            }
            self.round[index] = state
            if not state["held"]:
                state["client_index"] = self.next_index
                self.next_index += 1
                out.append(
                    sse(
                        {"type": "content_block_start", "index": state["client_index"], "content_block": block},
                        "content_block_start",
                    )
                )
        elif kind == "content_block_delta":
            index = data.get("index")
            state = self.round.get(index) if isinstance(index, int) else None
            delta = data.get("delta")
            if state is None or not isinstance(delta, dict):
                return out
            state["parts"].append(delta)
            if not state["held"]:
                out.append(
                    sse(
                        {"type": "content_block_delta", "index": state["client_index"], "delta": delta},
                        "content_block_delta",
                    )
                )
        elif kind == "content_block_stop":
            index = data.get("index")
            state = self.round.get(index) if isinstance(index, int) else None
            if state is not None and not state["held"]:
                out.append(sse({"type": "content_block_stop", "index": state["client_index"]}, "content_block_stop"))
                self.blocks.append(_assemble(state))
        elif kind == "message_delta":
            delta = obj(data.get("delta"))
            self.stop_reason = delta.get("stop_reason") or self.stop_reason
            self.stop_sequence = delta.get("stop_sequence")
            if isinstance(data.get("usage"), dict):
                self.round_usage = {**(self.round_usage or {}), **data["usage"]}
        elif kind == "message_stop":
            self.round_complete = True
        elif kind == "ping":
            out.append(sse({"type": "ping"}, "ping"))
        return out

    def end_round(self) -> tuple[list[bytes], Message, dict[str, Any] | None, list[str]]:
        assembled = [_assemble(state) for _, state in sorted(self.round.items())]
        assembled = [b for b in assembled if not (b.get("type") == "text" and not b.get("text"))]
        try:
            message = from_anthropic_message({"role": "assistant", "content": assembled}, where="upstream reply")[0]
        except EventError as exc:
            raise UpstreamError(f"the upstream sent an unreadable reply: {exc}") from None
        names = [c.name for c in message.tool_calls]
        self.usage = add_usage(self.usage, self.round_usage)
        return [], message, self.round_usage, names

    def finish_stream(self) -> list[bytes]:
        has_calls = any(b.get("type") == "tool_use" for b in self.blocks)
        reason = (
            "tool_use"
            if has_calls
            else (self.stop_reason if self.stop_reason not in (None, "tool_use") else "end_turn")
        )
        usage = dict(self.usage or {})
        usage.setdefault("output_tokens", 0)
        return [
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": self.stop_sequence},
                    "usage": usage,
                },
                "message_delta",
            ),
            sse({"type": "message_stop"}, "message_stop"),
        ]

    def error_event(self, message: str, kind: str = "api_error") -> list[bytes]:
        return [sse({"type": "error", "error": {"type": kind, "message": message}}, "error")]

    def passthrough_error(self, error: dict[str, Any]) -> list[bytes]:
        """An error the upstream reported mid-stream, with its type (``overloaded_error`` ...)."""
        return [sse({"type": "error", "error": error}, "error")]

    def client_view(self) -> Message:
        return client_view(self.blocks)


def _assemble(state: dict[str, Any]) -> dict[str, Any]:
    """A content block from its start and deltas, as a non-streamed reply would hold it."""
    block = dict(state["block"])
    for delta in state["parts"]:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = _started(block, "text") + str(delta.get("text", ""))
        elif kind == "thinking_delta":
            block["thinking"] = _started(block, "thinking") + str(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block["signature"] = str(delta.get("signature", ""))
        elif kind == "input_json_delta":
            block["_json"] = _started(block, "_json") + str(delta.get("partial_json", ""))
    if "_json" in block:
        raw = block.pop("_json")
        block["input"] = arguments_from_json(raw) if raw else {}
    return block


def _started(block: dict[str, Any], key: str) -> str:
    """What a block's ``content_block_start`` gave of the text its deltas add to (``""``: none);
    an upstream error when that is no string."""
    value = block.get(key, "")
    if not isinstance(value, str):
        msg = (
            f"the upstream sent an unreadable reply: a {str(block.get('type'))[:50]!r} block started with "
            f"{key} {type(value).__name__}, where its deltas add to a string"
        )
        raise UpstreamError(msg)
    return value
