"""The OpenAI Chat Completions wire format: requests, replies, errors and the SSE stream.

Error shape (what the ``openai`` SDK reads)::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "n", "code": null}}
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from ..convert import _content_text, arguments_from_json, from_openai_message, to_openai_message
from ..errors import EventError
from ..messages import Message, ToolCallBlock
from ..pairing import CallIds
from ..session import Request
from .reconcile import message_hash
from .upstream import Chunks
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

API = "openai"
UPSTREAM_PATH = "/chat/completions"
#: client headers forwarded to the upstream (credentials are handled apart, see upstream.py)
FORWARD_HEADERS = ("openai-organization", "openai-project", "openai-beta")


def _convert(raw: Any, where: str) -> list[Message]:
    message = from_openai_message(raw, where=where)
    return [message] if message is not None else []


def parse_request(raw: bytes, memo: MessageMemo | None = None) -> ClientRequest:
    """A chat-completions body, checked; a 400 names the field that is wrong."""
    memo = MessageMemo() if memo is None else memo
    parsed = memo.parse(b"openai", raw)
    body = parsed.body
    model = check_model(body)
    messages = expect(body, "messages", list, "a list of messages", required=True)
    if not messages:
        raise WireError(400, "messages: at least one message is required", param="messages")
    check_size(parsed)
    check_depth(parsed)
    n = expect(body, "n", int, "an integer")
    if n is not None and n != 1:
        raise WireError(
            400, f"n: only n=1 is supported by ctxkernel serve (one session, one reply), got {n}", param="n"
        )
    stream = expect(body, "stream", bool, "a boolean") or False
    options = expect(body, "stream_options", dict, "an object") or {}
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise WireError(400, "stream_options.include_usage: expected a boolean", param="stream_options.include_usage")
    raw_tools = expect(body, "tools", list, "a list of tools") or []
    check_tools(raw_tools)
    tools = []
    for i, tool in enumerate(raw_tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
        ):
            raise WireError(
                400, f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}", param=f"tools[{i}]"
            )
        tools.append(tool)
    if "functions" in body:
        raise WireError(400, "functions: the legacy functions field is not supported; send tools", param="functions")

    def one(i: int, item: Any) -> tuple[Sequence[Message], Sequence[str], str | None]:
        if isinstance(item, dict) and item.get("role") in ("system", "developer"):
            # the system prompt goes in the request header, not on the surface
            return (), (), _content_text(item.get("content"), f"messages[{i}]")
        found, digests = memo.convert(
            item, lambda m: _convert(m, f"messages[{i}]"), message_hash, api=b"openai", where=f"messages[{i}]"
        )
        return found, digests, None

    try:
        history = memo.convert_history(b"openai", parsed, one)
    except EventError as exc:
        raise WireError(400, f"{exc}", param="messages") from None
    converted, hashes, system_parts = list(history.messages), list(history.hashes), history.system
    system = "\n\n".join(system_parts)
    if not converted or converted[-1].role == "assistant":
        raise WireError(
            400,
            "messages: the last message must be a user or tool message (an assistant prefill is not supported)",
            param="messages",
        )
    # the request's other fields pass through; its messages as the client sent them are not kept
    # past their conversion (as parsed objects they were 8 times the body for tiny messages)
    body = {**body, "messages": []}
    return ClientRequest(API, body, model, system, converted, tools, raw_tools, stream, include_usage, hashes=hashes)


def upstream_body(
    client: ClientRequest,
    request: Request,
    strategy_tools: list[dict[str, Any]],
    *,
    stream: bool,
    cache: dict[Any, Any] | None = None,
) -> bytes:
    """The client's body (JSON bytes) with the managed messages, and the client's tools plus the
    strategy's: :func:`upstream_chunks` joined."""
    return b"".join(upstream_chunks(client, request, strategy_tools, stream=stream, cache=cache))


