"""The HTTP adapter against hostile and broken servers on 127.0.0.1 (issue #13, items 1, 3, 8, 16).

Each server here is a real TCP listener that reads the request and writes raw bytes, so it can
do what a well-behaved HTTP library would never do: redirect elsewhere, send endless or huge
bodies, trickle bytes, cut a body short, send a broken status line or oversized headers.
"""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from ctxkernel import AgentLoop, ContextOverflowError, Message, ModelError
from ctxkernel.errors import ConfigError
from ctxkernel.models import HTTPModelError, OpenAIChatModel, classify_http_error
from ctxkernel.models.openai_http import DEFAULT_MAX_RESPONSE_BYTES
from ctxkernel.testing import build_kernel

KEY = "sk-test-hostile0123456789abcdef"
REPLY = orjson.dumps(
    {
        "id": "c1",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}],
    }
)

Behaviour = Callable[[socket.socket, int, "RawServer"], None]


class RawServer:
    """One request per connection: the request is read and recorded, then ``behave(conn, n, server)``
    writes whatever it likes (``n`` counts requests from 0). Stops itself on :meth:`close`."""

    def __init__(self, behave: Behaviour) -> None:
        self.behave = behave
        self.requests: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.origin}/v1"
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            head, _, body = head.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                body += conn.recv(65536)
            with self._lock:
                n = len(self.requests)
                self.requests.append({"method": method, "path": path, "headers": headers, "body": body})
            self.behave(conn, n, self)
        except OSError:
            pass  # the client hung up: what a refusing client does
        finally:
            conn.close()

    def close(self) -> None:
        self.stopping.set()
        self._acceptor.join(5)
        self.sock.close()
        for thread in self._threads:
            thread.join(5)


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], RawServer]]:
    servers: list[RawServer] = []

    def start(behave: Behaviour) -> RawServer:
        servers.append(RawServer(behave))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.close()


def answer(conn: socket.socket, status: str = "200 OK", body: bytes = REPLY, headers: str = "") -> None:
    conn.sendall(
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{headers}"
        "Connection: close\r\n\r\n".encode()
        + body
    )


def model(server: RawServer, **kwargs: Any) -> OpenAIChatModel:
    kwargs.setdefault("backoff_seconds", 0)
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("api_key", KEY)
    return OpenAIChatModel("m", base_url=kwargs.pop("base_url", server.base_url), provider="hostile", **kwargs)


# -- item 1: redirects -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "status",
    ["301 Moved Permanently", "302 Found", "303 See Other", "307 Temporary Redirect", "308 Permanent Redirect"],
)
def test_a_redirect_to_another_origin_is_refused_and_the_key_never_leaves(serve, status: str) -> None:
    other = serve(lambda conn, n, s: answer(conn))
    # the Location carries credentials of its own: they must not show up in the message either
    location = f"http://mallory:loc-pass-77@127.0.0.1:{other.port}/v1/chat/completions"
    origin = serve(lambda conn, n, s: answer(conn, status, b"", f"Location: {location}\r\n"))

    with pytest.raises(HTTPModelError) as info:
        model(origin, max_retries=2).complete([Message.user("hi")])

    assert other.requests == []  # nothing (so no Authorization) ever reached the other origin
    assert len(origin.requests) == 1  # a redirect is not retried
    assert origin.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"
    err = info.value
    assert err.status == int(status.split()[0]) and not err.retryable
    text = str(err)
    assert f"redirect to http://127.0.0.1:{other.port}" in text and "base_url" in text
    assert "loc-pass-77" not in text and "mallory" not in text and KEY not in text


def test_a_same_origin_redirect_is_not_followed_either(serve) -> None:
    server = serve(
        lambda conn, n, s: (
            answer(conn, "307 Temporary Redirect", b"", "Location: /v2/chat/completions\r\n")
            if n == 0
            else answer(conn)
        )
    )
    with pytest.raises(HTTPModelError, match="redirect to a path on the same server"):
        model(server).complete([Message.user("hi")])
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions"]


# -- item 3b: response size ---------------------------------------------------------------------------
def _endless(conn: socket.socket, head: bytes, chunk: bytes, server: RawServer) -> None:
    conn.sendall(head)
    while not server.stopping.is_set():
        conn.sendall(chunk)  # raises once the client has hung up


