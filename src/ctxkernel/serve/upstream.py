"""The upstream provider client: one pooled httpx transport with bounds.

The requests go straight to the transport (:class:`httpx.AsyncHTTPTransport`, or the one a
test passes), not through an :class:`httpx.AsyncClient`: what the client adds (a cookie jar,
redirects, auth flows, event hooks) is nothing a proxy wants (a jar shared by every tenant would
replay one provider's cookies to another's requests), and it cost about 0.3 ms of CPU per call
(``bench_serve.py``).

Every call has connect, read and write timeouts and a whole-request deadline (a provider that
trickles bytes forever still ends), and a cap on the response size (a reply larger than
``max_response_bytes`` is an upstream error, never read into memory whole).

Credentials: the client's ``Authorization`` / ``x-api-key`` are forwarded as they came, unless
the server was started with ``--api-key-env VAR``: then the key in ``$VAR`` replaces them. They
are only ever put in the outgoing request's headers: never in a log, an event, a metric or an
error message (any diagnostic output goes through :func:`ctxkernel.redact.redact_headers`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson


class UpstreamError(Exception):
    """The upstream could not be reached or sent something unusable (reported as 502/504)."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class UpstreamResponse:
    status: int
    body: bytes
    headers: httpx.Headers
    seconds: float

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass(frozen=True)
class Limits:
    connect_seconds: float = 10.0
    read_seconds: float = 300.0
    deadline_seconds: float = 600.0
    max_response_bytes: int = 32 * 1024 * 1024
    max_connections: int = 100


class Upstream:
    """POST/GET to a provider base URL with the bounds of :class:`Limits`."""

    def __init__(self, limits: Limits | None = None, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.limits = limits or Limits()
        timeout = httpx.Timeout(self.limits.read_seconds, connect=self.limits.connect_seconds)
        self._extensions = {"timeout": timeout.as_dict()}
        self.transport = transport or httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=self.limits.max_connections, max_keepalive_connections=20),
            trust_env=False,  # a proxy's upstream is what its operator configured, not the environment's
        )

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def _send(self, method: str, url: str, headers: Mapping[str, str], content: bytes | None) -> httpx.Response:
        request = httpx.Request(method, url, headers=dict(headers), content=content, extensions=self._extensions)
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: Any = None) -> UpstreamResponse:
        """One whole request, read to the end (bounded)."""
        started = time.perf_counter()
        content = orjson.dumps(body) if body is not None else None
        try:
            with anyio.fail_after(self.limits.deadline_seconds):
                response = await self._send(method, url, headers, content)
                try:
                    data = await self._read(response)
                finally:
                    await response.aclose()
        except TimeoutError:
            raise UpstreamError(f"the upstream did not answer within {self.limits.deadline_seconds:g} s", 504) from None
        except httpx.TimeoutException as exc:
            raise UpstreamError(f"the upstream timed out ({type(exc).__name__})", 504) from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"the upstream could not be reached: {type(exc).__name__}: {exc}") from None
        return UpstreamResponse(response.status_code, data, response.headers, time.perf_counter() - started)

    async def _read(self, response: httpx.Response) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.limits.max_response_bytes:
                msg = f"the upstream reply exceeds {self.limits.max_response_bytes} bytes"
                raise UpstreamError(msg)
            chunks.append(chunk)
        return b"".join(chunks)

    @asynccontextmanager
    async def stream(self, url: str, headers: Mapping[str, str], body: Any) -> AsyncIterator[StreamHandle]:
        """A streamed POST: ``handle.status``; on success ``handle.lines()``, bounded by the same
        deadline and byte cap; on an error status ``handle.body`` is read (bounded)."""
        started = time.perf_counter()
        try:
            response = await self._send("POST", url, headers, orjson.dumps(body))
        except httpx.TimeoutException as exc:
            raise UpstreamError(f"the upstream timed out ({type(exc).__name__})", 504) from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"the upstream could not be reached: {type(exc).__name__}: {exc}") from None
        handle = StreamHandle(self, response, started)
        try:
            if response.status_code >= 400:
                handle.body = await self._read(response)
            yield handle
        finally:
            await response.aclose()


class StreamHandle:
    def __init__(self, upstream: Upstream, response: httpx.Response, started: float) -> None:
        self.upstream = upstream
        self.response = response
        self.status = response.status_code
        self.headers = response.headers
        self.started = started
        self.body = b""

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    async def lines(self) -> AsyncIterator[str]:
        limits = self.upstream.limits
        deadline = self.started + limits.deadline_seconds
        size = 0
        try:
            async for line in self.response.aiter_lines():
                size += len(line) + 1
                if size > limits.max_response_bytes:
                    msg = f"the upstream stream exceeds {limits.max_response_bytes} bytes"
                    raise UpstreamError(msg)
                if time.perf_counter() > deadline:
                    msg = f"the upstream stream did not end within {limits.deadline_seconds:g} s"
                    raise UpstreamError(msg, 504)
                yield line
        except httpx.TimeoutException as exc:
            raise UpstreamError(f"the upstream stream timed out ({type(exc).__name__})", 504) from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"the upstream stream broke: {type(exc).__name__}: {exc}") from None


def join_url(base: str, path: str) -> str:
    """``base`` + ``path`` without a doubled ``/v1`` (``http://h/v1`` + ``/v1/messages``)."""
    base = base.rstrip("/")
    if path.startswith("/v1/") and base.endswith("/v1"):
        path = path[3:]
    return base + path
