"""Converters between kernel messages and the OpenAI / Anthropic wire formats."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxkernel import EventError, Message, ReasoningBlock, Source, TextBlock, ToolCallBlock
from ctxkernel.convert import (
    from_anthropic_message,
    from_anthropic_request,
    from_openai_message,
    from_openai_messages,
    reply_to_message,
    to_anthropic_request,
    to_openai_messages,
)

MODEL = Source(kind="model")


def conversation() -> list[Message]:
    return [
        Message.user("fix parser.py"),
        Message.assistant(
            "I'll look.",
            [ToolCallBlock("c1", "read", {"path": "parser.py"}), ToolCallBlock("c2", "grep", {"q": "def"})],
        ),
        Message.tool("c1", "def parse(): ..."),
        Message.tool("c2", "no match", is_error=True),
        Message.assistant("", [ToolCallBlock("c3", "edit", {"path": "parser.py", "line": 3})]),
        Message.tool("c3", "edited"),
        Message.assistant("Done."),
        Message.user("thanks"),
    ]


def strip_sources(messages: list[Message]) -> list[tuple[str, tuple[Any, ...]]]:
    return [(m.role, m.content) for m in messages]


def test_openai_round_trip_keeps_calls_results_and_order() -> None:
    wire = to_openai_messages(conversation(), system="You are terse.")
    assert wire[0] == {"role": "system", "content": "You are terse."}
    assert wire[2]["tool_calls"][0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path":"parser.py"}'},
    }
    assert wire[5]["content"] is None  # tool-call-only assistant message: null content, as the API wants
    assert [m["role"] for m in wire] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    system, back = from_openai_messages(wire)
    assert system == "You are terse."
    expected = conversation()
    # chat completions has no error flag on tool messages: it is carried by the content only
    expected[3] = Message.tool("c2", "no match")
    assert strip_sources(back) == strip_sources(expected)


def test_openai_system_and_developer_messages_join_into_the_system_text() -> None:
    system, messages = from_openai_messages(
        [
            {"role": "system", "content": "a"},
            {"role": "user", "content": "hi"},
            {"role": "developer", "content": [{"type": "text", "text": "b"}]},
        ]
    )
    assert system == "a\n\nb" and strip_sources(messages) == strip_sources([Message.user("hi")])
    assert to_openai_messages([Message.user("x")]) == [{"role": "user", "content": "x"}]  # no empty system message


def test_openai_unparsable_arguments_survive_a_round_trip() -> None:
    raw = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}],
    }
    message = from_openai_message(raw)
    assert message is not None and message.tool_calls[0].arguments == {"_raw": "{not json"}
    assert to_openai_messages([message])[0]["tool_calls"][0]["function"]["arguments"] == "{not json"


def test_openai_reasoning_content_is_read_and_sent_back_only_on_request() -> None:
    message = from_openai_message({"role": "assistant", "content": "a", "reasoning_content": "hmm"})
    assert message is not None and message.content == (ReasoningBlock("hmm"), TextBlock("a"))
    assert "reasoning_content" not in to_openai_messages([message])[0]
    assert to_openai_messages([message], reasoning_content=True)[0]["reasoning_content"] == "hmm"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"role": "robot", "content": "x"}, "unknown role 'robot'"),
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}, r"tool_calls\[0\] needs an 'id'"),
        ({"role": "user", "content": 5}, "string or a list of parts"),
    ],
)
def test_openai_malformed_messages_are_refused_with_the_reason(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(EventError, match=match):
        from_openai_message(raw)


def test_anthropic_request_alternates_roles_and_nests_tool_results() -> None:
    body = to_anthropic_request(
        conversation(),
        system="You are terse.",
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "read",
                    "description": "read a file",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                },
            }
        ],
    )
    assert body["system"] == "You are terse."
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert all(a != b for a, b in zip(roles, roles[1:]))
    results = body["messages"][2]["content"]
    assert results == [
        {"type": "tool_result", "tool_use_id": "c1", "content": "def parse(): ..."},
        {"type": "tool_result", "tool_use_id": "c2", "content": "no match", "is_error": True},
    ]
    assert body["messages"][1]["content"][1] == {
        "type": "tool_use",
        "id": "c1",
        "name": "read",
        "input": {"path": "parser.py"},
    }
    assert body["tools"] == [
        {
            "name": "read",
            "description": "read a file",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
    ]


def test_anthropic_round_trip() -> None:
    body = to_anthropic_request(conversation(), system="sys")
    system, back = from_anthropic_request(body)
    assert system == "sys"
    assert strip_sources(back) == strip_sources(conversation())


def test_anthropic_merges_a_user_message_after_tool_results_and_consecutive_user_messages() -> None:
    messages = [
        Message.user("a"),
        Message.user("b"),
        Message.assistant("", [ToolCallBlock("c1", "f", {})]),
        Message.tool("c1", "r"),
        Message.user("next"),
    ]
    body = to_anthropic_request(messages)
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "f", "input": {}}]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "r"}, {"type": "text", "text": "next"}],
        },
    ]
    # reading it back splits the results from the user's text again, results first
    _, back = from_anthropic_request(body)
    assert [m.role for m in back] == ["user", "assistant", "tool", "user"]


def test_anthropic_thinking_is_sent_back_only_with_a_signature_and_empty_text_is_dropped() -> None:
    messages = [
        Message.user("q"),
        Message("assistant", (ReasoningBlock("signed", "sig"), ReasoningBlock("unsigned"), TextBlock("")), MODEL),
        Message.assistant("", reasoning="only thought"),  # nothing sendable: skipped, no empty message
        Message.user(""),
        Message.user("r"),
    ]
    body = to_anthropic_request(messages)
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "signed", "signature": "sig"}]},
        {"role": "user", "content": [{"type": "text", "text": "r"}]},
    ]


def test_anthropic_system_blocks_and_string_content() -> None:
    system, messages = from_anthropic_request(
        {
            "system": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
            "messages": [{"role": "user", "content": "hi"}],
        }
    )
    assert system == "one\n\ntwo" and messages[0].text == "hi"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"role": "robot", "content": "x"}, "role 'user', 'assistant' or 'system'"),
        ({"role": "assistant", "content": [{"type": "tool_use", "input": {}}]}, "needs a string 'id'"),
        ({"role": "user", "content": [{"type": "tool_result", "content": "x"}]}, "tool_use_id"),
        ({"role": "user", "content": ["loose string"]}, r"content\[0\] must be an object"),
    ],
)
def test_anthropic_malformed_messages_are_refused(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(EventError, match=match):
        from_anthropic_message(raw)


def test_reply_to_message_reads_both_formats() -> None:
    openai_response = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "hi",
                    "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                }
            }
        ]
    }
    assert reply_to_message(openai_response).tool_calls == [ToolCallBlock("a", "f", {})]
    anthropic_text_only = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hello"}]}
    assert reply_to_message(anthropic_text_only).text == "hello"
    anthropic_tool = {
        "role": "assistant",
        "content": [{"type": "text", "text": "x"}, {"type": "tool_use", "id": "t", "name": "g", "input": {"k": 1}}],
    }
    assert reply_to_message(anthropic_tool).tool_calls == [ToolCallBlock("t", "g", {"k": 1})]
    with pytest.raises(EventError, match="cannot read a model reply"):
        reply_to_message(42)


# -- property: any well-formed conversation survives both round trips -------------------------------
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
_args = st.dictionaries(
    st.text(min_size=1, max_size=8), st.one_of(st.integers(-(2**63), 2**63 - 1), _text, st.booleans()), max_size=3
)


@st.composite
def conversations(draw: Any) -> list[Message]:
    out: list[Message] = []
    n_call = 0
    for _ in range(draw(st.integers(1, 6))):
        out.append(Message.user(draw(_text)))
        for _ in range(draw(st.integers(0, 3))):
            k = draw(st.integers(0, 3))
            calls = [
                ToolCallBlock(f"call{n_call + i}", draw(st.sampled_from(["read", "edit", "run"])), draw(_args))
                for i in range(k)
            ]
            n_call += k
            text = draw(st.one_of(st.just(""), _text))
            if not calls and not text:
                text = "ok"
            out.append(Message.assistant(text, calls))
            for c in calls:
                out.append(Message.tool(c.id, draw(_text), is_error=draw(st.booleans())))
            if not calls:
                break  # the model owes nothing more: the next message is the user's
    return out


def merge_user_runs(messages: list[Message]) -> list[Message]:
    """Anthropic has one user message where we had consecutive ones: their texts join."""
    out: list[Message] = []
    for m in messages:
        if out and m.role == "user" and out[-1].role == "user":
            out[-1] = Message.user(out[-1].text + "\n" + m.text)
        else:
            out.append(m)
    return out


@given(conversations())
def test_property_round_trips(messages: list[Message]) -> None:
    _, via_anthropic = from_anthropic_request(to_anthropic_request(messages))
    assert strip_sources(via_anthropic) == strip_sources(merge_user_runs(messages))
    roles = [m["role"] for m in to_anthropic_request(messages)["messages"]]
    assert all(a != b for a, b in zip(roles, roles[1:]))
    _, via_openai = from_openai_messages(to_openai_messages(messages))
    no_error_flags = [
        Message.tool(m.content[0].call_id, m.content[0].content) if m.role == "tool" else m for m in messages
    ]  # type: ignore[union-attr]
    assert strip_sources(via_openai) == strip_sources(no_error_flags)


@pytest.mark.parametrize(
    "source",
    [
        {"kind": "model", "provider": [], "model": "gpt-4o"},
        {"kind": "model", "model": {"name": "gpt-4o"}},
        {"kind": "plugin", "plugin": "decay", "form": 3},
        {"kind": "tool", "call_id": ["k1"]},
    ],
)
def test_a_source_field_that_is_not_a_string_is_refused_by_name(source: dict[str, Any]) -> None:
    # an imported line's source reaches the kernel's dicts and caches: a list there raised a
    # TypeError (unhashable) out of the importer instead of refusing the line
    raw = {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "source": source}
    with pytest.raises(EventError, match="must be strings"):
        Message.from_dict(raw)


def test_a_source_of_strings_round_trips() -> None:
    source = {"kind": "model", "provider": "openai", "model": "gpt-4o"}
    message = Message.from_dict({"role": "assistant", "content": [{"type": "text", "text": "ok"}], "source": source})
    assert message.to_dict()["source"] == source