def test_a_declared_300_mb_reply_is_refused_before_reading(serve) -> None:
    zeros = b"0" * 65536
    server = serve(lambda conn, n, s: _endless(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 314572800\r\n\r\n", zeros, s))
    with pytest.raises(HTTPModelError, match="declares 314572800 bytes") as info:
        model(server, max_retries=2).complete([Message.user("hi")])
    assert "max_response_bytes" in str(info.value) and not info.value.retryable
    assert len(server.requests) == 1


@pytest.mark.parametrize("framing", ["chunked", "until-close"])
def test_an_endless_reply_stops_at_the_cap_with_bounded_memory(serve, framing: str) -> None:
    if framing == "chunked":
        data = b"0" * 65536
        head, chunk = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"%x\r\n%s\r\n" % (len(data), data)
    else:
        head, chunk = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"0" * 65536
    server = serve(lambda conn, n, s: _endless(conn, head, chunk, s))
    tracemalloc.start()
    try:
        with pytest.raises(HTTPModelError, match=f"sent more than {DEFAULT_MAX_RESPONSE_BYTES} bytes"):
            model(server, max_retries=2).complete([Message.user("hi")])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # what was held is the cap (plus a chunk and the client's buffers), not the stream
    assert peak < 2 * DEFAULT_MAX_RESPONSE_BYTES
    assert len(server.requests) == 1  # over the cap is not retried


def test_the_cap_is_configurable_and_a_reply_under_it_is_read(serve) -> None:
    server = serve(lambda conn, n, s: answer(conn))
    assert model(server, max_response_bytes=len(REPLY)).complete([Message.user("hi")]).message.text == "fine"
    with pytest.raises(HTTPModelError, match="max_response_bytes"):
        model(server, max_response_bytes=len(REPLY) - 1).complete([Message.user("hi")])


def test_a_huge_error_body_is_read_only_up_to_its_excerpt(serve) -> None:
    server = serve(
        lambda conn, n, s: _endless(
            conn, b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\n\r\n", b"E" * 65536, s
        )
    )
    with pytest.raises(HTTPModelError) as info:
        model(server).complete([Message.user("hi")])
    assert info.value.status == 500 and len(info.value.body) == 500


def test_a_compressed_reply_is_refused(serve) -> None:
    import gzip

    body = gzip.compress(REPLY)
    server = serve(lambda conn, n, s: answer(conn, body=body, headers="Content-Encoding: gzip\r\n"))
    with pytest.raises(HTTPModelError, match="Content-Encoding 'gzip'"):
        model(server).complete([Message.user("hi")])
    assert server.requests[0]["headers"]["accept-encoding"] == "identity"


# -- item 3c: the whole-request deadline ---------------------------------------------------------------
def _trickle(conn: socket.socket, head: bytes, server: RawServer) -> None:
    conn.sendall(head)
    while not server.stopping.is_set():
        conn.sendall(b"x")
        time.sleep(0.2)  # far below the 1 s read timeout: only a whole-request deadline stops it


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("where", "head"),
    [
        ("body", b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"),
        ("headers", b"HTTP/1.1 200 OK\r\nX-Slow: "),
        ("status line", b"HTTP/1.1 2"),
    ],
)
def test_a_trickling_server_hits_the_deadline_and_is_retried(serve, where: str, head: bytes) -> None:
    server = serve(lambda conn, n, s: _trickle(conn, head, s))
    with pytest.raises(HTTPModelError, match="no complete answer within the 1 s timeout") as info:
        model(server, timeout=1, max_retries=1).complete([Message.user("hi")])
    assert info.value.retryable
    assert "request failed after 2 attempt(s)" in str(info.value)
    assert len(server.requests) == 2


# -- item 8: malformed HTTP -----------------------------------------------------------------------------
MALFORMED: dict[str, bytes] = {
    "incomplete body": b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + REPLY[:20],
    "bad status line": b"HTTP/1.1 OK-ish\r\n\r\n",
    "not HTTP": b"\x00\xff\xfe garbage \x00\r\n\r\n",
    "header line too long": b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 200_000 + b"\r\n\r\n",
    "too many headers": b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 50) for i in range(5000))
    + b"\r\n",
    "broken chunking": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "no answer at all": b"",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_http_is_a_retryable_model_error(serve, kind: str) -> None:
    server = serve(lambda conn, n, s: conn.sendall(MALFORMED[kind]))
    with pytest.raises(HTTPModelError, match="request failed after 2 attempt") as info:
        model(server, max_retries=1).complete([Message.user("hi")])
    assert info.value.retryable and info.value.status is None
    assert len(server.requests) == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_http_once_then_a_good_answer_succeeds(serve, kind: str) -> None:
    server = serve(lambda conn, n, s: conn.sendall(MALFORMED[kind]) if n == 0 else answer(conn))
    assert model(server, max_retries=1).complete([Message.user("hi")]).message.text == "fine"
    assert len(server.requests) == 2


def test_two_hundred_small_headers_are_an_ordinary_answer(serve) -> None:
    many = "".join(f"X-H{i}: v\r\n" for i in range(200))
    server = serve(lambda conn, n, s: answer(conn, headers=many))
    assert model(server).complete([Message.user("hi")]).message.text == "fine"


def test_malformed_http_through_the_loop_closes_the_turn_with_a_model_error(serve, tmp_path: Path) -> None:
    server = serve(lambda conn, n, s: conn.sendall(MALFORMED["bad status line"]))
    session = build_kernel(tmp_path).open_session()
    with pytest.raises(ModelError):
        AgentLoop(session, model(server)).run("hello")
    assert session.events[-1].type == "turn/end" and session.events[-1].data["reason"] == "error"


# -- item 3a: bounded error parsing -------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "message",
    [
        "1" * 200_000,
        "maximum context length is " + "9" * 200_000,
        "1" * 200_000 + " tokens > 5",
        "resulted in " + "1," * 100_000 + " tokens",
    ],
)
def test_error_classification_is_bounded_on_a_200k_digit_body(message: str) -> None:
    err = classify_http_error(400, orjson.dumps({"error": {"message": message}}))
    assert isinstance(err, ModelError)
    assert len(str(err)) < 2000


