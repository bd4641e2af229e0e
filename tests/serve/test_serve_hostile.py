"""Hostile clients and providers against serve (issue 39, items 5-9, 14, 15 and 17): every size
is bounded while it is read, a provider's broken reply never becomes a 500, a client that goes
away frees its session at once, and one client cannot hold up the others."""

from __future__ import annotations

import logging
import socket
import threading
import time
import tracemalloc
from typing import Any

import anyio
import httpx
import orjson
import pytest
from serve_clients import Agent
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.profile import load_profile
from ctxkernel.serve.app import create_app
from ctxkernel.serve.config import ServeConfig
from ctxkernel.serve.upstream import Limits

from .conftest import write_profile

Scope = dict[str, Any]


def chat(
    serve: Any, api: str, session: str, messages: list[dict[str, Any]], timeout: float = 30, **extra: Any
) -> httpx.Response:
    """One request as raw JSON (no SDK retries or parsing in the way); ``extra`` goes in the body."""
    if api == "openai":
        url, body = f"{serve.url}/v1/chat/completions", {"model": "fake-model", "messages": messages}
    else:
        url, body = f"{serve.url}/v1/messages", {"model": "fake-model", "max_tokens": 100, "messages": messages}
    headers = {"X-Ctxkernel-Session": session, "authorization": "Bearer sk-test-client"}
    return httpx.post(url, json={**body, **extra}, headers=headers, timeout=timeout)


# -- item 5: memory bounded by message count and parsed size -------------------------------------------
def peak_while_answering(app: Any, path: str, body: bytes) -> tuple[int, httpx.Response]:
    """The request answered in this process by ``app``, and the peak of what was allocated
    meanwhile (tracemalloc)."""

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.post(path, content=body, headers={"content-type": "application/json"})

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        response = anyio.run(send)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, response


@pytest.mark.parametrize("count", [10_001, 100_001])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_many_tiny_messages_are_refused_within_twenty_times_the_body(tmp_path, api, count):
    # 100,001 one-character messages in 4 MB took 33 s and 1.4 GB: the count is checked on the
    # parsed body, before a message is converted or reaches a session
    app = create_app(ServeConfig(profile=str(write_profile(tmp_path))))
    messages = [{"role": "user", "content": "x"}] * count
    if api == "openai":
        path, body = "/v1/chat/completions", orjson.dumps({"model": "m", "messages": messages})
    else:
        path, body = "/v1/messages", orjson.dumps({"model": "m", "max_tokens": 5, "messages": messages})
    peak, response = peak_while_answering(app, path, body)
    assert response.status_code == 400, response.text[:300]
    assert "10000" in response.text and "messages" in response.text
    assert peak <= 20 * len(body), f"peak {peak} bytes for a body of {len(body)}"


def test_a_message_of_many_parts_is_refused_within_twenty_times_the_body(tmp_path):
    app = create_app(ServeConfig(profile=str(write_profile(tmp_path))))
    parts = [{"type": "text", "text": "x"}] * 200_000
    body = orjson.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": parts}]})
    peak, response = peak_while_answering(app, "/v1/messages", body)
    assert response.status_code == 400, response.text[:300]
    assert "content parts" in response.text
    assert peak <= 20 * len(body), f"peak {peak} bytes for a body of {len(body)}"


