"""The OpenAI-compatible HTTP adapter against a local server on 127.0.0.1 (never the internet)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

import ctxkernel
from ctxkernel import AgentLoop, ContextOverflowError, Message, ModelError, ToolCallBlock
from ctxkernel.errors import ConfigError
from ctxkernel.models import HTTPModelError, OpenAIChatModel, classify_http_error
from ctxkernel.profile import SummarizerSettings
from ctxkernel.testing import build_kernel


class FakeProvider:
    """A chat-completions server: answers with a queue of (status, body) or a callable."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.responses: list[tuple[int, Any]] = []
        self.responder: Any = None
        provider = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = orjson.loads(self.rfile.read(length))
                provider.requests.append({"path": self.path, "body": body})
                provider.headers.append(dict(self.headers))
                if provider.responder is not None:
                    status, payload = provider.responder(body)
                else:
                    status, payload = provider.responses.pop(0)
                data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    try:
        yield fake
    finally:
        fake.close()


def completion(
    content: str | None = "ok",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    reasoning: str | None = None,
    model: str = "fake-1",
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning:
        message["reasoning_content"] = reasoning
    out: dict[str, Any] = {
        "id": "cmpl-1",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def model_for(provider: FakeProvider, **kwargs: Any) -> OpenAIChatModel:
    kwargs.setdefault("backoff_seconds", 0)
    return OpenAIChatModel("fake-1", base_url=provider.base_url, api_key="sk-test", provider="fake", **kwargs)


def test_reply_with_tool_calls_reasoning_and_usage(provider: FakeProvider) -> None:
    provider.responses.append(
        (
            200,
            completion(
                None,
                reasoning="I should read the file.",
                tool_calls=[
                    {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}
                ],
                usage={"prompt_tokens": 120, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 100}},
            ),
        )
    )
    tools = [
        {
            "type": "function",
            "function": {"name": "read", "description": "read a file", "parameters": {"type": "object"}},
        }
    ]
    reply = model_for(provider).complete([Message.user("fix a.py")], system="be brief", tools=tools)

    assert reply.message.tool_calls == [ToolCallBlock("call_1", "read", {"path": "a.py"})]
    assert reply.message.content[0] == ctxkernel.ReasoningBlock("I should read the file.")
    assert reply.usage == {"input_tokens": 120, "output_tokens": 30, "cached_input_tokens": 100}
    assert (reply.provider, reply.model) == ("fake", "fake-1")
    assert reply.message.source == ctxkernel.Source(kind="model", provider="fake", model="fake-1")
    sent = provider.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "fix a.py"},
    ]
    assert sent["body"]["tools"] == tools
    assert provider.headers[0]["Authorization"] == "Bearer sk-test"


def test_reasoning_is_sent_back_only_when_asked(provider: FakeProvider) -> None:
    history = [Message.user("q"), Message.assistant("a", reasoning="thought"), Message.user("q2")]
    provider.responses += [(200, completion()), (200, completion())]
    model_for(provider).complete(history)
    model_for(provider, send_reasoning=True).complete(history)
    plain, with_reasoning = (r["body"]["messages"][1] for r in provider.requests)
    assert "reasoning_content" not in plain
    assert with_reasoning["reasoning_content"] == "thought"


@pytest.mark.parametrize(
    ("status", "body", "prompt_tokens", "limit"),
    [
        (
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
            9000,
            8192,
        ),
        (
            400,
            {
                "error": {
                    "message": "prompt is too long: 210000 tokens > 200000 maximum",
                    "type": "invalid_request_error",
                }
            },
            210000,
            200000,
        ),
        (
            400,
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).",
                "code": 400,
            },
            5000,
            4096,
        ),
        (400, {"error": {"message": "bad", "code": "context_length_exceeded"}}, None, None),
        (413, b"request entity too large", None, None),
    ],
)
def test_context_overflow_is_classified(
    provider: FakeProvider, status: int, body: Any, prompt_tokens: int | None, limit: int | None
) -> None:
    provider.responses.append((status, body))
    with pytest.raises(ContextOverflowError) as info:
        model_for(provider).complete([Message.user("hi")])
    assert (info.value.prompt_tokens, info.value.limit) == (prompt_tokens, limit)
    assert len(provider.requests) == 1  # an overflow is never retried unchanged


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, {"error": {"message": "Invalid value for 'tool_choice'", "code": "invalid_value"}}),
        (401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}),
        (404, b"<html>not found</html>"),
    ],
)
def test_other_errors_carry_status_and_body(provider: FakeProvider, status: int, body: Any) -> None:
    provider.responses.append((status, body))
    with pytest.raises(HTTPModelError) as info:
        model_for(provider).complete([Message.user("hi")])
    err = info.value
    assert not isinstance(err, ContextOverflowError)
    assert err.status == status
    assert f"HTTP {status}" in str(err)
    excerpt = body.decode() if isinstance(body, bytes) else orjson.dumps(body).decode()
    assert err.body == excerpt[:500]


