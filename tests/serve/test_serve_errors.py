"""Bad input gets a 400 in the API's own shape naming the field, and leaves the log as it was;
upstream errors reach the client with their status; credentials never reach a log or a metric."""

from __future__ import annotations

import anthropic
import httpx
import openai
import orjson
import pytest
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.profile import load_profile


def stored_bytes(serve) -> dict[str, bytes]:
    home = load_profile(serve.profile).store.path
    from pathlib import Path

    return {str(p): p.read_bytes() for p in sorted(Path(home).rglob("*")) if p.is_file()}


OPENAI_BAD = [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "JSON object"),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "model", "model"),
    (b'{"model": "m", "messages": "hello"}', "messages", "list"),
    (b'{"model": "m", "messages": []}', "messages", "at least one"),
    (b'{"model": "m", "n": 2, "messages": [{"role": "user", "content": "x"}]}', "n", "n=1"),
    (b'{"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}', "stream", "boolean"),
    (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', "messages", "unknown role"),
    (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
        "tools[0]",
        "function",
    ),
    (b'{"model": "m", "messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}', "messages", "nope"),
    (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "pre"}]}',
        "messages",
        "prefill",
    ),
]


@pytest.mark.parametrize(("raw", "param", "words"), OPENAI_BAD)
def test_openai_bad_input_is_a_400_naming_the_field(fake, serve_factory, raw, param, words):
    serve = serve_factory()
    # a session with some history: the refusal must leave its log byte-identical
    serve.openai(session="kept").chat.completions.create(model="m", messages=[{"role": "user", "content": "before"}])
    before = stored_bytes(serve)
    r = httpx.post(
        f"{serve.url}/v1/chat/completions",
        content=raw,
        headers={"X-Ctxkernel-Session": "kept", "content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]
    assert stored_bytes(serve) == before


def test_openai_sdk_raises_bad_request_with_the_param(fake, serve_factory):
    serve = serve_factory()
    with pytest.raises(openai.BadRequestError) as info:
        serve.openai(session="sdk-bad").chat.completions.create(
            model="m", n=3, messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.body["param"] == "n"


ANTHROPIC_BAD = [
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}', "max_tokens"),
    (b'{"model": "m", "max_tokens": "ten", "messages": [{"role": "user", "content": "x"}]}', "max_tokens"),
    (b'{"model": "m", "max_tokens": 5, "system": 7, "messages": [{"role": "user", "content": "x"}]}', "system"),
    (b'{"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}', "messages"),
    (
        b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}',
        "tool_use_id",
    ),
    # was refused as "an assistant prefill": the message was empty, not the model's
    (
        b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": []}]}',
        "messages.0: the last message's content is an empty list; ctxkernel serve takes a last message with role 'user' "
        "and a non-empty string or list of content blocks",
    ),
    # an empty list between other messages was dropped without a word (an empty string is kept)
    (
        b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "a"}, '
        b'{"role": "assistant", "content": "b"}, {"role": "user", "content": []}, '
        b'{"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]}',
        "messages.2: a user message's content is an empty list; ctxkernel serve takes a user message's content "
        "as a string or a non-empty list of content blocks",
    ),
]


@pytest.mark.parametrize(("raw", "words"), ANTHROPIC_BAD)
def test_anthropic_bad_input_is_a_400_in_its_shape(fake, serve_factory, raw, words):
    serve = serve_factory()
    r = httpx.post(f"{serve.url}/v1/messages", content=raw, headers={"X-Ctxkernel-Session": "a-bad"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert words in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        serve.anthropic(session="a-bad").messages.create(model="m", max_tokens=5, messages=[])


def test_a_bad_session_header_is_refused(fake, serve_factory):
    serve = serve_factory()
    r = httpx.post(
        f"{serve.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={"X-Ctxkernel-Session": "../../etc/passwd"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "X-Ctxkernel-Session"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_upstream_errors_reach_the_client_with_their_status(fake, serve_factory, api, stream):
    upstream, _ = fake
    serve = serve_factory()
    if api == "openai":
        upstream.fail_next = [
            (
                429,
                {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "rate_limited"}},
            )
        ]
        with pytest.raises(openai.RateLimitError) as info:
            serve.openai(session=f"e-{api}-{stream}").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], stream=stream
            )
        assert info.value.body["message"] == "slow down"
    else:
        upstream.fail_next = [(529, {"type": "error", "error": {"type": "overloaded_error", "message": "overloaded"}})]
        with pytest.raises(anthropic.APIStatusError) as info:
            serve.anthropic(session=f"e-{api}-{stream}").messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}], stream=stream
            )
        assert info.value.status_code == 529
        assert "overloaded" in str(info.value)
    # the step is closed with the error, the turn stays open: the retry succeeds
    session = Kernel(load_profile(serve.profile)).open_session(f"e-{api}-{stream}", repair=False)
    assert session.events[-1].type == "step/end" and "HTTP" in session.events[-1].data["error"]
    upstream.script = lambda api_name, body: Reply("fine now")
    if api == "openai":
        reply = serve.openai(session=f"e-{api}-{stream}").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
        assert reply.choices[0].message.content == "fine now"
    else:
        reply = serve.anthropic(session=f"e-{api}-{stream}").messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
        assert reply.content[0].text == "fine now"