# -- item 6: a provider that reuses a tool-call id ------------------------------------------------------
@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_reused_tool_call_id_is_remapped_not_a_500(fake, serve_factory, api, stream):
    upstream, _ = fake
    serve = serve_factory()
    replies = iter(
        [
            Reply("first", [("read_file", {"path": "a.py"})], ids=["call_same"]),
            Reply("again", [("read_file", {"path": "b.py"})], ids=["call_same"]),
            Reply("twice in one", [("read_file", {"path": "c.py"}), ("read_file", {"path": "d.py"})], ids=["x", "x"]),
            Reply("done"),
        ]
    )
    upstream.script = lambda api_name, body: next(replies)
    sid = f"reuse-{api}-{stream}"
    agent = Agent(api, serve.openai(session=sid) if api == "openai" else serve.anthropic(session=sid), stream=stream)
    agent.user("read the files")
    seen: list[str] = []
    for _ in range(3):
        _, calls = agent.step()
        assert calls
        seen += [call_id for call_id, _, _ in calls]
        agent.results([(call_id, f"result of {call_id}") for call_id, _, _ in calls])
    text, calls = agent.step()
    assert text == "done" and not calls
    assert seen[0] == "call_same" and len(set(seen)) == len(seen) == 4, seen
    # the log holds the ids the client got, each call answered once
    events = Kernel(load_profile(serve.profile)).open_session(sid, repair=False).events
    logged = [
        b["id"]
        for e in events
        if e.type == "assistant/message"
        for b in e.data["message"]["content"]
        if b["type"] == "tool_call"
    ]
    answered = [e.data["message"]["content"][0]["call_id"] for e in events if e.type == "tool/result"]
    assert logged == answered == seen


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_overlong_tool_call_id_is_renamed_for_the_client_and_the_log(fake, serve_factory, api, stream):
    # the id is written to the log and sent back with every later request: one of 100,000
    # characters was kept; it is renamed like a reused one
    upstream, _ = fake
    serve = serve_factory()
    replies = iter([Reply("", [("read_file", {"path": "a.py"})], ids=["call_" + "x" * 100_000]), Reply("done")])
    upstream.script = lambda api_name, body: next(replies)
    sid = f"long-id-{api}-{stream}"
    agent = Agent(api, serve.openai(session=sid) if api == "openai" else serve.anthropic(session=sid), stream=stream)
    agent.user("read the file")
    _, calls = agent.step()
    ((call_id, _, _),) = calls
    assert call_id.startswith("call_xxx") and len(call_id) <= 256
    agent.results([(call_id, "contents")])
    text, calls = agent.step()
    assert text == "done" and not calls
    events = Kernel(load_profile(serve.profile)).open_session(sid, repair=False).events
    blocks = [b for e in events if e.type == "assistant/message" for b in e.data["message"]["content"]]
    assert [b["id"] for b in blocks if b["type"] == "tool_call"] == [call_id]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("name", ["", "t" * 257], ids=["empty", "overlong"])
def test_a_tool_call_name_out_of_bounds_is_an_upstream_error(fake, serve_factory, api, name):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api_name, body: Reply("", [(name, {"path": "a.py"})], ids=["call_1"])
    sid = f"bad-name-{api}-{len(name)}"
    agent = Agent(api, serve.openai(session=sid) if api == "openai" else serve.anthropic(session=sid))
    agent.user("read the file")
    with pytest.raises(
        Exception, match=r"unreadable reply: tool call 0: name must be a string of 1-256 char"
    ) as caught:
        agent.step()
    assert getattr(caught.value, "status_code", None) == 502
    events = Kernel(load_profile(serve.profile)).open_session(sid, repair=False).events
    assert not [e for e in events if e.type == "assistant/message"]


