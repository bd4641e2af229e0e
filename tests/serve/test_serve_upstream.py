"""The upstream client against a hostile provider on loopback: it keeps no cookies, follows no
redirect, adds no header of its own, caps the reply's size, ends a call at its deadline, and
reads a stream's lines whatever their line ends and however the bytes are split."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel.serve.upstream import Limits, Upstream, UpstreamError

Scope = dict[str, Any]


def provider(seen: list[tuple[str, dict[str, str]]], stream_chunks: list[bytes] | None = None) -> Any:
    """A plain ASGI provider: ``/cookie`` sets a cookie, ``/redirect`` answers 307 to
    ``/elsewhere``, ``/big`` and ``/big-chunked`` answer 2,000 bytes (with and without a
    length), ``/trickle`` sends a byte every 50 ms forever, ``/stream`` sends ``stream_chunks``."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append((scope["path"], {k.decode(): v.decode() for k, v in scope["headers"]}))
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        path = scope["path"]
        status, headers, chunks = 200, [(b"content-type", b"application/json")], [b'{"ok": true}']
        if path == "/cookie":
            headers.append((b"set-cookie", b"tenant=a; Path=/"))
        elif path == "/redirect":
            status, headers, chunks = 307, [(b"location", b"/elsewhere")], [b""]
        elif path == "/big":
            chunks = [b"x" * 2000]
            headers.append((b"content-length", b"2000"))
        elif path == "/big-chunked":
            chunks = [b"x" * 100] * 20
        elif path == "/stream":
            chunks = stream_chunks or []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if path == "/trickle":
            while True:
                await send({"type": "http.response.body", "body": b" ", "more_body": True})
                await anyio.sleep(0.05)
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def call(upstream: Upstream, url: str, headers: dict[str, str] | None = None) -> Any:
    async def run() -> Any:
        try:
            return await upstream.request("POST", url, headers or {}, {"model": "m"})
        finally:
            await upstream.aclose()

    return anyio.run(run)


def test_one_tenants_upstream_cookies_never_reach_another_tenants_request(on_loopback):
    # no cookie jar shared by every client of serve: a provider's cookie for one tenant would
    # be replayed to the next
    seen: list[tuple[str, dict[str, str]]] = []
    base = on_loopback(provider(seen))

    async def two_calls() -> None:
        upstream = Upstream()
        try:
            for key in ("key-a", "key-b"):
                answer = await upstream.request("POST", f"{base}/cookie", {"authorization": f"Bearer {key}"}, {})
                assert answer.status == 200
        finally:
            await upstream.aclose()

    anyio.run(two_calls)
    assert [h.get("authorization") for _, h in seen] == ["Bearer key-a", "Bearer key-b"]
    assert "cookie" not in seen[1][1]


def test_the_upstream_sees_only_the_headers_the_proxy_chose(on_loopback):
    seen: list[tuple[str, dict[str, str]]] = []
    base = on_loopback(provider(seen))
    call(Upstream(), f"{base}/ok", {"content-type": "application/json", "authorization": "Bearer k"})
    (_, headers), *_ = seen
    assert set(headers) == {"host", "content-type", "content-length", "authorization"}


def test_a_redirect_is_not_followed(on_loopback):
    # following it would carry the client's credentials to wherever the provider points
    seen: list[tuple[str, dict[str, str]]] = []
    base = on_loopback(provider(seen))
    answer = call(Upstream(), f"{base}/redirect", {"authorization": "Bearer k"})
    assert answer.status == 307
    assert [path for path, _ in seen] == ["/redirect"]


@pytest.mark.parametrize("path", ["/big", "/big-chunked"])
def test_a_reply_over_the_cap_is_an_upstream_error(on_loopback, path):
    base = on_loopback(provider([]))
    assert call(Upstream(Limits(max_response_bytes=2000)), f"{base}{path}").body == b"x" * 2000
    with pytest.raises(UpstreamError, match="exceeds 1999 bytes") as info:
        call(Upstream(Limits(max_response_bytes=1999)), f"{base}{path}")
    assert info.value.status == 502


def test_a_trickling_provider_ends_at_the_deadline(on_loopback):
    base = on_loopback(provider([]))
    with pytest.raises(UpstreamError, match=r"did not answer within 0\.5 s") as info:
        call(Upstream(Limits(deadline_seconds=0.5)), f"{base}/trickle")
    assert info.value.status == 504


def test_an_unreachable_upstream_is_a_502():
    with pytest.raises(UpstreamError, match="could not be reached") as info:
        call(Upstream(Limits(connect_seconds=2)), "http://127.0.0.1:9/v1/chat/completions")
    assert info.value.status == 502


