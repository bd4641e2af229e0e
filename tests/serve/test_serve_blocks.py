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
from ctxkernel.profile import load_profile

from .conftest import write_profile

#: these tests check that blocks reach the provider as they came: the kernel's own cache
#: breakpoints, added when a client sends none, are tested in test_serve_cache.py
NO_HINTS = "[cache]\nhints = false\n"


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
def test_mid_conversation_system_message_passes_through(fake, serve_factory, tmp_path, stream):
    # Claude Code 2.1.x sends {"role": "system"} inside messages (beta mid-conversation-system-2026-04-07)
    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, tables=NO_HINTS))
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


REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qyP"}
SERVER_CALL = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "ctxkernel"}}
SERVER_RESULT = {
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


def reply_then_continue(upstream, serve, session: str, stream: bool, blocks: list[dict], tools: list[dict]) -> list:
    """A reply whose content starts with ``blocks``, then the client's next request with that reply
    in its history; returns the reply's blocks as the client got them and what the provider got next."""
    upstream.script = lambda api, body: Reply("found it", blocks=blocks)
    client = serve.anthropic(session=session)
    history = [{"role": "user", "content": "search the web"}]
    kwargs = {"model": "fake-model", "max_tokens": 64, "tools": tools}
    if stream:
        with client.messages.stream(messages=history, **kwargs) as events:
            reply = events.get_final_message()
    else:
        reply = client.messages.create(messages=history, **kwargs)
    got = [b.model_dump(exclude_none=True) for b in reply.content]
    upstream.script = lambda api, body: Reply("and more")
    history += [{"role": "assistant", "content": got}, {"role": "user", "content": "thanks"}]
    assert client.messages.create(messages=history, **kwargs).content[0].text == "and more"
    return [got, upstream.received[-1].body["messages"]]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_redacted_thinking_goes_back_in_its_place(fake, serve_factory, stream):
    # a thinking turn must start with its thinking block: dropped, the provider refuses the next request
    upstream, _ = fake
    serve = serve_factory()
    tools = [{"name": "read_file", "input_schema": {"type": "object"}}]
    got, sent = reply_then_continue(upstream, serve, f"redacted-{stream}", stream, [REDACTED], tools)
    assert [b["type"] for b in got] == ["redacted_thinking", "text"]
    assert sent[1] == {"role": "assistant", "content": [REDACTED, {"type": "text", "text": "found it"}]}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_server_tool_blocks_need_no_client_result(fake, serve_factory, tmp_path, stream):
    # a server tool's call and result are a pair the provider ran: the history with them is
    # accepted (no client result is due), and both go back to the provider as they came
    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, tables=NO_HINTS))
    tools = [{"type": "web_search_20250305", "name": "web_search"}]
    blocks = [SERVER_CALL, SERVER_RESULT]
    got, sent = reply_then_continue(upstream, serve, f"server-tools-{stream}", stream, blocks, tools)
    assert [b["type"] for b in got] == ["server_tool_use", "web_search_tool_result", "text"]
    assert sent[1]["content"][:2] == blocks
    assert upstream.received[-1].body["tools"] == tools


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_images_are_stored_as_blobs_and_sent_as_they_came(fake, serve_factory, tmp_path, stream):
    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, tables=NO_HINTS))
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
    assert sent.tokens >= 667  # 1000 x 500 / 750, Anthropic's rule (tests/core/test_media.py)
    # a restarted serve reads the bytes back from the store for the next request
    serve.restart()
    messages += [{"role": "assistant", "content": "a red square"}, {"role": "user", "content": "sure?"}]
    serve.anthropic(session=f"image-{stream}").messages.create(model="fake-model", max_tokens=64, messages=messages)
    assert upstream.received[-1].body["messages"][0]["content"][0] == block


