"""LangChain messages convert to kernel messages and back without loss (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from ctxkernel.integrations.langchain import from_langchain, to_langchain

from .conftest import arguments, conversations, names, texts


@given(conversations())
def test_kernel_messages_survive_a_trip_through_langchain(messages):
    system, back = from_langchain([to_langchain(m) for m in messages])
    assert system == ""
    assert back == messages


reasoning_parts = st.builds(lambda t: {"type": "reasoning", "reasoning": t}, texts) | st.builds(
    lambda t, s: {"type": "thinking", "thinking": t, "signature": s}, texts, texts
)
text_parts = st.builds(lambda t: {"type": "text", "text": t}, texts)
tool_calls = st.lists(st.tuples(names, arguments), max_size=3).map(
    lambda calls: [{"id": f"call_{i}", "name": n, "args": a, "type": "tool_call"} for i, (n, a) in enumerate(calls)]
)
ai_messages = st.builds(
    lambda content, calls: AIMessage(content=content, tool_calls=calls),
    texts | st.lists(reasoning_parts | text_parts, max_size=4),
    tool_calls,
)
tool_messages = st.builds(
    lambda content, call, name, status: ToolMessage(content, tool_call_id=call, name=name, status=status),
    texts,
    names,
    names,
    st.sampled_from(["success", "error"]),
)
human_messages = st.builds(HumanMessage, texts)


def _parts(message: AIMessage) -> list[Any]:
    content = message.content
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return [p for p in parts if not (p.get("type") == "text" and p.get("text") == "" and isinstance(content, str))]


@given(st.one_of(ai_messages, tool_messages, human_messages))
def test_langchain_messages_survive_a_trip_through_the_kernel(message):
    _, (kernel,) = from_langchain([message])
    back = to_langchain(kernel)
    assert type(back) is type(message)
    if isinstance(message, AIMessage):
        assert [(c["id"], c["name"], c["args"]) for c in back.tool_calls] == [
            (c["id"], c["name"], c["args"]) for c in message.tool_calls
        ]
        assert _parts(back) == _parts(message)
    elif isinstance(message, ToolMessage):
        assert (back.content, back.tool_call_id, back.name, back.status) == (
            message.content,
            message.tool_call_id,
            message.name,
            message.status,
        )
    else:
        assert back.content == message.content
