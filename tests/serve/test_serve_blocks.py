"""Every content block a client sends reaches the provider as it came, through the official SDKs:
Claude Code's mid-conversation system messages, redacted thinking, server tools' blocks, images
(stored as blobs, counted with the provider's rules), OpenAI's ``name``, tool-result arrays; the
upstream's error types and retry headers pass through; strategy tools only where they belong;
``count_tokens`` answers with what serve would send."""

from __future__ import annotations

import base64
import io

import anthropic
import httpx
import orjson
import pytest
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.media import anthropic_image_tokens, openai_image_tokens
from ctxkernel.profile import load_profile

from .conftest import write_profile


def png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


def image_block(data: bytes) -> dict:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()},
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_mid_conversation_system_message_passes_through(fake, serve_factory, stream):
    # Claude Code 2.1.x sends {"role": "system"} inside messages (beta mid-conversation-system-2026-04-07)
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("ok")
    client = serve.anthropic(session=f"midsys-{stream}")
    system = {"role": "system", "content": "<system-reminder>the plan changed</system-reminder>"}
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "go on"},
        system,
    ]
    kwargs = {
        "model": "fake-model",
        "max_tokens": 64,
        "messages": messages,
        "betas": ["mid-conversation-system-2026-04-07"],
    }
    if stream:
        with client.beta.messages.stream(**kwargs) as events:
            reply = events.get_final_message()
    else:
        reply = client.beta.messages.create(**kwargs)
    assert reply.content[0].text == "ok"
    sent = upstream.received[-1]
    assert sent.body["messages"][-1] == system
    assert [m["role"] for m in sent.body["messages"]] == ["user", "assistant", "user", "system"]
    assert sent.headers["anthropic-beta"] == "mid-conversation-system-2026-04-07"
    # the next request continues the same session: the system message matched, nothing forked
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "thanks"}]
    client.beta.messages.create(**{**kwargs, "messages": messages})
    assert upstream.received[-1].body["messages"][3] == system
    session = Kernel(load_profile(serve.profile)).open_session(f"midsys-{stream}", repair=False)
    assert not any(e.type == "surface/drop" for e in session.events)


def test_redacted_thinking_and_server_tools_are_kept(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qyP"}
    server_call = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "ctxkernel"}}
    server_result = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": [
            {
                "type": "web_search_result",
                "url": "https://example.org",
                "title": "x",
                "encrypted_content": "Eq0x",
                "page_age": None,
            }
        ],
    }
    for stream in (False, True):
        upstream.script = lambda api, body: Reply("found it", blocks=[redacted, server_call, server_result])
        client = serve.anthropic(session=f"blocks-{stream}")
        history = [{"role": "user", "content": "search the web"}]
        kwargs = {
            "model": "fake-model",
            "max_tokens": 64,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        }
        if stream:
            with client.messages.stream(messages=history, **kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(messages=history, **kwargs)
        blocks = [b.model_dump(exclude_none=True) for b in reply.content]
        assert [b["type"] for b in blocks] == ["redacted_thinking", "server_tool_use", "web_search_tool_result", "text"]
        upstream.script = lambda api, body: Reply("and more")
        # the history with the server tool's pair is accepted (no client result is due), and every
        # block goes back to the provider as it came
        history += [{"role": "assistant", "content": blocks}, {"role": "user", "content": "thanks"}]
        assert client.messages.create(messages=history, **kwargs).content[0].text == "and more"
        sent = upstream.received[-1].body["messages"]
        assert sent[1]["content"][:3] == [redacted, server_call, server_result]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_images_are_stored_as_blobs_and_sent_as_they_came(fake, serve_factory, stream):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("a red square")
    data = png(1000, 500)
    block = image_block(data)
    client = serve.anthropic(session=f"image-{stream}")
    messages = [{"role": "user", "content": [block, {"type": "text", "text": "what is this?"}]}]
    if stream:
        with client.messages.stream(model="fake-model", max_tokens=64, messages=messages) as events:
            events.get_final_message()
    else:
        client.messages.create(model="fake-model", max_tokens=64, messages=messages)
    sent = upstream.received[-1]
    assert sent.body["messages"][0]["content"] == [block, {"type": "text", "text": "what is this?"}]
    # the log holds a reference, the blob table the bytes (once), the meter the provider's cost
    kernel = Kernel(load_profile(serve.profile))
    session = kernel.open_session(f"image-{stream}", repair=False)
    log = b"".join(orjson.dumps(e.data) for e in session.events)
    assert block["source"]["data"][:200].encode() not in log
    blobs = kernel.store.blob_list("media/")
    assert len(blobs) == 1 and kernel.store.blob_get(blobs[0].key) == data
    assert anthropic_image_tokens((1000, 500)) == 667
    assert sent.tokens >= 667
    # a restarted serve reads the bytes back from the store for the next request
    serve.restart()
    messages += [{"role": "assistant", "content": "a red square"}, {"role": "user", "content": "sure?"}]
    serve.anthropic(session=f"image-{stream}").messages.create(model="fake-model", max_tokens=64, messages=messages)
    assert upstream.received[-1].body["messages"][0]["content"][0] == block


def test_openai_names_images_and_tool_result_arrays(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("seen")
    url = "data:image/png;base64," + base64.b64encode(png(300, 300)).decode()
    image = {"type": "image_url", "image_url": {"url": url, "detail": "low"}}
    messages = [
        {"role": "user", "name": "alice", "content": [{"type": "text", "text": "look"}, image]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}],
        },
    ]
    serve.openai(session="names").chat.completions.create(model="fake-model", messages=messages)
    sent = upstream.received[-1].body["messages"]
    assert sent[0] == messages[0]
    assert sent[2]["content"] == messages[2]["content"]
    assert openai_image_tokens((300, 300), "low") == 85