def upstream_chunks(
    client: ClientRequest,
    request: Request,
    strategy_tools: list[dict[str, Any]],
    *,
    stream: bool,
    cache: dict[Any, Any] | None = None,
) -> Chunks:
    """The upstream body in pieces whose concatenation is :func:`upstream_body`: the rest of the
    client's body, then each message's JSON, each followed by its ``,`` (the last one by the
    body's end), as the upstream call writes them (one ``writev``, no joined copy).

    ``cache`` (one per session) keeps each surface node's wire form as JSON bytes, so an
    unchanged surface is neither converted nor encoded again on every request: only the rest of
    the body is encoded (at 100k tokens, 0.1 ms against 0.3 ms for an ``orjson.dumps`` of the
    whole body; joining the 855 pieces into one body was another 0.05-0.13 ms: ``bench_serve.py``)."""
    body = dict(client.body)
    del body["messages"]
    tools = list(client.raw_tools) + strategy_tools
    if tools:
        body["tools"] = tools
    else:
        body.pop("tools", None)
    key = request.cache_key
    if key is not None and not body.get("prompt_cache_key"):
        # every request of the session reaches the same cache, unless the client chose a key
        body["prompt_cache_key"] = key
    body["stream"] = stream
    if stream:  # always asked for: the usage anchors the session's pressure
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    cache = {} if cache is None else cache
    # the messages' byte total comes with them (kept from the last request, plus the new ones)
    media = client.extra.get("media")
    convert = encoded_item if media is None else (lambda m: orjson.dumps(to_openai_message(m, media=media)) + b",")
    forms = wire_forms(request.seqs, request.messages, cache, convert, measure=len)
    size = forms.size
    if request.system:
        system = _system_item(request.system)
        forms.insert(0, system)
        size += len(system)
    rest = orjson.dumps(body)  # an object with at least "model" and "stream": b'{...}'
    head = rest[:-1] + b',"messages":['
    if not forms:
        return Chunks([head + b"]}"])
    # each piece ends with the "," before the next; the last one's becomes the body's end
    # (``wire_forms`` returns a list of its own)
    forms[-1] = forms[-1][:-1] + b"]}"
    forms.insert(0, head)
    return Chunks(forms, size=size + 1 + len(head))


#: what the upstream call sends: the pieces, written without joining them
upstream_payload = upstream_chunks


def _system_item(system: str) -> bytes:
    return orjson.dumps({"role": "system", "content": system}) + b","


def encoded_item(message: Message) -> bytes:
    """One surface message in the OpenAI wire form, as JSON followed by ``,`` (an item of the
    messages array as :func:`upstream_chunks` writes it)."""
    return encoded_message(message) + b","


def encoded_message(message: Message) -> bytes:
    """One surface message in the OpenAI wire form, as JSON."""
    return orjson.dumps(to_openai_message(message))


def read_reply(payload: Any) -> tuple[Message, dict[str, Any] | None, dict[str, Any]]:
    """``(message, usage, raw message)`` of a chat-completions response; ValueError when the
    upstream sent something else."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        msg = "the upstream reply has no choices[0]"
        raise ValueError(msg)
    raw = choices[0].get("message")
    if not isinstance(raw, dict):
        msg = "the upstream reply has no choices[0].message"
        raise ValueError(msg)  # every unreadable reply is one kind of error to the caller
    try:
        message = from_openai_message({**raw, "role": "assistant"}, where="upstream reply")
    except EventError as exc:
        raise ValueError(str(exc)) from None
    assert message is not None
    usage = payload.get("usage")
    return message, usage if isinstance(usage, dict) else None, raw


def client_reply(
    payload: dict[str, Any], text: str, client_calls: list[dict[str, Any]], usage: dict[str, Any] | None
) -> dict[str, Any]:
    """The response the client gets: the last upstream response with the visible text of every
    round, only the client's tool calls, and the summed usage."""
    out = dict(payload)
    choice = dict(payload["choices"][0])
    message = dict(choice["message"])
    message["content"] = text if text or not client_calls else None
    if client_calls:
        message["tool_calls"] = client_calls
        choice["finish_reason"] = "tool_calls"
    else:
        message.pop("tool_calls", None)
        if choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "stop"
    choice["message"] = message
    out["choices"] = [choice]
    if usage is not None:
        out["usage"] = usage
    return out


