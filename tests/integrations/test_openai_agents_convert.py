"""Agents SDK input items convert to kernel messages and back without loss (hypothesis)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ctxkernel.integrations.openai_agents import from_items, to_items

from .conftest import arguments, conversations, names, raw_arguments, texts


@given(conversations(tool_names=False, errors=False))
def test_kernel_messages_survive_a_trip_through_the_sdk(messages):
    # Responses items carry neither a tool result's name nor an error flag: the kernel's own
    # fields that the SDK has no place for are the only ones not generated here
    system, back = from_items(to_items(messages))
    assert system == ""
    assert back == messages


def _assistant_item(text: str, n_parts: int) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}] * n_parts,
    }


user_items = st.builds(lambda t: {"role": "user", "content": t}, texts) | st.builds(
    lambda ts: {"role": "user", "content": [{"type": "input_text", "text": t} for t in ts]},
    st.lists(texts, min_size=1, max_size=2),
)
reasoning_items = st.builds(
    lambda t, sig: {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": t}],
        **({"encrypted_content": sig} if sig else {}),
    },
    texts,
    st.none() | texts,
)
call_items = st.builds(
    lambda n, a, i: {
        "type": "function_call",
        "call_id": f"call_{i}",
        "name": n,
        "arguments": a if isinstance(a, str) else json.dumps(a),
    },
    names,
    arguments | raw_arguments,
    st.integers(0, 99),
)
output_items = st.builds(
    lambda t, i: {"type": "function_call_output", "call_id": f"call_{i}", "output": t}, texts, st.integers(0, 99)
)
assistant_items = st.builds(_assistant_item, texts, st.integers(1, 2))


def _view(items: list[dict[str, Any]]) -> list[Any]:
    """One entry per piece of content, in order (a multi-part message counts once per part)."""
    view: list[Any] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            parts = [content] if isinstance(content, str) else [p["text"] for p in content]
            if item["role"] == "user":
                view.append(("user", "\n".join(parts)))
            else:
                view += [("assistant", p) for p in parts]
        elif kind == "reasoning":
            view.append(("reasoning", [s["text"] for s in item["summary"]], item.get("encrypted_content")))
        elif kind == "function_call":
            try:
                args: Any = json.loads(item["arguments"])
            except json.JSONDecodeError:
                args = item["arguments"]
            view.append(("call", item["call_id"], item["name"], args))
        else:
            view.append(("output", item["call_id"], item["output"]))
    return view


@given(st.lists(st.one_of(user_items, reasoning_items, call_items, output_items, assistant_items), max_size=8))
def test_sdk_items_survive_a_trip_through_the_kernel(items):
    _, kernel = from_items(items)
    assert _view(to_items(kernel)) == _view(items)