def test_tool_result_with_an_image_keeps_its_array(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("a screenshot")
    block = image_block(png(64, 64))
    result = [{"type": "text", "text": "screenshot taken"}, block]
    messages = [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result}]},
    ]
    serve.anthropic(session="arrays").messages.create(model="fake-model", max_tokens=64, messages=messages)
    assert upstream.received[-1].body["messages"][2]["content"][0]["content"] == result


def test_mid_stream_error_type_and_retry_headers_pass_through(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply(
        "partial", stream_error={"type": "overloaded_error", "message": "Overloaded"}
    )
    body = {"model": "fake-model", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=serve.url, timeout=30) as http:
        with http.stream("POST", "/v1/messages", json=body, headers={"x-api-key": "k"}) as response:
            text = "".join(response.iter_text())
        errors = [
            orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and '"error"' in line
        ]
        assert errors[-1] == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        # an upstream status error keeps x-should-retry
        upstream.fail_next.append(
            (529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        )
        upstream.fail_headers = {"x-should-retry": "true", "retry-after": "3"}
        answer = http.post(
            "/v1/messages", json={**body, "stream": False, "messages": [{"role": "user", "content": "again"}]}
        )
    assert answer.status_code == 529
    assert answer.headers["x-should-retry"] == "true" and answer.headers["retry-after"] == "3"
    assert answer.json()["error"]["type"] == "overloaded_error"
    # the SDK sees the provider's own error type
    upstream.fail_next.append((529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    with pytest.raises(anthropic.APIStatusError) as raised:
        serve.anthropic(session="overload").messages.create(
            model="fake-model", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    assert raised.value.status_code == 529 and raised.value.body["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize("inject", ["when_client_has_tools", "always"])
def test_strategy_tools_only_where_they_belong(fake, serve_factory, tmp_path, inject):
    upstream, _ = fake
    extra = 'capability_order = ["handoff", "basic"]\n\n[serve]\ninject_tools = "' + inject + '"'
    profile = write_profile(
        tmp_path, strategies='["handoff", "basic"]', extra_profile=extra, window=32000, reserved=2000
    )
    # the [serve] table must come after [profile]'s keys: write_profile puts extra_profile there
    serve = serve_factory(profile)
    upstream.script = lambda api, body: Reply("a title")
    serve.anthropic(session=f"title-{inject}").messages.create(
        model="fake-model", max_tokens=16, messages=[{"role": "user", "content": "name this chat"}]
    )
    tools = upstream.received[-1].body.get("tools")
    if inject == "always":
        assert tools and any(t["name"].startswith("notes_") for t in tools)
    else:
        assert tools is None
    serve.openai(session=f"tools-{inject}").chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "go"}],
        tools=[{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}],
    )
    names = [t["function"]["name"] for t in upstream.received[-1].body["tools"]]
    assert names[0] == "read_file" and any(n.startswith("notes_") for n in names)


def test_count_tokens_answers_what_serve_would_send(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    client = serve.anthropic(session="counting")
    upstream.script = lambda api, body: Reply("short answer")
    messages = [{"role": "user", "content": "hello there"}]
    before = client.messages.count_tokens(model="fake-model", messages=messages)
    client.messages.create(model="fake-model", max_tokens=32, messages=messages)
    assert before.input_tokens == upstream.received[-1].tokens
    # a history far beyond the window is counted as serve would send it: within the effective window
    big = "word " * 20000
    messages += [{"role": "assistant", "content": "short answer"}, {"role": "user", "content": big}]
    counted = client.messages.count_tokens(model="fake-model", messages=messages)
    assert counted.input_tokens <= 7000
    assert upstream.received[-1].tokens < counted.input_tokens or counted.input_tokens == 7000