def client_view(text: str, client_calls: list[dict[str, Any]]) -> Message:
    """The assistant message as the client holds it (what it will send back)."""
    message = from_openai_message({"role": "assistant", "content": text, "tool_calls": client_calls})
    assert message is not None
    return message


def raw_calls(raw_message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = raw_message.get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def call_name(raw_call: dict[str, Any]) -> str:
    fn = raw_call.get("function")
    return fn.get("name", "") if isinstance(fn, dict) else ""


def error_body(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def overflow_error(tokens: int, window: int) -> dict[str, Any]:
    return error_body(
        f"This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} "
        "tokens after ctxkernel's context management; the profile's strategies could not shrink them further.",
        param="messages",
        code="context_length_exceeded",
    )


class StreamTranslator:
    """Turns the upstream's chunks (one or more rounds) into the client's single stream.

    Text and reasoning deltas go out as they arrive. A tool call is held until its name is
    known; a client tool's deltas then go out (renumbered so the client's calls count from 0),
    a strategy tool's never do. The client's ``finish_reason`` and usage chunk come at the end,
    after the last round.
    """

    def __init__(self, include_usage: bool, strategy_tools: set[str]) -> None:
        self.include_usage = include_usage
        self.strategy_tools = strategy_tools
        #: the ids the round's tool calls may take (a reused one is renamed before the client sees it)
        self.ids = CallIds()
        self.id = f"chatcmpl-ctxkernel-{time.time_ns()}"
        #: the model name the client gets: the upstream's, when it is a name (else the one asked for)
        self.model = ""
        self.created = int(time.time())
        self.fingerprint: Any = None
        self.sent_role = False
        self.text = ""  # every round's visible text, as the client has it
        self.client_calls: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self._first_round = True
        self.begin_round()

    def begin_round(self) -> None:
        self.round_text: list[str] = []
        self.round_reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.round_usage: dict[str, Any] | None = None
        self._separated = not self.text

    @property
    def round_complete(self) -> bool:
        """The upstream said the round is over (a finish reason), not just stopped sending."""
        return self.finish is not None

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        if not self.sent_role:
            delta = {"role": "assistant", **delta}
            self.sent_role = True
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.fingerprint is not None:
            chunk["system_fingerprint"] = self.fingerprint
        return sse(chunk)

    def feed_event(self, event: str | None, data: dict[str, Any]) -> list[bytes]:
        """:meth:`feed` (a Chat Completions stream names no events)."""
        del event
        return self.feed(data)

    def feed(self, data: dict[str, Any]) -> list[bytes]:
        """One upstream chunk in; the bytes to send to the client out."""
        out: list[bytes] = []
        if self._first_round:
            self._first_round = False
            if isinstance(data.get("id"), str):
                self.id = data["id"]
            if isinstance(data.get("created"), int):
                self.created = data["created"]
            self.fingerprint = data.get("system_fingerprint")
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
                self.round_reasoning.append(reasoning)
                out.append(self._chunk({"reasoning_content": reasoning}))
            content = delta.get("content")
            if isinstance(content, str) and content:
                if not self._separated:  # a later round's text starts a new paragraph
                    content = "\n\n" + content
                    self._separated = True
                self.round_text.append(content)
                self.text += content
                out.append(self._chunk({"content": content}))
            calls = delta.get("tool_calls")
            for tc in calls if isinstance(calls, list) else []:
                out.extend(self._tool_delta(tc))
            if isinstance(choice.get("finish_reason"), str):
                self.finish = choice["finish_reason"]
        return out

    def _tool_delta(self, tc: Any) -> list[bytes]:
        if not isinstance(tc, dict) or not isinstance(tc.get("index"), int):
            return []
        index = tc["index"]
        for other, call in self.calls.items():  # a new call starting means earlier names are whole
            if other != index and call["owner"] is None:
                self._decide(call)
        call = self.calls.setdefault(
            index, {"id": "", "name": "", "args": [], "owner": None, "client_index": None, "sent": 0}
        )
        if isinstance(tc.get("id"), str) and call["owner"] is None:
            call["id"] = tc["id"]
        fn = obj(tc.get("function"))
        if isinstance(fn.get("name"), str):
            call["name"] += fn["name"]
        if isinstance(fn.get("arguments"), str):
            call["args"].append(fn["arguments"])
        if call["owner"] is None and call["name"] and call["args"]:
            self._decide(call)
        return self._flush(call)

    def _decide(self, call: dict[str, Any]) -> None:
        call["id"] = self.ids.claim(call["id"])
        call["owner"] = "strategy" if call["name"] in self.strategy_tools else "client"
        if call["owner"] == "client":
            call["client_index"] = len(self.client_calls)
            self.client_calls.append(
                {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": ""}}
            )

    def _flush(self, call: dict[str, Any]) -> list[bytes]:
        if call["owner"] != "client":
            return []
        out = []
        pending = "".join(call["args"][call["sent"] :])
        first = call["sent"] == 0 and not call.get("announced")
        if first:
            call["announced"] = True
            out.append(
                self._chunk(
                    {
                        "tool_calls": [
                            {
                                "index": call["client_index"],
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["name"], "arguments": pending},
                            }
                        ]
                    }
                )
            )
        elif pending:
            out.append(
                self._chunk({"tool_calls": [{"index": call["client_index"], "function": {"arguments": pending}}]})
            )
        call["sent"] = len(call["args"])
        self.client_calls[call["client_index"]]["function"]["arguments"] += pending
        return out

    def end_round(self) -> tuple[list[bytes], Message, dict[str, Any] | None, list[str]]:
        """Close a round: flush held calls now decided; return the bytes still to send, the
        round's whole message (for the log), its usage and the names of its calls."""
        out: list[bytes] = []
        for call in self.calls.values():
            if call["owner"] is None:
                self._decide(call)
            out.extend(self._flush(call))
        blocks = [
            ToolCallBlock(c["id"], c["name"], arguments_from_json("".join(c["args"]))) for c in self.calls.values()
        ]
        # the round's own text, without the separator the client got between rounds
        text = "".join(self.round_text)
        if text.startswith("\n\n") and self.text != text:
            text = text[2:]
        message = Message.assistant(text, blocks, reasoning="".join(self.round_reasoning) or None)
        self.usage = add_usage(self.usage, self.round_usage)
        return out, message, self.round_usage, [c["name"] for c in self.calls.values()]

    def finish_stream(self) -> list[bytes]:
        """The closing chunks: the finish reason, the usage (when asked for) and ``[DONE]``."""
        if self.client_calls:
            reason = "tool_calls"
        else:
            reason = self.finish if self.finish and self.finish != "tool_calls" else "stop"
        out = [self._chunk({}, finish=reason)]
        if self.include_usage:
            out.append(
                sse(
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": self.usage,
                    }
                )
            )
        out.append(b"data: [DONE]\n\n")
        return out

    def error_event(self, message: str, kind: str = "api_error") -> list[bytes]:
        return [sse(error_body(message, kind=kind))]

    def passthrough_error(self, error: dict[str, Any]) -> list[bytes]:
        """An error the upstream reported mid-stream, as it reported it."""
        return [sse({"error": error})]

    def client_view(self) -> Message:
        return client_view(self.text, self.client_calls)