LINE = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=25, deadline=None)
@given(
    lines=st.lists(LINE, min_size=1, max_size=8),
    ends=st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=8, max_size=8),
    cuts=st.lists(st.integers(1, 400), max_size=6),
)
def test_stream_lines_survive_any_split_and_any_line_end(lines, ends, cuts):
    # the provider's bytes arrive in arbitrary pieces (inside a "\r\n", inside a UTF-8
    # character): the lines read are the lines sent
    raw = "".join(line + end for line, end in zip(lines, ends, strict=False)).encode()
    pieces, at = [], 0
    for cut in sorted(set(cuts)):
        if at < cut < len(raw):
            pieces.append(raw[at:cut])
            at = cut
    pieces.append(raw[at:])
    got = anyio.run(read_stream, pieces)
    # a lone "\r" followed by "\n" from the next line end reads as one line end, as in any
    # event-stream reader: compare with what the joined text splits into
    from ctxkernel.serve.upstream import NEWLINE

    expected = NEWLINE.split(raw.decode())
    assert got == expected[:-1]


async def read_stream(pieces: list[bytes]) -> list[str]:
    # the stream's reader on a real response from a loopback provider started for this example
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(provider([], pieces), log_level="warning", lifespan="off"))
    upstream = Upstream()
    got: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: server.serve(sockets=[sock]))
        while not server.started:
            await anyio.sleep(0.01)
        try:
            async with upstream.stream(f"http://127.0.0.1:{sock.getsockname()[1]}/stream", {}, {}) as handle:
                got = [line async for line in handle.lines()]
        finally:
            await upstream.aclose()
            server.should_exit = True
    sock.close()
    assert orjson.dumps(got)  # plain strings
    return got


def echo_provider() -> Any:
    """A provider that answers with the bytes of the request body it read, and its length header."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        length = dict(scope["headers"]).get(b"content-length", b"")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-length", length)]})
        await send({"type": "http.response.body", "body": body})

    return app


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(st.integers(min_value=1, max_value=40_000), min_size=1, max_size=40),
    whole=st.booleans(),
    uvloop=st.booleans(),
)
def test_a_body_sent_in_pieces_arrives_as_their_concatenation(on_loopback, pieces, whole, uvloop):
    # large bodies are written without aiohttp's joined copy: a view of a bytes body, or the
    # pieces of a Chunks body through the transport's writelines; small ones in one write
    from ctxkernel.serve.upstream import Chunks

    chunks = Chunks(bytes([65 + i % 26]) * n for i, n in enumerate(pieces))
    expected = b"".join(chunks)
    base = on_loopback(echo_provider())  # a new provider per example (the fixture's are stopped at the end)

    async def run() -> Any:
        upstream = Upstream()
        try:
            return await upstream.request("POST", f"{base}/echo", {}, expected if whole else chunks)
        finally:
            await upstream.aclose()

    answer = anyio.run(run, backend_options={"use_uvloop": uvloop})
    assert answer.status == 200
    assert answer.body == expected
    assert answer.headers["x-length"] == str(len(expected))


def dropping_provider(drop: Any) -> tuple[Any, list[int]]:
    """A raw HTTP/1.1 provider on loopback that answers ``{"ok": true}`` with keep-alive, except
    that it closes the connection without a reply when ``drop(connection, request)`` is true
    (both counted from 1): what a pooled connection the upstream closed for idleness looks like
    when the close crosses the next request. Returns the server's factory and the count of
    requests each connection read."""
    per_connection: list[int] = []

    async def handle(reader: Any, writer: Any) -> None:
        per_connection.append(0)
        connection = len(per_connection)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                per_connection[connection - 1] += 1
                if drop(connection, per_connection[connection - 1]):
                    return
                body = b'{"ok": true}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    return handle, per_connection


def calls_through(drop: Any, count: int) -> tuple[list[Any], list[int]]:
    handle, per_connection = dropping_provider(drop)
    outcomes: list[Any] = []

    async def run() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        upstream = Upstream()
        try:
            for _ in range(count):
                try:
                    outcomes.append(
                        (await upstream.request("POST", f"http://127.0.0.1:{port}/v1", {}, {"model": "m"})).status
                    )
                except UpstreamError as exc:
                    outcomes.append(exc)
        finally:
            await upstream.aclose()
            server.close()
            await server.wait_closed()

    asyncio.run(run())
    return outcomes, per_connection


def test_a_pooled_connection_the_upstream_dropped_is_sent_again_once():
    # the second request goes out on the pooled connection, which the upstream closes unanswered:
    # the client must not get a 502 for the upstream's idle close (uvicorn keeps a connection 5 s)
    outcomes, per_connection = calls_through(lambda connection, request: connection == 1 and request == 2, 3)
    assert outcomes == [200, 200, 200]
    assert per_connection[:2] == [2, 2]  # the dropped request was sent once more, on a new connection


def test_an_upstream_that_drops_every_request_is_a_502_after_one_retry():
    outcomes, per_connection = calls_through(lambda connection, request: True, 1)
    assert len(outcomes) == 1 and isinstance(outcomes[0], UpstreamError)
    assert outcomes[0].status == 502 and "ServerDisconnectedError" in str(outcomes[0])
    assert per_connection == [1, 1]  # sent twice in all, never more
