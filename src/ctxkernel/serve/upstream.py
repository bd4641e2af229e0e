"""The upstream provider client: one pooled :class:`aiohttp.ClientSession` with bounds.

aiohttp, not httpx: its HTTP parser and writer are in C, and one call costs about 0.3 ms of CPU
against about 1 ms through httpx's transport at 1k tokens, 0.7 against 1.4 ms at 100k
(``bench_serve.py``), whatever the body. The session is made for what a proxy needs and
nothing else: no cookie jar (:class:`aiohttp.DummyCookieJar`: a jar shared by every tenant would
replay one provider's cookies to another's requests), no redirects followed (a redirect would
carry the client's credentials to another host: the 3xx goes back to the client as it came), no
proxy or credentials from the environment, and no ``User-Agent``, ``Accept`` or
``Accept-Encoding`` of its own, so the upstream sees the headers :meth:`Proxy.upstream_headers`
chose.

Every call has connect and read timeouts and a whole-request deadline (a provider that trickles
bytes forever still ends), and a cap on the response size (a reply larger than
``max_response_bytes`` is an upstream error, never read into memory whole).

Credentials: the client's ``Authorization`` / ``x-api-key`` are forwarded as they came, unless
the server was started with ``--api-key-env VAR``: then the key in ``$VAR`` replaces them. They
are only ever put in the outgoing request's headers: never in a log, an event, a metric or an
error message (any diagnostic output goes through :func:`ctxkernel.redact.redact_headers`).
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from ..jsonbytes import loads
from ..logging import get_logger

#: what ends a line in a stream (as the WHATWG event-stream format reads them)
NEWLINE = re.compile(r"\r\n|\r|\n")
#: headers aiohttp would add of its own accord; the upstream gets only the proxy's
SKIP_AUTO_HEADERS = frozenset({"User-Agent", "Accept", "Accept-Encoding"})

log = get_logger("ctxkernel.serve")


class UpstreamError(Exception):
    """The upstream could not be reached or sent something unusable (reported as 502/504)."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class UpstreamResponse:
    status: int
    body: bytes
    headers: Mapping[str, str]
    seconds: float

    def json(self) -> Any:
        return loads(self.body)


@dataclass(frozen=True)
class Limits:
    connect_seconds: float = 10.0
    read_seconds: float = 300.0
    deadline_seconds: float = 600.0
    max_response_bytes: int = 32 * 1024 * 1024
    max_connections: int = 100
    #: one line of a stream (an SSE ``data:`` line), checked while it is read
    max_line_chars: int = 8 * 1024 * 1024


def encoded(body: Any) -> bytes | Chunks:
    """A request body as bytes: JSON-encoded, unless the wire module composed the bytes (or
    their :class:`Chunks`) itself."""
    return body if isinstance(body, bytes | Chunks) else orjson.dumps(body)


#: a body larger than this is written in pieces (:class:`BodyPayload`), smaller ones in one write
SPLIT_BODY_BYTES = 64 * 1024
#: the bytes of a large ``bytes`` body that go out with the request's headers
HEAD_BYTES = 4096


class Chunks(list[bytes]):
    """A request body as pieces, in order: the body is their concatenation. A wire module gives
    its body so when it has it in pieces already (the OpenAI body: each surface message's cached
    JSON), so that it is never joined into one copy: the pieces go to the socket in one
    ``writev``.

    ``size`` is the body's length when the wire module knows it already (the OpenAI body keeps
    its messages' total from one request to the next): summing the lengths of 855 pieces cost
    about 80 µs a request at 100k tokens (``bench_serve.py``). Without it, :attr:`nbytes` sums
    them (once: a body's pieces are not changed after it is made)."""

    def __init__(self, pieces: Iterable[bytes] = (), size: int | None = None) -> None:
        super().__init__(pieces)
        self._nbytes = size

    @property
    def nbytes(self) -> int:
        """The body's length in bytes: the sum of the pieces' lengths."""
        if self._nbytes is None:
            self._nbytes = sum(map(len, self))
        return self._nbytes