def test_unreachable_upstream_is_a_502_in_shape(fake, serve_factory, tmp_path):
    serve = serve_factory()
    serve.stop()
    serve.upstream_url = "http://127.0.0.1:9"  # discard port: nothing listens
    serve.start()
    with pytest.raises(openai.APIStatusError) as info:
        serve.openai(session="nowhere").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502
    assert "could not be reached" in info.value.body["message"]


def test_credentials_reach_the_upstream_and_nothing_else(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    serve.openai(session="creds").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    serve.anthropic(session="creds-a").messages.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
    )
    assert upstream.received[0].headers["authorization"] == "Bearer sk-test-client"
    # the anthropic SDK sends its key as x-api-key or (newer versions) as a bearer token
    sent = upstream.received[1].headers
    assert sent.get("x-api-key") == "sk-ant-test-client" or sent.get("authorization") == "Bearer sk-ant-test-client"
    assert upstream.received[1].headers["anthropic-version"]
    stored = b"".join(stored_bytes(serve).values())
    metrics = serve.proxy.metrics.render()[0]
    for secret in (b"sk-test-client", b"sk-ant-test-client"):
        assert secret not in stored and secret not in metrics


def test_api_key_env_replaces_the_client_credential(fake, serve_factory, monkeypatch):
    upstream, _ = fake
    monkeypatch.setenv("SERVE_TEST_KEY", "sk-server-side")
    serve = serve_factory(api_key_env="SERVE_TEST_KEY")
    serve.openai(session="server-key").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    serve.anthropic(session="server-key-a").messages.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
    )
    assert upstream.received[0].headers["authorization"] == "Bearer sk-server-side"
    assert upstream.received[1].headers["x-api-key"] == "sk-server-side"
    assert "authorization" not in upstream.received[1].headers


def test_models_healthz_and_metrics(fake, serve_factory):
    serve = serve_factory()
    models = serve.openai().models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    health = httpx.get(f"{serve.url}/healthz").json()
    assert health == {"status": "ok", "profile": "serve-test", "store": "jsonl"}
    serve.openai(session="metered").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "count me"}]
    )
    httpx.post(f"{serve.url}/v1/chat/completions", content=b"{")
    text = httpx.get(f"{serve.url}/metrics").text
    assert 'ctxkernel_serve_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
    assert 'ctxkernel_serve_requests_total{route="/v1/chat/completions",status="400"} 1.0' in text
    assert 'ctxkernel_serve_errors_total{kind="bad_request"} 1.0' in text
    assert "ctxkernel_serve_upstream_latency_seconds_count" in text
    client = float(
        next(
            line.split()[-1]
            for line in text.splitlines()
            if line.startswith("ctxkernel_serve_client_prompt_tokens_total{")
        )
    )
    sent = float(
        next(
            line.split()[-1]
            for line in text.splitlines()
            if line.startswith("ctxkernel_serve_upstream_prompt_tokens_total{")
        )
    )
    assert client > 0 and sent > 0


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_stream_cut_short_is_an_error_and_commits_nothing(fake, serve_factory, api):
    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply("half of a reply")
    upstream.cut_stream = True
    serve = serve_factory()
    sid = f"cut-{api}"
    with pytest.raises((openai.APIError, anthropic.APIError)):
        if api == "openai":
            for _ in serve.openai(session=sid).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], stream=True
            ):
                pass
        else:
            with serve.anthropic(session=sid).messages.stream(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            ) as stream:
                stream.get_final_message()
    events = Kernel(load_profile(serve.profile)).open_session(sid, repair=False).events
    assert "assistant/message" not in [e.type for e in events]
    assert events[-1].type == "step/end" and "before the reply was complete" in events[-1].data["error"]