def test_transient_errors_are_retried_then_reported(provider: FakeProvider) -> None:
    provider.responses += [(503, {"error": {"message": "overloaded"}}), (200, completion("fine"))]
    assert model_for(provider, max_retries=1).complete([Message.user("hi")]).message.text == "fine"
    provider.responses += [(429, {"error": {"message": "slow down"}})] * 2
    with pytest.raises(HTTPModelError) as info:
        model_for(provider, max_retries=1).complete([Message.user("hi")])
    assert info.value.status == 429
    assert len(provider.requests) == 4


def test_unreadable_response_is_a_model_error(provider: FakeProvider) -> None:
    provider.responses += [(200, b"not json"), (200, {"choices": []})]
    with pytest.raises(HTTPModelError, match="not JSON"):
        model_for(provider).complete([Message.user("hi")])
    with pytest.raises(HTTPModelError, match="no choices"):
        model_for(provider).complete([Message.user("hi")])


def test_a_reply_with_a_lone_surrogate_escape_is_read_with_a_replacement_character(
    provider: FakeProvider, tmp_path: Any
) -> None:
    """``json.dumps`` writes a string holding a lone surrogate (a file name ``os.listdir`` could
    not decode) as ``"\\udce9"``: valid JSON, which orjson refuses. The reply was refused as
    "not JSON" and the turn ended with an error; serve's upstream read it. It is read the same
    way: each lone surrogate becomes U+FFFD (docs/security.md, "Tool output")."""
    import json

    body = completion("saved caf\udce9.txt", usage={"prompt_tokens": 12, "completion_tokens": 3})
    provider.responses += [(200, json.dumps(body).encode()), (200, b'{"choices": [\\ud800')]
    session = build_kernel(tmp_path).open_session()
    result = AgentLoop(session, model_for(provider)).run("hi")
    assert result.reason == "completed" and result.text == "saved caf\ufffd.txt"
    assert next(e for e in session.events if e.type == "assistant/message").data["usage"]["input_tokens"] == 12
    with pytest.raises(HTTPModelError, match="not JSON"):  # anything else orjson refuses still is
        model_for(provider).complete([Message.user("hi")])


@pytest.mark.parametrize("usage", ["lots", {"prompt_tokens": -5}, {"prompt_tokens": 2**60}, [1, 2]])
def test_a_malformed_usage_keeps_the_reply_and_says_why(provider: FakeProvider, usage: Any) -> None:
    """The reply is kept without usage (pressure falls back to the meter's count), and the
    dropped figures are logged, not swallowed."""
    provider.responses.append((200, {**completion("fine"), "usage": usage}))
    with capture_logs() as logs:
        reply = model_for(provider).complete([Message.user("hi")])
    assert reply.message.text == "fine" and reply.usage is None
    warned = [e for e in logs if e["log_level"] == "warning" and "usage" in e["event"]]
    assert len(warned) == 1 and warned[0]["provider"] == "fake" and "usage" in warned[0]["error"]


def test_connection_refused_is_a_model_error() -> None:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=5)
    with pytest.raises(ModelError, match="request failed"):
        model.complete([Message.user("hi")])


def test_from_settings_reads_key_from_named_env_var(provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-env")
    settings = SummarizerSettings(
        kind="openai", base_url=provider.base_url, model="sum-1", api_key_env="MY_KEY", timeout_seconds=7
    )
    model = OpenAIChatModel.from_settings(settings)
    assert (model.model, model.api_key, model.timeout, model.base_url) == ("sum-1", "sk-env", 7, provider.base_url)
    provider.responses.append((200, completion("summary")))
    assert model.complete([Message.user("x")]).message.text == "summary"
    assert provider.headers[0]["Authorization"] == "Bearer sk-env"


def test_from_settings_refuses_openai_without_key_and_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="NO_SUCH_KEY"):
        OpenAIChatModel.from_settings(SummarizerSettings(kind="openai", model="gpt-4o-mini", api_key_env="NO_SUCH_KEY"))
    with pytest.raises(ConfigError, match="summarizer.model"):
        # a profile refuses it when it loads; from_settings still checks what it is handed
        OpenAIChatModel.from_settings(SummarizerSettings.model_construct(kind="openai", model=None))
    local = OpenAIChatModel.from_settings(
        SummarizerSettings(kind="openai", model="m", base_url="http://127.0.0.1:1/v1", api_key_env="NO_SUCH_KEY")
    )
    assert local.api_key is None


def test_classify_http_error_without_a_server() -> None:
    assert isinstance(
        classify_http_error(400, b'{"error": {"message": "Please reduce the length of the messages."}}'),
        ContextOverflowError,
    )
    assert type(classify_http_error(400, b'{"error": {"message": "temperature must be <= 2"}}')) is HTTPModelError
    assert type(classify_http_error(500, b"maximum context length")) is HTTPModelError  # only 400/413 mean overflow