# -- item 7: lone surrogates ----------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_lone_surrogate_in_a_tool_result_becomes_a_replacement_character(fake, serve_factory, api):
    # os.listdir gives "caf\udce9.txt" for a file name that is not UTF-8; json.dumps writes it
    # as the escape \udce9, which UTF-8 cannot hold: that turn and every later one were a 400
    upstream, _ = fake
    replies = iter([Reply("", [("read_file", {"path": "."})], ids=["call_ls"]), Reply("listed"), Reply("ok")])
    upstream.script = lambda api_name, body: next(replies)
    serve = serve_factory()
    history: list[dict[str, Any]] = [{"role": "user", "content": "list the folder"}]
    first = chat(serve, api, f"surrogate-{api}", history)
    assert first.status_code == 200
    if api == "openai":
        history.append(first.json()["choices"][0]["message"])
        history.append({"role": "tool", "tool_call_id": "call_ls", "content": "caf\udce9.txt"})
    else:
        history.append({"role": "assistant", "content": first.json()["content"]})
        history.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_ls", "content": "caf\udce9.txt"}]}
        )
    body = {"model": "fake-model", "messages": history, **({"max_tokens": 100} if api == "anthropic" else {})}
    import json

    raw = json.dumps(body).encode()  # the standard library writes the lone surrogate as an escape
    assert b"\\udce9" in raw
    url = f"{serve.url}/v1/chat/completions" if api == "openai" else f"{serve.url}/v1/messages"
    headers = {"X-Ctxkernel-Session": f"surrogate-{api}", "content-type": "application/json"}
    second = httpx.post(url, content=raw, headers=headers, timeout=30)
    assert second.status_code == 200, second.text
    sent = orjson.dumps(upstream.received[-1].body["messages"]).decode()
    assert "caf\ufffd.txt" in sent
    # and the next turn, whose history still holds it
    history.append(
        {"role": "assistant", "content": "listed"}
        if api == "openai"
        else {"role": "assistant", "content": [{"type": "text", "text": "listed"}]}
    )
    history.append({"role": "user", "content": "thanks"})
    raw = json.dumps({**body, "messages": history}).encode()
    third = httpx.post(url, content=raw, headers=headers, timeout=30)
    assert third.status_code == 200, third.text


# -- item 8: a client that goes away, a fast stream, an endless line ------------------------------------
def session_free_within_a_second(serve: Any, api: str, sid: str) -> httpx.Response:
    """A request for ``sid`` that waits at most one second for its turn."""
    serve.proxy.config.lock_wait_seconds = 1.0
    return chat(serve, api, sid, [{"role": "user", "content": "are you there?"}])


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_client_that_goes_away_frees_its_session_and_cancels_the_upstream(fake, serve_factory, api, stream):
    upstream, _ = fake
    upstream.reply_delay = 30  # a provider that thinks for a long time before its first byte
    serve = serve_factory()
    sid = f"gone-early-{api}-{stream}"
    with pytest.raises(httpx.ReadTimeout):
        chat(serve, api, sid, [{"role": "user", "content": "think hard"}], stream=stream, timeout=0.5)
    time.sleep(0.2)
    upstream.reply_delay = 0
    upstream.script = lambda api_name, body: Reply("here")
    answer = session_free_within_a_second(serve, api, sid)
    assert answer.status_code == 200, answer.text
    assert upstream.dropped == 1  # the upstream call was cut, not left to run its 30 s
    events = Kernel(load_profile(serve.profile)).open_session(sid, repair=False).events
    assert any(e.type == "step/end" and e.data.get("reason") == "interrupted" for e in events)


def burst_provider(events: int) -> Any:
    """A provider whose whole stream (``events`` text deltas) arrives at once: serve finds every
    next event already read, so nothing makes it wait."""
    delta = orjson.dumps(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "x" * 60}}],
        }
    )
    end = orjson.dumps(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    body = b"data: " + delta + b"\n\n"
    whole = body * events + b"data: " + end + b"\n\ndata: [DONE]\n\n"

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": whole})

    return app


def test_one_fast_stream_does_not_hold_up_other_requests(on_loopback, tmp_path):
    provider = on_loopback(burst_provider(50_000))
    serve = on_loopback(create_app(ServeConfig(profile=str(write_profile(tmp_path)), upstream=f"{provider}/v1")))
    done = threading.Event()
    received: list[int] = []

    def stream() -> None:
        try:
            status, body = streamed_request(serve, timeout=120)
            received.append(len(body))
        finally:
            done.set()

    thread = threading.Thread(target=stream)
    thread.start()
    slowest = 0.0
    with httpx.Client(base_url=serve, timeout=30) as http:
        while not done.is_set():
            started = time.monotonic()
            assert http.get("/healthz").status_code == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.02)
    thread.join(30)
    assert received and received[0] > 50_000 * 60
    assert slowest < 1.0, f"/healthz took {slowest:.2f} s while one stream ran"