@pytest.mark.timeout(30)
def test_a_200k_digit_overflow_body_from_a_server_is_classified(serve) -> None:
    body = orjson.dumps({"error": {"message": "prompt is too long: " + "7" * 200_000 + " tokens > 100 maximum"}})
    server = serve(lambda conn, n, s: answer(conn, "400 Bad Request", body))
    with pytest.raises(ContextOverflowError):
        model(server).complete([Message.user("hi")])


# -- item 16: secrets in errors and in the log ----------------------------------------------------------
ECHO = orjson.dumps(
    {
        "error": {
            "message": f"Incorrect API key provided: {KEY}. You sent Authorization: Bearer {KEY}",
            "code": "invalid_api_key",
        }
    }
)


def test_a_provider_error_echoing_the_key_is_redacted(serve) -> None:
    server = serve(lambda conn, n, s: answer(conn, "401 Unauthorized", ECHO))
    with pytest.raises(HTTPModelError) as info:
        model(server).complete([Message.user("hi")])
    assert KEY not in str(info.value) and KEY not in info.value.body
    assert "sk-test-***" in str(info.value) or "***" in str(info.value)


def test_a_provider_error_echoing_the_key_is_stored_redacted(serve, tmp_path: Path) -> None:
    server = serve(lambda conn, n, s: answer(conn, "401 Unauthorized", ECHO))
    secret_url = f"http://user:url-pass-4242@127.0.0.1:{server.port}/v1"
    session = build_kernel(tmp_path).open_session()
    with pytest.raises(HTTPModelError) as info:
        AgentLoop(session, model(server, base_url=secret_url)).run("hello")
    assert "url-pass-4242" not in str(info.value)
    errors = [e.data["error"] for e in session.events if e.type == "step/end" and "error" in e.data]
    assert len(errors) == 1 and "HTTP 401" in errors[0]
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert KEY.encode() not in stored and b"url-pass-4242" not in stored
    assert b"HTTP 401" in stored  # the error itself is kept


def test_a_password_in_base_url_never_shows_in_messages(serve) -> None:
    server = serve(lambda conn, n, s: answer(conn, "500 Internal Server Error", b"boom"))
    secret_url = f"http://user:url-pass-4242@127.0.0.1:{server.port}/v1"
    with pytest.raises(HTTPModelError) as info:
        model(server, base_url=secret_url).complete([Message.user("hi")])
    assert "url-pass-4242" not in str(info.value) and "user:***@" in str(info.value)
    with pytest.raises(ConfigError) as bad:
        OpenAIChatModel("m", base_url="ftp://user:url-pass-4242@example.invalid/v1")
    assert "url-pass-4242" not in str(bad.value) and "http://" in str(bad.value)


@pytest.mark.parametrize("base_url", ["http://example.invalid/v1?api-version=1", "http://example.invalid/v1#x"])
def test_a_base_url_with_a_query_or_fragment_is_refused(base_url) -> None:
    """/chat/completions was appended after the query (``/v1?api-version=1/chat/completions``):
    every request went to the base path itself."""
    with pytest.raises(ConfigError, match="no query or fragment"):
        OpenAIChatModel("m", base_url=base_url)


@pytest.mark.parametrize(
    "base_url", ["http://127.0.0.1:99999/v1", "http://127.0.0.1:0/v1", "http://127.0.0.1:x/v1", "http://a b/v1"]
)
def test_a_base_url_with_no_valid_port_or_host_is_refused_when_built(base_url) -> None:
    """Port 99999 was taken and failed only when connecting (after a session was created)."""
    with pytest.raises(ConfigError, match="http:// or https:// URL with a host"):
        OpenAIChatModel("m", base_url=base_url)