def test_openai_name_is_kept(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("hello alice")
    messages = [
        {"role": "user", "name": "alice", "content": "hi, I am Alice"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "name": "bob", "content": "and I am Bob"},
    ]
    serve.openai(session="names").chat.completions.create(model="fake-model", messages=messages)
    assert upstream.received[-1].body["messages"] == messages


def test_openai_image_is_sent_as_it_came(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("seen")
    url = "data:image/png;base64," + base64.b64encode(png(300, 300)).decode()
    image = {"type": "image_url", "image_url": {"url": url, "detail": "low"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}]
    serve.openai(session="openai-image").chat.completions.create(model="fake-model", messages=messages)
    sent = upstream.received[-1]
    assert sent.body["messages"] == messages
    assert sent.tokens >= 85  # a low-detail image (tests/core/test_media.py)


def test_openai_tool_result_array_is_kept(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("read")
    result = [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]
    messages = [
        {"role": "user", "content": "take both parts"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "parts", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]
    tools = [{"type": "function", "function": {"name": "parts", "parameters": {"type": "object"}}}]
    serve.openai(session="arrays-openai").chat.completions.create(model="fake-model", messages=messages, tools=tools)
    assert upstream.received[-1].body["messages"][2]["content"] == result


def test_documents_are_stored_and_counted_by_their_pages(fake, serve_factory, tmp_path):
    from pypdf import PdfWriter

    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, window=32000, reserved=2000, tables=NO_HINTS))
    upstream.script = lambda api, body: Reply("three blank pages")
    writer = PdfWriter()
    for _ in range(3):
        writer.add_blank_page(612, 792)
    out = io.BytesIO()
    writer.write(out)
    data = out.getvalue()
    document = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(data).decode()},
    }
    messages = [{"role": "user", "content": [document, {"type": "text", "text": "summarise"}]}]
    serve.anthropic(session="pdf").messages.create(model="fake-model", max_tokens=64, messages=messages)
    sent = upstream.received[-1]
    assert sent.body["messages"][0]["content"] == [document, {"type": "text", "text": "summarise"}]
    assert sent.tokens >= 3 * 3000  # 3,000 tokens a page (tests/core/test_media.py)
    kernel = Kernel(load_profile(serve.profile))
    assert [kernel.store.blob_get(b.key) for b in kernel.store.blob_list("media/")] == [data]


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


def test_mid_stream_error_keeps_its_type(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply(
        "partial", stream_error={"type": "overloaded_error", "message": "Overloaded"}
    )
    body = {"model": "fake-model", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with (
        httpx.Client(base_url=serve.url, timeout=30) as http,
        http.stream("POST", "/v1/messages", json=body, headers={"x-api-key": "k"}) as response,
    ):
        text = "".join(response.iter_text())
    errors = [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and '"error"' in line]
    assert errors[-1] == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_retry_headers_pass_through(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    upstream.fail_headers = {"x-should-retry": "true", "retry-after": "3", "retry-after-ms": "2500"}
    body = {"model": "fake-model", "max_tokens": 64, "messages": [{"role": "user", "content": "again"}]}
    with httpx.Client(base_url=serve.url, timeout=30) as http:
        for stream in (False, True):
            upstream.fail_next.append((529, overloaded))
            answer = http.post("/v1/messages", json={**body, "stream": stream}, headers={"x-api-key": "k"})
            assert answer.status_code == 529
            assert answer.headers["x-should-retry"] == "true" and answer.headers["retry-after"] == "3"
            assert answer.headers["retry-after-ms"] == "2500"
            assert answer.json()["error"]["type"] == "overloaded_error"
    # the SDK sees the provider's own error type
    upstream.fail_next.append((529, overloaded))
    with pytest.raises(anthropic.APIStatusError) as raised:
        serve.anthropic(session="overload").messages.create(
            model="fake-model", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    assert raised.value.status_code == 529 and raised.value.body["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize("inject", [None, "when_client_has_tools", "always"], ids=["default", "tools", "always"])
def test_strategy_tools_only_where_they_belong(fake, serve_factory, tmp_path, inject):
    upstream, _ = fake
    extra = 'capability_order = ["handoff", "basic"]'
    if inject is not None:
        # the [serve] table comes after [profile]'s keys: write_profile puts extra_profile there
        extra += f'\n\n[serve]\ninject_tools = "{inject}"'
    profile = write_profile(
        tmp_path, strategies='["handoff", "basic"]', extra_profile=extra, window=32000, reserved=2000
    )
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