class BodyPayload(aiohttp.payload.Payload):
    """A request body (``bytes`` or :class:`Chunks`) aiohttp sends without copying it first.

    aiohttp writes the request's headers together with the body's first chunk, and on Python
    before 3.12.9 it joins the two into one ``bytes`` before the socket write: a copy of the
    whole body (634 KB at 100k tokens: ``bench_serve.py``), on top of the one that joined the
    body. A large body is written as a small first piece (joined with the headers, as aiohttp
    does) and then the rest as it is: a view of the ``bytes``, or the pieces handed to the
    transport's ``writelines`` (uvloop writes them with one ``writev``, no copy; asyncio's own
    transport joins them first, as aiohttp would have)."""

    def __init__(self, value: bytes | Chunks, **kwargs: Any) -> None:
        super().__init__(value, **kwargs)
        self._length = len(value) if isinstance(value, bytes) else value.nbytes
        self._size = self._length

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.whole().decode(encoding, errors)

    def whole(self) -> bytes:
        value = self._value
        return value if isinstance(value, bytes) else b"".join(value)

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        value = self._value
        size = self._length
        if size <= SPLIT_BODY_BYTES or (content_length is not None and content_length < size):
            whole = self.whole()
            await writer.write(whole if content_length is None else whole[:content_length])
            return
        if isinstance(value, bytes):
            await writer.write(value[:HEAD_BYTES])
            await writer.write(memoryview(value)[HEAD_BYTES:])
            return
        await writer.write(value[0])  # with the headers
        transport = getattr(writer, "transport", None)
        if transport is None or transport.is_closing():
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        transport.writelines(value[1:])
        await writer.drain()


def payload(content: bytes | Chunks | None) -> BodyPayload | None:
    return None if content is None else BodyPayload(content)


def upstream_error(what: str, exc: aiohttp.ClientError) -> UpstreamError:
    """One of aiohttp's errors as :class:`UpstreamError`: a timeout is a 504, the rest a 502."""
    if isinstance(exc, aiohttp.ServerTimeoutError):  # before TimeoutError: it is one too
        return UpstreamError(f"{what} timed out ({type(exc).__name__})", 504)
    return UpstreamError(f"{what} failed: {type(exc).__name__}: {exc}")


@contextmanager
def reported(what: str) -> Iterator[None]:
    """aiohttp's errors as :class:`UpstreamError` (:func:`upstream_error`). The calls made once
    per request catch them in a plain ``try`` instead: a generator-based context manager costs
    a generator and its object on every entry (``bench_serve.py``)."""
    try:
        yield
    except aiohttp.ClientError as exc:
        raise upstream_error(what, exc) from None


class Upstream:
    """POST/GET to a provider base URL with the bounds of :class:`Limits`."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits = limits or Limits()
        self._session: aiohttp.ClientSession | None = None
        # the deadline is aiohttp's own timer over the whole call, reading the reply included
        # (``total``): one timer handle, where a cancel scope of its own cost about 20 µs a call.
        # Built once: the limits are frozen, and a ``ClientTimeout`` is an immutable value
        self._whole = aiohttp.ClientTimeout(
            total=limits.deadline_seconds, sock_connect=limits.connect_seconds, sock_read=limits.read_seconds
        )

    def _client(self) -> aiohttp.ClientSession:
        # made on first use: a session belongs to the event loop it was made in
        if self._session is None:
            limits = self.limits
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=limits.max_connections),
                timeout=aiohttp.ClientTimeout(sock_connect=limits.connect_seconds, sock_read=limits.read_seconds),
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=SKIP_AUTO_HEADERS,
                trust_env=False,  # a proxy's upstream is what its operator configured, not the environment's
            )
        return self._session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        content: bytes | Chunks | None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        client = self._client()
        for retry in (False, True):
            try:
                return await client.request(
                    method, url, headers=dict(headers), data=payload(content), allow_redirects=False, timeout=timeout
                )
            except aiohttp.ClientConnectorError as exc:
                raise UpstreamError(f"the upstream could not be reached: {type(exc).__name__}: {exc}") from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionResetError) as exc:
                # the connection dropped before any reply: most often a pooled connection the
                # upstream closed for idleness as we wrote on it (uvicorn keeps one 5 s, the
                # pool 15 s). Sent once more on a fresh connection, as the official SDKs retry
                # a connection error; a second drop is the upstream's answer
                if retry:
                    raise upstream_error("the upstream call", exc) from None
                log.info("upstream connection dropped before a reply; sending once more", error=type(exc).__name__)
            except aiohttp.ClientError as exc:
                raise upstream_error("the upstream call", exc) from None
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: Any = None) -> UpstreamResponse:
        """One whole request, read to the end (bounded)."""
        started = time.perf_counter()
        content = encoded(body) if body is not None else None
        try:
            response = await self._send(method, url, headers, content, self._whole)
            try:
                data = await self._read(response)
            finally:
                response.release()
        except TimeoutError:
            raise UpstreamError(f"the upstream did not answer within {self.limits.deadline_seconds:g} s", 504) from None
        return UpstreamResponse(response.status, data, response.headers, time.perf_counter() - started)

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        cap = self.limits.max_response_bytes
        too_large = UpstreamError(f"the upstream reply exceeds {cap} bytes")
        if response.content_length is not None and response.content_length > cap:
            response.close()
            raise too_large
        chunks: list[bytes] = []
        size = 0
        content = response.content
        try:
            # ``readany`` in a loop: ``iter_any``'s iterator object and its ``__anext__`` cost
            # a layer per chunk, for nothing the loop needs
            while chunk := await content.readany():
                size += len(chunk)
                if size > cap:
                    response.close()
                    raise too_large
                chunks.append(chunk)
        except aiohttp.ClientError as exc:
            raise upstream_error("reading the upstream reply", exc) from None
        return b"".join(chunks)

    @asynccontextmanager
    async def stream(self, url: str, headers: Mapping[str, str], body: Any) -> AsyncIterator[StreamHandle]:
        """A streamed POST: ``handle.status``; on success ``handle.lines()``, bounded by the same
        deadline and byte cap; on an error or redirect status ``handle.body`` is read (bounded).
        The whole call, from connecting to the stream's last byte (or the error body's), is
        under the deadline: aiohttp's timer cancels whatever read is waiting when it passes."""
        started = time.perf_counter()
        try:
            response = await self._send("POST", url, headers, encoded(body), self._whole)
        except TimeoutError:
            raise UpstreamError(f"the upstream did not answer within {self.limits.deadline_seconds:g} s", 504) from None
        handle = StreamHandle(self, response, started)
        try:
            if response.status >= 300:
                try:
                    handle.body = await self._read(response)
                except TimeoutError:
                    msg = f"the upstream's error body did not end within {self.limits.deadline_seconds:g} s"
                    raise UpstreamError(msg, 504) from None
            yield handle
        finally:
            # a stream not read to its end (a client that went away) closes its connection
            # rather than returning it to the pool with a reply still arriving on it
            if response.content.at_eof():
                response.release()
            else:
                response.close()


