"""The HTTP side of ``serve``: one handler per route, answering in each API's own shapes.

A chat request (``/v1/chat/completions``, ``/v1/messages``): read the body (bounded in size and
time), parse and check it (400 in the API's error shape, naming the field), find its session key
and tenant (``identity.py``), take the session's turn and open it through the proxy's turn API
(``proxy.py``), then call the upstream round by round (non-streamed, or streamed straight
through to the client) until the proxy says the client request is answered. Context decisions
are the proxy's (the Session API's); this module only speaks HTTP, the wire formats and the
upstream.

A client that goes away is noticed while its request waits for its turn, for the upstream or
for the next streamed event: the upstream call is cut, the uncommitted reply dropped, its step
closed ``interrupted`` and the session's turn given back at once.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import anyio
import anyio.lowlevel
import orjson
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse

from ..errors import HeaderTooLargeError
from ..jsonbytes import loads
from ..logging import get_logger
from ..pairing import claim_raw_calls, renamed_calls
from ..redact import Scrubber
from . import anthropic_wire, openai_wire, responses_wire
from .identity import SESSION_HEADER, Identity, identify
from .proxy import Lease, Overflow, Proxy, StreamedError, Turn, stream_error
from .upstream import UpstreamError, join_url
from .wire import MAX_BODY_BYTES, Translator, WireError, check_reply, iter_sse, model_name
from .workers import run_sync

log = get_logger("ctxkernel.serve")

#: a stream hands the event loop to other requests at least this often (seconds): events that
#: arrive faster than they are translated would otherwise never let it go
YIELD_SECONDS = 0.005


class JSONBody(Response):
    """A JSON response encoded by orjson, straight to bytes (Starlette's ``JSONResponse`` goes
    through the standard library's encoder and a ``str``)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class WatchedStream(StreamingResponse):
    """A streamed response that stops (cancelling its body's generator) as soon as the client
    goes away, whichever ASGI version the server speaks: with 2.4 Starlette only notices when a
    write fails, and a stream waiting on a silent upstream writes nothing."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async with anyio.create_task_group() as group:

            async def until_done(run: Callable[[], Awaitable[None]]) -> None:
                await run()
                group.cancel_scope.cancel()

            group.start_soon(until_done, partial(self.stream_response, send))
            await until_done(partial(self.listen_for_disconnect, receive))


def error_response(wire: Any, error: WireError) -> JSONBody:
    headers = {"connection": "close"} if error.status in (408, 413) else None  # the rest of the body is not read
    return JSONBody(
        wire.error_body(error.message, kind=error.kind, param=error.param, code=error.code),
        status_code=error.status,
        headers=headers,
    )


#: an upstream error's headers that tell a client whether and when to retry, passed on as they came
RETRY_HEADERS = ("retry-after", "retry-after-ms", "x-should-retry")


def unsendable(status: int) -> bool:
    """Whether an upstream status cannot be passed to the client as it came: no body may follow
    it (204, 304), or HTTP has no such status (below 200 or over 599)."""
    return status in (204, 304) or not 200 <= status <= 599


def unsendable_error(wire: Any, status: int) -> JSONBody:
    """The 502 for an upstream status :func:`unsendable` (passed on, the server would refuse to
    send it and drop the connection)."""
    msg = f"the upstream answered HTTP {status}, a status ctxkernel serve cannot pass on (200-599 but 204 and 304)"
    return JSONBody(wire.error_body(msg, kind="api_error"), status_code=502)


def passthrough_error(wire: Any, status: int, body: bytes, headers: Any = None) -> Response:
    """An upstream error or redirect for the client: its status, its body when that is JSON,
    else our shape; its retry headers (:data:`RETRY_HEADERS`) as they came, and a redirect's
    ``location`` (the client decides whether its credentials follow it: serve never does).
    A status the client cannot be given is a 502 naming it (:func:`unsendable`)."""
    if unsendable(status):
        return unsendable_error(wire, status)
    extra = {}
    for name in (*RETRY_HEADERS, "location") if headers is not None else ():
        if name in headers:
            extra[name] = headers[name] if name == "location" else headers[name][:200]
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace")[:500] or f"HTTP {status}"
        return JSONBody(wire.error_body(f"upstream error: {text}", kind="api_error"), status_code=status, headers=extra)
    return Response(body, status_code=status, media_type="application/json", headers=extra)


async def read_body(request: HTTPRequest, seconds: float) -> bytes:
    """The request body: at most :data:`MAX_BODY_BYTES` (413), all of it within ``seconds``
    (408: a body trickled in a byte at a time would hold its connection forever)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise WireError(
            413, f"the request body has {length} bytes; the limit is {MAX_BODY_BYTES}", kind="request_too_large"
        )
    chunks, size = [], 0
    with anyio.move_on_after(seconds) as timer:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise WireError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", kind="request_too_large")
            chunks.append(chunk)
    if timer.cancelled_caught:
        msg = f"the request body did not arrive within {seconds:g} s ({size} bytes came); send it at once"
        raise WireError(408, msg, kind="request_timeout")
    return b"".join(chunks)


class ClientGone(Exception):  # an event, not a fault of ours
    """The client closed its connection before its answer was ready."""


class Handler:
    """The HTTP side: one method per route, each in the API's own shapes."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def chat_completions(self, request: HTTPRequest) -> Response:
        return await self._handle(openai_wire, "/v1/chat/completions", request)

    async def messages(self, request: HTTPRequest) -> Response:
        return await self._handle(anthropic_wire, "/v1/messages", request)

    async def responses(self, request: HTTPRequest) -> Response:
        return await self._handle(responses_wire, "/v1/responses", request)

    async def count_tokens(self, request: HTTPRequest) -> Response:
        """``POST /v1/messages/count_tokens``: the tokens serve would send for this request: the
        session's managed surface (its strategies' header included) plus the messages it has not
        seen; at most the effective window, which serve never exceeds upstream."""
        proxy = self.proxy
        metrics = proxy.metrics
        wire = anthropic_wire
        try:
            raw = await read_body(request, proxy.config.body_seconds)
            client = anthropic_wire.parse_request(raw, proxy.memo, count_only=True)
            identity = identify(
                request.headers, wire.API, client.system, client.messages, proxy.tenant(request.headers)
            )
            tokens = await run_sync(proxy.count_tokens, identity, client)
            response: Response = JSONBody({"input_tokens": tokens})
        except WireError as error:
            metrics.child(metrics.errors, "bad_request").inc()
            response = error_response(wire, error)
        except Exception as exc:  # reported to the client in its API's shape, and logged
            response = self._internal_error(wire, "/v1/messages/count_tokens", request, exc)
        metrics.child(metrics.requests, "/v1/messages/count_tokens", str(response.status_code)).inc()
        return response

    def _internal_error(self, wire: Any, route: str, request: HTTPRequest, exc: Exception) -> Response:
        """A 500 for a failure of ours (:meth:`_internal`)."""
        return JSONBody(wire.error_body(self._internal(route, request, exc), kind="api_error"), status_code=500)

    def _internal(self, route: str, request: HTTPRequest, exc: Exception) -> str:
        """A failure of ours, logged with its traceback and counted; what the client is told. The
        request's credentials are taken out of both (an exception's text may hold anything the
        request carried)."""
        scrub = Scrubber(self._secrets(request))
        what = scrub.text(f"{type(exc).__name__}: {exc}")
        trace = scrub.text("".join(traceback.format_exception(exc)))
        log.error("serve: request failed", route=route, error=what[:500], exception=trace)
        self.proxy.metrics.child(self.proxy.metrics.errors, "internal").inc()
        return f"ctxkernel serve: internal error: {what}"[:1000]

    def _secrets(self, request: HTTPRequest) -> tuple[str | None, ...]:
        headers = request.headers
        return (headers.get("authorization"), headers.get("x-api-key"), self.proxy.server_key)

    async def _handle(self, wire: Any, route: str, request: HTTPRequest) -> Response:
        metrics = self.proxy.metrics
        try:
            response = await self._serve(wire, request)
        except WireError as error:
            metrics.child(metrics.errors, "busy" if error.status == 409 else "bad_request").inc()
            response = error_response(wire, error)
        except ClientGone:
            metrics.child(metrics.errors, "client_disconnected").inc()
            response = Response(status_code=499)  # nobody reads it: the connection is gone
        except Exception as exc:  # reported to the client in its API's shape, and logged
            response = self._internal_error(wire, route, request, exc)
        metrics.child(metrics.requests, route, str(response.status_code)).inc()
        return response

    async def _serve(self, wire: Any, request: HTTPRequest) -> Response:
        proxy = self.proxy
        raw = await read_body(request, proxy.config.body_seconds)
        known_key = None
        tenant = proxy.tenant(request.headers)
        if wire is responses_wire:
            parsed = responses_wire.load_body(raw, proxy.memo)
            previous = parsed.body.get("previous_response_id")
            kept = earlier = None
            if previous is not None:
                if not isinstance(previous, str):
                    raise WireError(400, "previous_response_id: expected a string", param="previous_response_id")
                kept, earlier = await run_sync(proxy.earlier_items, previous, tenant)
                known_key = kept.key
            client = responses_wire.parse_request(
                parsed, proxy.memo, earlier=earlier, upstream=proxy.responses_upstream_kind
            )
            client.extra.update(owner=tenant, kept=kept)
        else:
            client = wire.parse_request(raw, proxy.memo)
        client.extra["media"] = proxy.media_bytes
        identity = identify(request.headers, wire.API, client.system, client.messages, tenant)
        if known_key is not None and SESSION_HEADER not in request.headers:
            identity = Identity(known_key, identity.tenant)
        # from here on the client going away cuts whatever the request waits for
        watch = anyio.CancelScope()
        watcher = asyncio.get_running_loop().create_task(_cancel_on_disconnect(request, watch))
        lease: Lease | None = None
        turn: Turn | None = None
        try:
            with watch:
                lease, turn = await proxy.open_turn(wire, identity, client, self._secrets(request))
                if wire is responses_wire:
                    turn.response_id = responses_wire.new_id("resp")
                if client.stream:
                    response = await self._stream(turn, request, lease)
                    if isinstance(response, StreamingResponse):
                        lease = None  # the stream gives it back when it ends
                    return response
                return await self._complete(turn, request)
            if turn is not None:  # gone mid-request: nothing half-done stays in the log
                await proxy.abandon(turn)
            raise ClientGone
        finally:
            watcher.cancel()
            if lease is not None:
                await lease.release()

    # -- non-streaming -------------------------------------------------------------------------------------
    async def _complete(self, turn: Turn, request: HTTPRequest) -> Response:
        proxy, wire = self.proxy, turn.wire
        url = proxy.upstream_url(wire)
        headers = proxy.upstream_headers(wire, request.headers, stream=False)
        text_parts: list[str] = []
        blocks: list[dict[str, Any]] = []
        client_calls: list[dict[str, Any]] = []
        output: list[dict[str, Any]] = []  # the Responses API's client items
        created = time.time()
        while True:
            try:
                prepared = await proxy.request_for(turn)
            except Overflow as over:
                proxy.metrics.child(proxy.metrics.errors, "window_refused").inc()
                return JSONBody(wire.overflow_error(over.tokens, over.window), status_code=400)
            except HeaderTooLargeError as exc:
                proxy.metrics.child(proxy.metrics.errors, "header_refused").inc()
                return JSONBody(wire.error_body(f"ctxkernel serve: {exc}", param="tools"), status_code=400)
            body = wire.upstream_payload(
                turn.client, prepared, turn.strategy_schemas, stream=False, cache=turn.wire_cache
            )
            try:
                answer = await proxy.upstream.request("POST", url, headers, body)
            except UpstreamError as exc:
                await proxy.failed(turn, str(exc))
                proxy.metrics.child(proxy.metrics.errors, "upstream_unreachable").inc()
                return JSONBody(wire.error_body(turn.scrubber.text(str(exc)), kind="api_error"), status_code=exc.status)
            proxy.metrics.child(proxy.metrics.upstream_latency, wire.API).observe(answer.seconds)
            if answer.status >= 300:  # an error, or a redirect serve does not follow
                if await proxy.upstream_failed(turn, answer.status, answer.body, url):
                    continue
                return passthrough_error(wire, answer.status, turn.scrubber.bytes(answer.body), answer.headers)
            try:
                payload = answer.json()
                if wire is responses_wire:
                    message, usage, raw = responses_wire.read_reply(payload, turn.client.extra["upstream"])
                else:
                    message, usage, raw = wire.read_reply(payload)
                check_reply(message)
            except ValueError as exc:
                await proxy.failed(turn, f"unreadable upstream reply: {exc}")
                proxy.metrics.child(proxy.metrics.errors, "upstream_unreadable").inc()
                return JSONBody(
                    wire.error_body(f"the upstream sent an unreadable reply: {exc}"[:1000], kind="api_error"),
                    status_code=502,
                )
            if wire is responses_wire:
                renames = responses_wire.claim_calls(raw, turn.client.extra["upstream"], turn.call_ids())
            else:
                renames = claim_raw_calls(wire.raw_calls(raw), turn.call_ids())
            if renames:  # a provider that reused a call id: the client and the log get fresh ones
                message = renamed_calls(message, renames)
            proxy.count_usage(turn, usage)
            names = turn.strategy_tools
            if wire is openai_wire:
                content = raw.get("content")
                if isinstance(content, str) and content:
                    text_parts.append(content)
                client_calls += [c for c in openai_wire.raw_calls(raw) if openai_wire.call_name(c) not in names]
                view = openai_wire.client_view("\n\n".join(text_parts), client_calls)
            elif wire is responses_wire:
                if turn.client.extra["upstream"] == responses_wire.CHAT:
                    output += responses_wire.chat_output_items(raw, names, turn.client.extra["custom"])
                else:
                    output += responses_wire.visible_items(raw.get("output") or [], names)
                view = responses_wire.client_view(output)
            else:
                blocks += anthropic_wire.visible_blocks(raw, names)
                view = anthropic_wire.client_view(blocks)
            await proxy.commit(turn, message, usage, view)
            if turn.done:
                break
        proxy.finish(turn)
        if wire is openai_wire:
            out = openai_wire.client_reply(payload, "\n\n".join(text_parts), client_calls, turn.usage)
        elif wire is responses_wire:
            base = None
            if turn.client.extra["upstream"] == responses_wire.RESPONSES:
                base = {k: v for k, v in payload.items() if k not in ("output", "usage", "previous_response_id")}
            out = responses_wire.response_object(
                turn.client, output, turn.usage, response_id=turn.response_id, created=created, base=base
            )
            await run_sync(proxy.remember_response, turn, output)
        else:
            out = anthropic_wire.client_reply(payload, blocks, turn.usage)
        if "model" in out:
            out["model"] = model_name(out["model"], turn.client.model)
        return JSONBody(
            out, headers={"x-ctxkernel-session": turn.session.id, "x-ctxkernel-upstream-calls": str(turn.rounds + 1)}
        )

    # -- streaming ------------------------------------------------------------------------------------------
    async def _open_round(self, turn: Turn, request: HTTPRequest, stack: AsyncExitStack) -> Any:
        """Prepare and open one streamed upstream call; returns the stream handle, or
        ``(status, body, headers)`` describing why there is none."""
        proxy, wire = self.proxy, turn.wire
        url = proxy.upstream_url(wire)
        headers = proxy.upstream_headers(wire, request.headers, stream=True)
        while True:
            try:
                prepared = await proxy.request_for(turn)
            except Overflow as over:
                proxy.metrics.child(proxy.metrics.errors, "window_refused").inc()
                return (400, orjson.dumps(wire.overflow_error(over.tokens, over.window)), None)
            except HeaderTooLargeError as exc:
                proxy.metrics.child(proxy.metrics.errors, "header_refused").inc()
                return (400, orjson.dumps(wire.error_body(f"ctxkernel serve: {exc}", param="tools")), None)
            body = wire.upstream_payload(
                turn.client, prepared, turn.strategy_schemas, stream=True, cache=turn.wire_cache
            )
            try:
                handle = await stack.enter_async_context(proxy.upstream.stream(url, headers, body))
            except UpstreamError as exc:
                await proxy.failed(turn, str(exc))
                proxy.metrics.child(proxy.metrics.errors, "upstream_unreachable").inc()
                text = turn.scrubber.text(str(exc))
                return (exc.status, orjson.dumps(wire.error_body(text, kind="api_error")), None)
            if handle.status < 300:
                return handle
            status, error_body, error_headers = handle.status, handle.body, handle.headers
            await stack.aclose()
            if await proxy.upstream_failed(turn, status, error_body, url):
                continue
            return (status, turn.scrubber.bytes(error_body), error_headers)

    # over the complexity cap: one streamed round from open to close, with its error, cancel and
    # client-gone paths side by side so every one releases the round the same way
    async def _stream(self, turn: Turn, request: HTTPRequest, lease: Lease) -> Response:  # noqa: C901
        proxy, wire = self.proxy, turn.wire
        stack = AsyncExitStack()
        try:
            opened = await self._open_round(turn, request, stack)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
            raise
        if isinstance(opened, tuple):
            await stack.aclose()
            return passthrough_error(wire, *opened)
        translator: Translator
        responses: responses_wire.StreamTranslator | None = None
        if wire is responses_wire:
            translator = responses = responses_wire.StreamTranslator(
                turn.client, turn.strategy_tools, response_id=turn.response_id
            )
        else:
            translator = wire.StreamTranslator(turn.client.include_usage, turn.strategy_tools)
        translator.model = turn.client.model

        async def pump() -> Any:  # noqa: C901
            handle = opened
            committed = True
            internal = False
            try:
                while True:
                    translator.strategy_tools = turn.strategy_tools
                    translator.begin_round()
                    translator.ids = turn.call_ids()
                    committed = False
                    handed = time.monotonic()
                    async for event in iter_sse(handle.lines()):
                        if event.data == "[DONE]":
                            break
                        now = time.monotonic()
                        if now - handed > YIELD_SECONDS:  # let the other requests of the process run
                            await anyio.lowlevel.checkpoint()
                            handed = now
                        try:
                            data = loads(event.data)
                        except orjson.JSONDecodeError:
                            raise UpstreamError("the upstream stream sent an event that is not JSON") from None
                        if not isinstance(data, dict):
                            continue
                        error = stream_error(wire, translator, data)
                        if error is not None:
                            raise StreamedError(error, turn.scrubber)
                        for chunk in translator.feed_event(event.event, data):
                            yield chunk
                    if not translator.round_complete:  # a cut connection is not a reply
                        raise UpstreamError("the upstream stream ended before the reply was complete")
                    proxy.metrics.child(proxy.metrics.upstream_latency, wire.API).observe(handle.seconds)
                    await stack.aclose()
                    out, message, usage, _ = translator.end_round()
                    try:
                        check_reply(message)
                    except ValueError as exc:
                        raise UpstreamError(f"the upstream sent an unreadable reply: {exc}") from None
                    for chunk in out:
                        yield chunk
                    proxy.count_usage(turn, usage)
                    await proxy.commit(turn, message, usage, translator.client_view)
                    committed = True
                    if turn.done:
                        break
                    opened_next = await self._open_round(turn, request, stack)
                    if isinstance(opened_next, tuple):
                        status, body, _ = opened_next
                        for chunk in translator.error_event(
                            f"upstream error (HTTP {status}): {body.decode('utf-8', 'replace')[:500]}"
                        ):
                            yield chunk
                        return
                    handle = opened_next
                if responses is not None:
                    await run_sync(proxy.remember_response, turn, responses.output)
                for chunk in translator.finish_stream():
                    yield chunk
                proxy.finish(turn)
            except (UpstreamError, ValueError) as exc:  # ValueError: iter_sse's line limit
                proxy.metrics.child(proxy.metrics.errors, "upstream_stream").inc()
                if not committed:
                    with anyio.CancelScope(shield=True):
                        await proxy.failed(turn, str(exc))
                    committed = True
                # an error the upstream reported keeps its type (an overloaded_error stays one)
                chunks = (
                    translator.passthrough_error(turn.scrubber.error(exc.error))
                    if isinstance(exc, StreamedError)
                    else translator.error_event(turn.scrubber.text(str(exc)))
                )
                for chunk in chunks:
                    yield chunk
            except Exception as exc:  # a failure of ours: an error event (unstreamed, a 500), and logged
                internal = True
                for chunk in translator.error_event(self._internal(request.url.path, request, exc)):
                    yield chunk
            finally:
                # a client that went away mid-stream (or a failure of ours): the uncommitted reply
                # is dropped and its step closed, so the log holds no half reply and no split pair
                with anyio.CancelScope(shield=True):
                    if not committed:
                        if not internal:
                            proxy.metrics.child(proxy.metrics.errors, "client_disconnected").inc()
                        await proxy.abandon(turn)
                    await stack.aclose()
                    await lease.release()

        return WatchedStream(
            pump(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-ctxkernel-session": turn.session.id},
        )

    # -- the rest ---------------------------------------------------------------------------------------------
    async def models(self, request: HTTPRequest) -> Response:
        proxy = self.proxy
        anthropic = "x-api-key" in request.headers or "anthropic-version" in request.headers
        wire = anthropic_wire if anthropic else openai_wire
        base = proxy.anthropic_base if anthropic else proxy.openai_base
        url = join_url(base, "/v1/models" if anthropic else "/models")
        headers = proxy.upstream_headers(wire, request.headers, stream=False)
        headers.pop("content-type", None)
        scrub = Scrubber(self._secrets(request))
        try:
            answer = await proxy.upstream.request("GET", url, headers)
        except UpstreamError as exc:
            response: Response = JSONBody(
                wire.error_body(scrub.text(str(exc)), kind="api_error"), status_code=exc.status
            )
        else:
            if unsendable(answer.status):
                response = unsendable_error(wire, answer.status)
            else:
                response = Response(scrub.bytes(answer.body), status_code=answer.status, media_type="application/json")
        proxy.metrics.child(proxy.metrics.requests, "/v1/models", str(response.status_code)).inc()
        return response

    async def healthz(self, request: HTTPRequest) -> Response:
        kernel = self.proxy.kernel
        return JSONBody({"status": "ok", "profile": kernel.profile.name, "store": kernel.store.backend})

    async def metrics(self, request: HTTPRequest) -> Response:
        body, content_type = self.proxy.metrics.render()
        return Response(body, media_type=content_type)


async def _cancel_on_disconnect(request: HTTPRequest, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` when the client disconnects (the body is read: the next message the
    server gives is the disconnect, or none until the response is sent)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