def test_overflow_triggers_request_error_and_a_retry_after_the_surface_shrank(
    provider: FakeProvider, tmp_path: Any
) -> None:
    """A provider that refuses prompts over a limit: the basic strategy compacts in its
    request_error hook, and the loop retries once the surface is smaller."""
    # the window is large enough that basic never compacts by threshold (only on overflow); the
    # user's messages are this session's bulk, so the instruction budget is kept small (5% keeps
    # the newest three): the provider's real limit is far below the configured window
    kernel = build_kernel(
        tmp_path, model={"context_window": 20_000, "reserved_output_tokens": 1000}, instructions={"budget_ratio": 0.05}
    )
    session = kernel.open_session()
    model = model_for(provider)
    limit = {"tokens": 10**9}
    seen: list[int] = []

    def respond(body: dict[str, Any]) -> tuple[int, Any]:
        size = len(orjson.dumps(body["messages"]))
        seen.append(size)
        if size > limit["tokens"]:
            return 400, {
                "error": {
                    "message": f"This model's maximum context length is {limit['tokens']} tokens. However, your messages resulted in {size} tokens.",
                    "code": "context_length_exceeded",
                }
            }
        return 200, completion(f"answer {len(seen)}", usage={"prompt_tokens": size // 4, "completion_tokens": 5})

    provider.responder = respond
    loop = AgentLoop(session, model)
    for i in range(12):
        loop.run(f"task {i}: " + "details " * 300)
    limit["tokens"] = seen[-1] // 2  # the next request no longer fits
    calls_before = len(seen)

    result = loop.run("one more question")

    types = [e.type for e in session.events]
    assert "compaction/summary" in types
    step_errors = [e for e in session.events if e.type == "step/end" and "error" in e.data]
    assert len(step_errors) == 1 and "ContextOverflowError" in step_errors[0].data["error"]
    assert result.reason == "completed" and result.retries == 1
    # the failed request was over the limit; the retried one was under it, after a compaction
    assert seen[calls_before] > limit["tokens"] >= seen[calls_before + 1]
    error_at = step_errors[0].seq
    summary_at = next(e.seq for e in session.events if e.type == "compaction/summary")
    assert error_at < summary_at
    assert session.events[-1].type == "turn/end" and session.events[-1].data["reason"] == "completed"


def test_overflow_that_cannot_be_fixed_ends_the_turn_with_error(provider: FakeProvider, tmp_path: Any) -> None:
    kernel = build_kernel(tmp_path)
    session = kernel.open_session()
    provider.responder = lambda body: (400, {"error": {"message": "prompt is too long: 99 tokens > 10 maximum"}})
    with pytest.raises(ContextOverflowError):
        AgentLoop(session, model_for(provider)).run("hello")
    # a one-message surface cannot be compacted: no retry, the turn is closed with error
    assert len(provider.requests) == 1
    assert session.events[-1].type == "turn/end" and session.events[-1].data["reason"] == "error"
    assert not any(e.type == "compaction/summary" for e in session.events)


def test_a_summarizer_profile_calls_the_http_model_with_the_directive_last(
    provider: FakeProvider, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUMMARY_KEY", "sk-sum")
    kernel = build_kernel(
        tmp_path,
        summarizer={"kind": "openai", "base_url": provider.base_url, "model": "sum-1", "api_key_env": "SUMMARY_KEY"},
    )
    assert isinstance(kernel.summarizer, OpenAIChatModel)
    kernel.summarizer.backoff_seconds = 0
    session = kernel.open_session()
    provider.responder = lambda body: (
        200,
        completion(
            "## Primary Request and Intent\n- fix it",
            usage={"prompt_tokens": 300, "completion_tokens": 12},
            model="sum-1",
        ),
    )
    for i in range(3):
        session.user(f"request {i} " + "words " * 100)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"reply {i} " + "more " * 100))
        session.end_turn()
    session.user("next")
    seqs = [n.seq for n in session.surface]
    result = session.compact(ctxkernel.Span(seqs[0], seqs[-2]), strategy="basic")
    sent = provider.requests[-1]["body"]
    assert sent["model"] == "sum-1" and provider.headers[-1]["Authorization"] == "Bearer sk-sum"
    assert sent["messages"][0]["role"] == "system"
    assert sent["messages"][1]["content"].startswith("request 0")  # the replayed prefix first...
    assert "Primary Request and Intent" in sent["messages"][-1]["content"]  # ...the directive last
    summary = next(e for e in session.events if e.type == "compaction/summary")
    span = summary.data["spans"][0]
    assert (span["provider"], span["model"], span["usage"]["input_tokens"]) == ("openai-compatible", "sum-1", 300)
    assert result.spans[0].summary is not None and "fix it" in result.spans[0].summary.text