class StreamHandle:
    def __init__(self, upstream: Upstream, response: aiohttp.ClientResponse, started: float) -> None:
        self.upstream = upstream
        self.response = response
        self.status = response.status
        self.headers = response.headers
        self.started = started
        self.body = b""

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    async def lines(self) -> AsyncIterator[str]:
        """The stream's lines (UTF-8, undecodable bytes replaced), without their line ends."""
        limits = self.upstream.limits
        deadline = self.started + limits.deadline_seconds
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        size = 0
        with reported("the upstream stream"):
            try:
                async for chunk in self.response.content.iter_any():
                    size += len(chunk)
                    if size > limits.max_response_bytes:
                        msg = f"the upstream stream exceeds {limits.max_response_bytes} bytes"
                        raise UpstreamError(msg)
                    if time.perf_counter() > deadline:
                        msg = f"the upstream stream did not end within {limits.deadline_seconds:g} s"
                        raise UpstreamError(msg, 504)
                    text = pending + decoder.decode(chunk)
                    # a closing "\r" may be the first half of a "\r\n" still to come
                    held = "\r" if text.endswith("\r") else ""
                    lines = NEWLINE.split(text[: len(text) - len(held)])
                    pending = lines.pop() + held
                    if len(pending) > limits.max_line_chars:  # checked as it grows, not once it ends
                        msg = f"the upstream sent a stream line of more than {limits.max_line_chars} characters"
                        raise UpstreamError(msg)
                    for line in lines:
                        yield line
            except TimeoutError as exc:  # aiohttp's timer of the whole call (Upstream._whole)
                if isinstance(exc, aiohttp.ClientError):  # its read timeout: silence, not the deadline
                    raise upstream_error("the upstream stream", exc) from None
                msg = f"the upstream stream did not end within {limits.deadline_seconds:g} s"
                raise UpstreamError(msg, 504) from None
        lines = NEWLINE.split(pending + decoder.decode(b"", final=True))
        if lines[-1] == "":
            lines.pop()
        for line in lines:
            yield line


def join_url(base: str, path: str) -> str:
    """``base`` + ``path`` without a doubled ``/v1`` (``http://h/v1`` + ``/v1/messages``)."""
    base = base.rstrip("/")
    if path.startswith("/v1/") and base.endswith("/v1"):
        path = path[3:]
    return base + path
