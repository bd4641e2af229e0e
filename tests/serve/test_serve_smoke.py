"""First contact: both APIs, streaming and not, through the official SDKs."""

from __future__ import annotations

from serve_fake_upstream import Reply


def test_openai_non_stream_and_stream(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    client = serve.openai(session="smoke-openai")
    upstream.script = lambda api, body: Reply("hello there, friend")
    reply = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "hello there, friend"
    assert reply.usage.prompt_tokens == upstream.received[-1].tokens
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello there, friend"},
        {"role": "user", "content": "again"},
    ]
    stream = client.chat.completions.create(
        model="fake-model", messages=history, stream=True, stream_options={"include_usage": True}
    )
    text = ""
    usage = None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text == "hello there, friend"
    assert usage is not None and usage.prompt_tokens == upstream.received[-1].tokens


def test_anthropic_non_stream_and_stream(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    client = serve.anthropic(session="smoke-anthropic")
    upstream.script = lambda api, body: Reply("bonjour")
    reply = client.messages.create(model="fake-model", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    assert reply.content[0].text == "bonjour"
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "bonjour"},
        {"role": "user", "content": "again"},
    ]
    with client.messages.stream(model="fake-model", max_tokens=100, messages=history) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "bonjour"
    assert final.stop_reason == "end_turn"


def test_chat_posts_skip_starlettes_stack_and_everything_else_is_routed(fake, serve_factory):
    # the chat routes' POSTs go to their handler directly (bench_serve.py); any other request
    # is Starlette's, routed as declared: a GET on a chat path is its 405, /healthz its answer
    import httpx

    upstream, _ = fake
    serve = serve_factory()
    routed: list[tuple[str, str]] = []
    stack = serve.app.build_middleware_stack()

    async def recording(scope, receive, send):
        if scope["type"] == "http":
            routed.append((scope["method"], scope["path"]))
        await stack(scope, receive, send)

    serve.app.middleware_stack = recording
    upstream.script = lambda api, body: Reply("direct")
    reply = serve.openai(session="direct").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "direct"
    reply = serve.anthropic(session="direct-a").messages.create(
        model="fake-model", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.content[0].text == "direct"
    assert routed == []
    with httpx.Client(base_url=serve.url) as http:
        assert http.get("/v1/chat/completions").status_code == 405
        assert http.get("/healthz").json()["status"] == "ok"
        bad = http.post("/v1/chat/completions", content=b"{not json")
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    assert routed == [("GET", "/v1/chat/completions"), ("GET", "/healthz")]