def test_a_200_with_an_error_object_echoing_the_key_is_redacted(serve) -> None:
    server = serve(lambda conn, n, s: answer(conn, body=ECHO))
    with pytest.raises(HTTPModelError) as info:
        model(server).complete([Message.user("hi")])
    assert KEY not in str(info.value)


#: keys of no shape redact() knows (Mistral's 32 characters, a local server's token, a key with "/")
PLAIN_KEYS = ["Q3mV8xLk2PzR7tYw9NbC4dFhJ6sGaE1u", "local-token-77", "ab/cd+ef=="]


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_a_key_of_any_shape_echoed_by_the_provider_is_scrubbed(serve, tmp_path: Path, key: str) -> None:
    """The adapter knows its own credentials: their exact values leave every error it raises,
    logs or the loop stores, whatever their shape (redact() only finds keys of known shapes)."""
    escaped = orjson.dumps(key).decode()[1:-1].replace("/", "\\/")  # PHP-style JSON escapes "/"
    echoes = {
        "401": ("401 Unauthorized", orjson.dumps({"error": {"message": f"bad key {key}", "code": key}})),
        "escaped": ("401 Unauthorized", b'{"error": {"message": "bad key ' + escaped.encode() + b'"}}'),
        "200 error": ("200 OK", orjson.dumps({"error": {"message": f"bad key {key}"}})),
        "not json": ("200 OK", f"<html>key {key} refused</html>".encode()),
        "no choices": ("200 OK", orjson.dumps({"detail": f"key {key}"})),
        "header key": ("403 Forbidden", orjson.dumps({"error": f"x-api-key {key}-x2 refused"})),
    }
    for name, (status, body) in echoes.items():
        server = serve(lambda conn, n, s, status=status, body=body: answer(conn, status, body))
        with pytest.raises(ModelError) as info:
            model(server, api_key=key, headers={"X-Api-Key": f"{key}-x2", "X-Title": "ctxkernel"}).complete(
                [Message.user("hi")]
            )
        error = info.value
        shown = " ".join([str(error), getattr(error, "body", ""), str(getattr(error, "code", ""))])
        assert key not in shown and "\\/" not in shown, (name, shown)
        assert "***" in shown, (name, shown)
    # retried (logged) and stored by the agent loop
    body = orjson.dumps({"error": {"message": f"overloaded, key {key}"}})
    server = serve(lambda conn, n, s: answer(conn, "503 Service Unavailable", body))
    session = build_kernel(tmp_path).open_session()
    with capture_logs() as logs, pytest.raises(HTTPModelError):
        AgentLoop(session, model(server, api_key=key, max_retries=1)).run("hello")
    assert logs and key not in repr(logs)
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert b"HTTP 503" in stored and key.encode() not in stored


# -- the adapter's own settings -------------------------------------------------------------------------
def test_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigError, match="timeout"):
        OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1", timeout=0)
    with pytest.raises(ConfigError, match="timeout"):
        OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1", timeout=float("nan"))
    with pytest.raises(ConfigError, match="max_response_bytes"):
        OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1", max_response_bytes=0)
    with pytest.raises(ConfigError, match="http:// or https://"):
        OpenAIChatModel("m", base_url="127.0.0.1:8000/v1")


def test_without_httpx_the_adapter_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_httpx(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "httpx" or name.startswith("httpx."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_httpx)
    with pytest.raises(ConfigError, match=r"pip install 'ctxkernel\[http\]'"):
        OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1")


def test_a_model_copy_gets_its_own_connection_pool(serve) -> None:
    import copy

    server = serve(lambda conn, n, s: answer(conn))
    original = model(server)
    original.complete([Message.user("hi")])
    duplicate = copy.deepcopy(original)
    assert duplicate.complete([Message.user("hi")]).message.text == "fine"
    with original:
        pass
    assert duplicate._client is not original._client and original._client is None


@pytest.mark.timeout(60)
def test_ctxkernel_run_reports_malformed_http_as_a_model_error(
    serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from ctxkernel.cli import main
    from ctxkernel.logging import reset_logging

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    monkeypatch.setenv("HOSTILE_KEY", KEY)
    server = serve(lambda conn, n, s: conn.sendall(MALFORMED["incomplete body"]))
    try:
        code = main(
            [
                "run",
                "--profile",
                "basic",
                "--model",
                f"openai:{server.base_url}#m",
                "--api-key-env",
                "HOSTILE_KEY",
                "hello",
            ]
        )
    finally:
        reset_logging()
    err = capsys.readouterr().err
    assert code == 1 and "model error:" in err and "request failed after 3 attempt(s)" in err
    assert "Traceback" not in err and KEY not in err
    assert len(server.requests) == 3  # the default max_retries = 2
