"""Pydantic AI messages convert to kernel messages and back without loss (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from ctxkernel.integrations.pydantic_ai import from_pydantic_ai, to_pydantic_ai

from .conftest import arguments, conversations, names, raw_arguments, texts


@given(conversations())
def test_kernel_messages_survive_a_trip_through_pydantic_ai(messages):
    system, back, _ = from_pydantic_ai(to_pydantic_ai(messages))
    assert system == ""
    assert back == messages


response_parts = st.one_of(
    st.builds(TextPart, texts),
    st.builds(lambda t, s: ThinkingPart(t, signature=s), texts, st.none() | texts),
    st.builds(
        lambda n, a, i: ToolCallPart(n, a, tool_call_id=f"call_{i}"),
        names,
        arguments | raw_arguments,
        st.integers(0, 99),
    ),
)
request_parts = st.one_of(
    st.builds(UserPromptPart, texts),
    st.builds(
        lambda n, c, i, o: ToolReturnPart(n, c, tool_call_id=f"call_{i}", outcome=o),
        names,
        texts,
        st.integers(0, 99),
        st.sampled_from(["success", "failed"]),
    ),
)


@st.composite
def histories(draw: Any) -> list[Any]:
    """Requests and responses alternating, as a run's history holds them."""
    out: list[Any] = []
    for i in range(draw(st.integers(1, 6))):
        if i % 2 == 0:
            out.append(ModelRequest(parts=draw(st.lists(request_parts, min_size=1, max_size=3))))
        else:
            out.append(ModelResponse(parts=draw(st.lists(response_parts, max_size=3))))
    return out


def _view(messages: list[Any]) -> list[Any]:
    view = []
    for message in messages:
        parts = []
        for p in message.parts:
            if isinstance(p, ToolCallPart):
                parts.append(("call", p.tool_name, p.args, p.tool_call_id))
            elif isinstance(p, ToolReturnPart):
                parts.append(("return", p.tool_name, p.content, p.tool_call_id, p.outcome))
            elif isinstance(p, ThinkingPart):
                parts.append(("thinking", p.content, p.signature))
            else:
                parts.append((p.part_kind, p.content))
        view.append((message.kind, parts))
    return view


@given(histories())
def test_pydantic_ai_messages_survive_a_trip_through_the_kernel(messages):
    _, kernel, _ = from_pydantic_ai(messages)
    assert _view(to_pydantic_ai(kernel)) == _view(messages)
