"""The prompt cache through ``serve``, with the official SDKs as clients: the kernel's
``cache_control`` breakpoints when the client sent none (after the tools, after the system prompt,
at the last message the previous request also held, at the last message), the client's own kept
within the provider's limit of four, and ``prompt_cache_key`` set to the session."""

from __future__ import annotations

import re
from typing import Any

import pytest
from serve_fake_upstream import Reply

from ctxkernel.convert import count_cache_breakpoints

TOOLS = [
    {
        "name": "read",
        "description": "read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "name": "grep",
        "description": "search files",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
]
SYSTEM = "You are a careful coding agent. " * 20


def _marked_blocks(body: dict[str, Any]) -> list[tuple[int, int]]:
    """(message index, block index) of every message block carrying a breakpoint."""
    return [
        (i, j)
        for i, m in enumerate(body["messages"])
        for j, b in enumerate(m["content"] if isinstance(m["content"], list) else [])
        if b.get("cache_control")
    ]


def _history(turns: int) -> list[dict[str, Any]]:
    """A client's Anthropic history of ``turns`` tool round trips, ending with the user's results."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "read the files and report"}]
    for i in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "read", "input": {"path": f"f{i}.py"}}],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"x = {i}\n" * 30}],
            }
        )
    return messages


def _strip(messages: list[dict[str, Any]]) -> list[Any]:
    return [
        [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]
        if isinstance(m["content"], list)
        else m["content"]
        for m in messages
    ]


def test_anthropic_gets_the_kernels_breakpoints_when_the_client_sent_none(fake, serve_factory):
    upstream, _ = fake
    client = serve_factory().anthropic(session="cache-anthropic")
    upstream.script = lambda api, body: Reply("", [("read", {"path": "next.py"})])
    messages = _history(1)
    for _ in range(2):  # an agent loop: the reply's call is run and its result sent back
        reply = client.messages.create(
            model="fake-model", max_tokens=100, system=SYSTEM, tools=TOOLS, messages=messages
        )
        call = next(b for b in reply.content if b.type == "tool_use")
        messages = [
            *messages,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "y = 2\n" * 30}]},
        ]
    first, second = upstream.received[-2].body, upstream.received[-1].body
    for body in (first, second):
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        assert all("cache_control" not in t for t in body["tools"][:-1])
        assert isinstance(body["system"], list) and body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    # the first request of the session: only its last message is marked
    assert _marked_blocks(first) == [(len(first["messages"]) - 1, 0)]
    assert count_cache_breakpoints(first) == 3
    # the second: its last message, and the last one the first request also held (its end), so
    # the provider reads the first request's whole prefix from the cache
    marks = _marked_blocks(second)
    assert len(marks) == 2 and marks[-1][0] == len(second["messages"]) - 1
    shared = marks[0][0]
    assert shared == len(first["messages"]) - 1
    assert _strip(second["messages"][: shared + 1]) == _strip(first["messages"])
    assert count_cache_breakpoints(second) == 4


def test_anthropic_keeps_the_clients_own_breakpoints(fake, serve_factory):
    upstream, _ = fake
    client = serve_factory().anthropic(session="cache-anthropic-own")
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    messages = _history(1)
    messages[1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    client.messages.create(model="fake-model", max_tokens=100, system=system, tools=TOOLS, messages=messages)
    body = upstream.received[-1].body
    assert body["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}  # as the client sent it
    assert all("cache_control" not in t for t in body["tools"])  # none of the kernel's added
    assert _marked_blocks(body) == [(len(body["messages"]) - 1, 0)]  # the client's rolling mark, at the end
    assert count_cache_breakpoints(body) == 2


def test_anthropic_leaves_out_the_clients_breakpoints_past_four(fake, serve_factory):
    upstream, _ = fake
    client = serve_factory().anthropic(session="cache-anthropic-five")
    tools = [{**t, "cache_control": {"type": "ephemeral"}} for t in TOOLS]
    system = [
        {"type": "text", "text": "first part", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "second part", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "third part", "cache_control": {"type": "ephemeral"}},
    ]
    messages = _history(1)
    messages[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    client.messages.create(model="fake-model", max_tokens=100, system=system, tools=tools, messages=messages)
    body = upstream.received[-1].body
    assert count_cache_breakpoints(body) == 4
    # kept in the provider's order: both tools, then the first two system blocks
    assert [bool(t.get("cache_control")) for t in body["tools"]] == [True, True]
    assert [bool(b.get("cache_control")) for b in body["system"]] == [True, True, False]
    assert _marked_blocks(body) == []


def test_openai_gets_the_sessions_prompt_cache_key(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("fine")
    keys = {}
    for session in ("cache-openai-a", "cache-openai-b"):
        client = serve.openai(session=session)
        history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
        client.chat.completions.create(model="fake-model", messages=history)
        history += [{"role": "assistant", "content": "fine"}, {"role": "user", "content": "again"}]
        client.chat.completions.create(model="fake-model", messages=history, stream=True)
        a, b = upstream.received[-2].body, upstream.received[-1].body
        assert a["prompt_cache_key"] == b["prompt_cache_key"]
        assert re.fullmatch(r"ctxkernel-[0-9a-f]{32}", a["prompt_cache_key"])
        assert session not in a["prompt_cache_key"]  # a digest: the session's name is not sent
        keys[session] = a["prompt_cache_key"]
    assert len(set(keys.values())) == 2


def test_openai_keeps_the_clients_own_prompt_cache_key(fake, serve_factory):
    upstream, _ = fake
    client = serve_factory().openai(session="cache-openai-own")
    client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], prompt_cache_key="my-own-key"
    )
    assert upstream.received[-1].body["prompt_cache_key"] == "my-own-key"


def test_no_hints_when_the_profile_turns_them_off(fake, serve_factory, tmp_path):
    from .conftest import write_profile

    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, tables="[cache]\nhints = false\n"))
    serve.openai(session="cache-off").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert "prompt_cache_key" not in upstream.received[-1].body
    serve.anthropic(session="cache-off-a").messages.create(
        model="fake-model", max_tokens=100, system=SYSTEM, tools=TOOLS, messages=[{"role": "user", "content": "hi"}]
    )
    assert count_cache_breakpoints(upstream.received[-1].body) == 0


@pytest.mark.parametrize("upstream_kind", ["chat", "responses"])
def test_the_responses_api_gets_the_sessions_prompt_cache_key(fake, serve_factory, upstream_kind):
    # Codex talks the Responses API: translated to Chat Completions or forwarded as it came, the
    # upstream body carries the session's key, and the client's own key wins
    upstream, server = fake
    config = {"responses_upstream": f"{server.url}/v1"} if upstream_kind == "responses" else {}
    serve = serve_factory(**config)
    upstream.script = lambda api, body: Reply("fine")
    client = serve.openai(session=f"cache-responses-{upstream_kind}")
    client.responses.create(model="fake-model", input="hi", store=False)
    client.responses.create(model="fake-model", input="hi again", store=False)
    a, b = upstream.received[-2].body, upstream.received[-1].body
    assert a["prompt_cache_key"] == b["prompt_cache_key"]
    assert re.fullmatch(r"ctxkernel-[0-9a-f]{32}", a["prompt_cache_key"])
    client.responses.create(model="fake-model", input="mine", store=False, prompt_cache_key="my-own-key")
    assert upstream.received[-1].body["prompt_cache_key"] == "my-own-key"