def big_tools(count: int = 25) -> list[dict]:
    """A client's tool set like Claude Code's: 25 tools with long descriptions (~4,700 tokens)."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": " ".join(
                    f"Use tool {i} to handle case {j} of the workflow carefully." for j in range(16)
                ),
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
        for i in range(count)
    ]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_header_that_leaves_no_room_is_a_400_naming_the_smallest_window(fake, serve_factory, api):
    upstream, _ = fake
    serve = serve_factory()  # an 8,000-token window, 7,000 effective
    if api == "openai":
        first = serve.openai(session="kept").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}]
        )
        said = first.choices[0].message.content
    else:
        answer = serve.anthropic(session="kept").messages.create(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "go"}]
        )
        said = answer.content[0].text
    before = stored_bytes(serve)
    calls = len(upstream.received)
    if api == "openai":
        with pytest.raises(openai.BadRequestError) as caught:
            serve.openai(session="kept").chat.completions.create(
                model="m",
                messages=[
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": said},
                    {"role": "user", "content": "more"},
                ],
                tools=big_tools(),
            )
    else:
        tools = [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in big_tools()
        ]
        with pytest.raises(anthropic.BadRequestError) as caught:
            serve.anthropic(session="kept").messages.create(
                model="m",
                max_tokens=100,
                messages=[
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": said},
                    {"role": "user", "content": "more"},
                ],
                tools=tools,
            )
    text = str(caught.value)
    assert "request header" in text and "smallest context_window that works is" in text
    assert len(upstream.received) == calls  # nothing reached the provider
    assert stored_bytes(serve) == before


DEEP = "@deep@"  # where a case's value nested `depth` levels goes (no encoder writes it that deep)
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {}}]}
DEEP_PARTS = {
    "openai arguments": (
        "openai",
        {
            "messages": [
                CALL | {"tool_calls": [{**CALL["tool_calls"][0], "function": {"name": "f", "arguments": DEEP}}]}
            ]
        },
        "messages[3]",
    ),
    "openai part": (
        "openai",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": DEEP}]}]},
        "messages[3]",
    ),
    "openai field": ("openai", {"weird": DEEP}, "weird"),
    "openai tool": (
        "openai",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]},
        "tools",
    ),
    "anthropic input": (
        "anthropic",
        {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": DEEP}]}]},
        "messages.3",
    ),
    "anthropic part": (
        "anthropic",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": DEEP}]}]},
        "messages.3",
    ),
    "anthropic field": ("anthropic", {"metadata": DEEP}, "metadata"),
    "anthropic tool": ("anthropic", {"tools": [{"name": "f", "input_schema": DEEP}]}, "tools"),
    "responses arguments": (
        "responses",
        {"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": DEEP}]},
        "input[3]",
    ),
    "responses part": (
        "responses",
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": DEEP}]}]},
        "input[3]",
    ),
    "responses tool": ("responses", {"tools": [{"type": "function", "name": "f", "parameters": DEEP}]}, "tools"),
}


def deep_body(api: str, extra: dict, depth: int) -> bytes:
    """A request of ``api`` in session "kept" after its first turn, with ``extra``'s lists added to
    the history and its other fields set, :data:`DEEP` standing for ``depth`` levels of arrays
    (inside an argument string, the JSON such a string holds)."""
    history = [{"role": "user", "content": "before"}]
    field = "input" if api == "responses" else "messages"
    body: dict = {"model": "fake-model", field: history}
    if api == "anthropic":
        body["max_tokens"] = 5
    if depth:
        body[field] = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    for name, value in extra.items():
        body[name] = [*body[name], *value] if name == field else value
    if field in extra and extra[field][-1].get("role") in ("assistant", None):  # a call: its result ends it
        result = {
            "openai": {"role": "tool", "tool_call_id": "c1", "content": "r"},
            "anthropic": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
            "responses": {"type": "function_call_output", "call_id": "c1", "output": "r"},
        }[api]
        body[field] = [*body[field], result]
    nest = "[" * depth + "1" + "]" * depth
    raw = orjson.dumps(body)
    # in an argument string its JSON (escaped quotes: a string's JSON in the body's string)
    raw = raw.replace(f'"arguments":"{DEEP}"'.encode(), f'"arguments":"{{\\"a\\":{nest}}}"'.encode())
    return raw.replace(f'"{DEEP}"'.encode(), nest.encode())


@pytest.mark.parametrize("depth", [300, 1000])
@pytest.mark.parametrize("case", list(DEEP_PARTS))
def test_a_part_nested_deeper_than_serve_writes_is_a_400_naming_it(fake, serve_factory, case, depth):
    # orjson reads 1,024 levels and writes 254: such a part failed where serve first wrote it
    # (the memo's key, a hash, the upstream's body, the meter, a kept response) with a 500
    api, extra, where = DEEP_PARTS[case]
    serve = serve_factory()
    url = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}[api]
    headers = {"X-Ctxkernel-Session": "kept", "content-type": "application/json"}
    first = orjson.loads(deep_body(api, {}, 0))
    assert httpx.post(f"{serve.url}{url}", json=first, headers=headers, timeout=30).status_code == 200
    before = stored_bytes(serve)
    r = httpx.post(f"{serve.url}{url}", content=deep_body(api, extra, depth), headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{where}: nested too deeply")
    assert "at most 240 levels" in error["message"] and "254" in error["message"]
    assert stored_bytes(serve) == before