def endless_line_provider(stall: float) -> Any:
    """A provider whose stream is one line that never ends (9 MiB, then silence)."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: " + b"x" * (9 << 20), "more_body": True})
        await anyio.sleep(stall)
        await send({"type": "http.response.body", "body": b"\n\n"})

    return app


def trickled_error_provider(seconds: float) -> Any:
    """A provider that answers 500 and trickles its error body a byte every 0.1 s."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]})
        end = anyio.current_time() + seconds
        while anyio.current_time() < end:
            await send({"type": "http.response.body", "body": b" ", "more_body": True})
            await anyio.sleep(0.1)
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def streamed_request(url: str, timeout: float) -> tuple[int, bytes]:
    body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    with httpx.Client(timeout=timeout) as http, http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        return r.status_code, r.read()


def test_an_endless_stream_line_ends_the_stream_while_it_is_read(on_loopback, tmp_path):
    # the 8 MiB limit on one SSE line was checked only once the line ended
    provider = on_loopback(endless_line_provider(stall=30))
    serve = on_loopback(create_app(ServeConfig(profile=str(write_profile(tmp_path)), upstream=f"{provider}/v1")))
    status, body = streamed_request(serve, timeout=10)
    assert status == 200
    assert b"error" in body and b"line" in body


# -- item 9: a streamed error body has a deadline -------------------------------------------------------
def test_a_trickled_error_body_of_a_stream_ends_at_the_deadline(on_loopback, tmp_path):
    provider = on_loopback(trickled_error_provider(seconds=30))
    config = ServeConfig(
        profile=str(write_profile(tmp_path)), upstream=f"{provider}/v1", limits=Limits(deadline_seconds=2)
    )
    serve = on_loopback(create_app(config))
    started = time.monotonic()
    status, body = streamed_request(serve, timeout=10)
    assert status == 504, body[:300]
    assert time.monotonic() - started < 8


# -- item 14: a client tool named like a strategy tool --------------------------------------------------
HANDOFF = {
    "strategies": '["handoff", "basic"]',
    "extra_profile": 'capability_order = ["handoff", "basic"]',
    "window": 32000,
    "reserved": 2000,
}


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_client_tool_named_like_a_strategy_tool_is_sent_once_and_stays_the_clients(
    fake, serve_factory, tmp_path, api
):
    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, **HANDOFF))
    upstream.script = lambda api_name, body: Reply("", [("notes_write_file", {"path": "x.md", "content": "mine"})])
    schema = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}
    if api == "openai":
        tools = [{"type": "function", "function": {"name": "notes_write_file", "parameters": schema}}]
    else:
        tools = [{"name": "notes_write_file", "input_schema": schema}]
    answer = chat(serve, api, f"clash-{api}", [{"role": "user", "content": "write it"}], tools=tools)
    assert answer.status_code == 200, answer.text
    sent = upstream.received[-1].body["tools"]
    names = [t["function"]["name"] if api == "openai" else t["name"] for t in sent]
    assert names.count("notes_write_file") == 1
    assert sent[names.index("notes_write_file")] == tools[0]  # the client's own schema
    # the model's call of it is the client's to run
    if api == "openai":
        calls = answer.json()["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["notes_write_file"]
    else:
        assert [b["name"] for b in answer.json()["content"] if b["type"] == "tool_use"] == ["notes_write_file"]
    assert len(upstream.received) == 1  # not run inside the proxy


# -- item 15: redirects and model names from the upstream ------------------------------------------------
@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_upstream_redirect_is_passed_back(fake, serve_factory, api, stream):
    upstream, _ = fake
    upstream.fail_next = [(307, {"moved": True}, {"location": "https://elsewhere.example/v1/chat"})]
    serve = serve_factory()
    answer = chat(serve, api, f"moved-{api}-{stream}", [{"role": "user", "content": "hi"}], stream=stream)
    assert answer.status_code == 307, answer.text
    assert answer.headers["location"] == "https://elsewhere.example/v1/chat"


def raw_status_provider(status_line: bytes) -> tuple[str, socket.socket]:
    """A provider on a raw socket answering every request with ``status_line`` and no body (a
    server of ours cannot send a status HTTP has no room for); its base URL and socket."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_forever() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                lengths = [
                    int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
                ]
                length = lengths[0] if lengths else 0
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(b"HTTP/1.1 " + status_line + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    threading.Thread(target=serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", listener


@pytest.mark.parametrize("status_line", [b"304 Not Modified", b"600 Beyond", b"999 Nonsense"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_upstream_status_no_client_can_be_given_is_a_502(on_loopback, tmp_path, status_line, stream):
    # such a status was passed back as it came: the server refused to send it (no body may follow
    # a 304; HTTP has no status over 599) and dropped the connection with a traceback
    provider, listener = raw_status_provider(status_line)
    try:
        serve = on_loopback(create_app(ServeConfig(profile=str(write_profile(tmp_path)), upstream=f"{provider}/v1")))
        body = {"model": "fake-model", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(f"{serve}/v1/chat/completions", json=body, timeout=30)
        models = httpx.get(f"{serve}/v1/models", timeout=30)
    finally:
        listener.close()
    status = status_line.split()[0].decode()
    assert answer.status_code == 502, answer.text
    assert f"HTTP {status}" in answer.json()["error"]["message"]
    assert models.status_code == 502 and f"HTTP {status}" in models.text


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_upstream_model_name_is_bounded(fake, serve_factory, api, stream):
    upstream, _ = fake
    upstream.model = "m" * 100_000
    serve = serve_factory()
    answer = chat(serve, api, f"long-model-{api}-{stream}", [{"role": "user", "content": "hi"}], stream=stream)
    assert answer.status_code == 200
    assert b"m" * 300 not in answer.content
    assert len(answer.content) < 20_000


# -- item 17: bodies that trickle in -------------------------------------------------------------------
def test_connections_trickling_a_body_are_answered_and_closed(fake, serve_factory):
    serve = serve_factory()
    serve.proxy.config.body_seconds = 1.0
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: 100000\r\n\r\n{"
    )
    socks = []
    for _ in range(40):
        sock = socket.create_connection(("127.0.0.1", serve.server.port))
        sock.sendall(head)
        sock.settimeout(0.01)
        socks.append(sock)
    answers: dict[int, bytes] = {}
    deadline = time.monotonic() + 15
    try:
        while len(answers) < len(socks) and time.monotonic() < deadline:
            for i, sock in enumerate(socks):
                if i in answers:
                    continue
                try:
                    sock.sendall(b" ")
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    answers[i] = b"(closed)"
                    continue
                answers[i] = data
            time.sleep(0.1)
    finally:
        for sock in socks:
            sock.close()
    assert len(answers) == 40, f"{40 - len(answers)} connections still open after 15 s"
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers.values()), set(answers.values())


# -- JSON deeper than serve writes, from the model --------------------------------------------------------
DEEP_ARGS = '{"a":' + "[" * 300 + "1" + "]" * 300 + "}"  # orjson reads it, and writes 254 levels at most


def canned_provider(body: bytes, stream: bool) -> Any:
    """A provider answering every request with ``body`` as it is (a stream's events, or JSON)."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        kind = b"text/event-stream" if stream else b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        await send({"type": "http.response.body", "body": body})

    return app


def anthropic_events(*events: dict[str, Any]) -> bytes:
    """An Anthropic stream of ``events``, each named by its type."""
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


ANTHROPIC_START = {
    "type": "message_start",
    "message": {"id": "m1", "type": "message", "role": "assistant", "model": "m", "content": [], "usage": {}},
}
ANTHROPIC_END = [
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
    {"type": "message_stop"},
]


def deep_call_reply(api: str, stream: bool) -> bytes:
    """A reply of ``api`` whose one tool call's arguments nest 300 levels."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": DEEP_ARGS}}
    if api == "openai" and not stream:
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        return orjson.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [choice]})
    if api == "openai":
        chunk = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
        first = {"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, **call}]}}
        last = {"index": 0, "delta": {}, "finish_reason": "tool_calls"}
        chunks = [{**chunk, "choices": [first]}, {**chunk, "choices": [last]}]
        return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    if not stream:
        use = {"type": "tool_use", "id": "t1", "name": "f", "input": "@"}
        reply = {**ANTHROPIC_START["message"], "content": [use], "stop_reason": "tool_use"}
        return orjson.dumps(reply).replace(b'"@"', DEEP_ARGS.encode())
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    return anthropic_events(
        ANTHROPIC_START,
        {"type": "content_block_start", "index": 0, "content_block": use},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": DEEP_ARGS}},
        *ANTHROPIC_END,
    )


def ask(serve: str, api: str, stream: bool) -> httpx.Response:
    """One request of ``api`` (``responses`` served by a Chat Completions upstream)."""
    if api == "openai":
        url, body = "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    elif api == "anthropic":
        url, body = "/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    else:
        url, body = "/v1/responses", {"model": "m", "input": "x"}
    return httpx.post(f"{serve}{url}", json={**body, "stream": stream}, timeout=30)


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_tool_call_arguments_nested_deeper_than_serve_writes_are_an_upstream_error(on_loopback, tmp_path, api, stream):
    # the session log could not write the reply: a 500, or streamed an "internal error" event
    provider = on_loopback(
        canned_provider(deep_call_reply("anthropic" if api == "anthropic" else "openai", stream), stream)
    )
    config = ServeConfig(profile=str(write_profile(tmp_path)), upstream=f"{provider}/v1", anthropic_upstream=provider)
    answer = ask(on_loopback(create_app(config)), api, stream)
    assert answer.status_code == (200 if stream else 502), answer.text[-500:]
    assert "the upstream sent an unreadable reply: a tool_call block nested too deeply" in answer.text
    assert "internal error" not in answer.text


@pytest.mark.parametrize(("block", "delta"), [("text", "text_delta"), ("thinking", "thinking_delta")])
def test_an_anthropic_block_started_with_no_string_is_an_upstream_error(on_loopback, tmp_path, block, delta):
    # its delta was added to the start's number: a TypeError, reported as an internal error
    stream = anthropic_events(
        ANTHROPIC_START,
        {"type": "content_block_start", "index": 0, "content_block": {"type": block, block: 5}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": delta, block: "hi"}},
        *ANTHROPIC_END,
    )
    provider = on_loopback(canned_provider(stream, True))
    config = ServeConfig(profile=str(write_profile(tmp_path)), anthropic_upstream=provider)
    answer = ask(on_loopback(create_app(config)), "anthropic", True)
    assert f"the upstream sent an unreadable reply: a '{block}' block started with {block} int" in answer.text
    assert "internal error" not in answer.text


def deep_usage_reply(stream: bool) -> bytes:
    """A Chat Completions reply "fine" whose usage nests 1,000 objects, a list 300 arrays deep
    beside them."""
    usage = b'{"prompt_tokens":3,"completion_tokens":1,"deep":' + b'{"x":' * 1000 + b"1" + b"}" * 1000
    usage += b',"listed":' + b"[" * 300 + b"]" * 300 + b"}"
    if not stream:
        choice = {"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}
        reply = orjson.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [choice], "usage": "@"})
        return reply.replace(b'"@"', usage)
    chunk = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    first = {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "fine"}}]}
    last = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": "@"}
    events = [orjson.dumps(first), orjson.dumps(last).replace(b'"@"', usage)]
    return b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("api", ["openai", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_upstream_usage_nested_deeply_is_left_out_not_a_failure(on_loopback, tmp_path, caplog, api, stream):
    # add_usage walked it recursively: Python's recursion limit, a 500 (or an error event)
    caplog.set_level(logging.WARNING, logger="ctxkernel")
    provider = on_loopback(canned_provider(deep_usage_reply(stream), stream))
    config = ServeConfig(profile=str(write_profile(tmp_path)), upstream=f"{provider}/v1")
    answer = ask(on_loopback(create_app(config)), api, stream)
    assert answer.status_code == 200, answer.text[-500:]
    assert "fine" in answer.text and "internal error" not in answer.text and "event: error" not in answer.text
    assert "upstream usage nested too deeply" in caplog.text
    assert "usage.deep" in caplog.text and "usage.listed" in caplog.text
