"""The extractive summary's one-pass collection (``ctxkernel.text.extractive_summary``) writes
exactly what the straightforward implementation it replaced wrote, kept here as the oracle, for
any mix of messages: user and plugin messages, earlier checkpoints, assistant texts (blank ones
too), tool calls with path and command arguments of any type, failed and clean tool results."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel.compaction import CHECKPOINT_OPEN, SUMMARY_SECTIONS, checkpoint_message
from ctxkernel.messages import Message, Source, TextBlock, ToolCallBlock
from ctxkernel.text import (
    COMMAND_KEYS,
    PATH_KEYS,
    _previous_sections,
    clip,
    extractive_summary,
    failed,
    first_line,
    string_arguments,
)


# over the complexity cap: the straightforward oracle the optimised summary is checked against
def reference_summary(messages: list[Message], *, max_chars: int = 12_000) -> str:  # noqa: C901
    """Eight sections built from the messages alone: deterministic and model-free."""
    found: dict[str, list[str]] = {s: [] for s in SUMMARY_SECTIONS}
    last_assistant = ""
    tools_used: list[str] = []
    for message in messages:
        role, kind = message.role, message.source.kind
        if role == "user" and kind == "plugin":
            text = message.text
            if CHECKPOINT_OPEN in text:
                for section, bullets in _previous_sections(text).items():
                    if section in found:
                        found[section].extend(bullets)
                continue
        if role == "user" and kind == "user":
            found["Primary Request and Intent"].append(f"User: {clip(message.text, 600, single_line=True)}")
        elif role == "assistant":
            text = message.text
            if text.strip():
                last_assistant = text
            for call in message.tool_calls:
                if call.name not in tools_used:
                    tools_used.append(call.name)
                for value in string_arguments(call, PATH_KEYS):
                    found["Files and Code"].append(f"{call.name}: {clip(value, 200, single_line=True)}")
                for value in string_arguments(call, COMMAND_KEYS):
                    found["Critical Context"].append(f"ran: {clip(value, 200, single_line=True)}")
        elif role == "tool":
            result = message.tool_result
            assert result is not None
            if failed(result):
                found["Errors and Fixes"].append(
                    f"{result.name or result.call_id}: {clip(first_line(result.content), 240, single_line=True)}"
                )
    if tools_used:
        found["Key Technical Concepts"].append("tools used: " + ", ".join(tools_used[:30]))
    if last_assistant:
        found["Current Work"].append(clip(last_assistant, 800, single_line=True))
        tail = re.split(r"(?<=[.!?])\s+", last_assistant.strip())[-1]
        found["Next Step"].append(f"continue from: {clip(tail, 300, single_line=True)}")
    budget = max_chars // len(SUMMARY_SECTIONS)
    parts = []
    for section in SUMMARY_SECTIONS:
        bullets = list(dict.fromkeys(found[section]))  # de-duplicate, keep order
        lines: list[str] = []
        used = 0
        # newest facts matter most: keep from the end, then restore order
        for bullet in reversed(bullets):
            line = f"- {bullet}"
            if used + len(line) > budget and lines:
                break
            lines.append(line[:budget])
            used += len(line) + 1
        lines.reverse()
        if len(lines) < len(bullets):
            lines.insert(0, f"- ({len(bullets) - len(lines)} earlier item(s) omitted)")
        parts.append(f"## {section}\n" + ("\n".join(lines) if lines else "(none)"))
    return "\n\n".join(parts)


WORDS = st.sampled_from(
    [
        "fix",
        "the",
        "parser",
        "Error",
        "Traceback",
        "FAILED",
        "ok.",
        "done!",
        "why?",
        "  ",
        "\n",
        "\t",
        "é",
        "ﬁ",
        "x" * 300,
    ]
)
#: texts around every clip limit of the summary (200, 240, 300, 600, 800 characters)
LONG = st.builds(
    lambda word, n, end: (word * n)[:n] + end,
    st.sampled_from(["x", "ab ", "é\n", "a.  "]),
    st.integers(150, 900),
    st.sampled_from(["", ".", " Next I patch it.", "\n"]),
)
TEXT = st.one_of(st.lists(WORDS, max_size=40).map(" ".join), LONG)
VALUE = st.one_of(TEXT, TEXT, st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2))
ARGUMENTS = st.one_of(
    st.dictionaries(st.sampled_from([*PATH_KEYS, *COMMAND_KEYS, "query", "n"]), VALUE, max_size=4),
    st.just([]),  # a model's arguments that are not an object
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["user", "plugin", "checkpoint", "assistant", "tool"]))
    if kind == "user":
        return Message.user(draw(TEXT))
    if kind == "plugin":
        return Message.user(draw(TEXT), Source.plugin_form("p", "notice"))
    if kind == "checkpoint":
        bullets = draw(st.lists(st.tuples(st.sampled_from([*SUMMARY_SECTIONS, "Other"]), TEXT), max_size=6))
        body = "\n".join(f"## {section}\n- {text}" for section, text in bullets)
        return checkpoint_message(body, "basic")
    if kind == "assistant":
        calls = [
            ToolCallBlock(f"c{i}", draw(st.sampled_from(["read_file", "bash", "grep"])), draw(ARGUMENTS))
            for i in range(draw(st.integers(0, 3)))
        ]
        reasoning = draw(st.one_of(st.none(), TEXT))
        message = Message.assistant(draw(TEXT), calls, reasoning=reasoning)
        if draw(st.booleans()):  # two text blocks: the text is their join
            message = message.with_content((*message.content, TextBlock(draw(TEXT))))
        return message
    return Message.tool(
        "c0", draw(TEXT), is_error=draw(st.booleans()), name=draw(st.one_of(st.none(), st.just("bash")))
    )


# 150 examples: every section the summary can fill is reached by these draws (the next test checks
# the oracle sees each one filled), and 400 only lengthened `make test`
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(messages(), max_size=30), st.integers(min_value=400, max_value=12_000))
def test_the_one_pass_summary_is_the_reference_summary(history: list[Message], max_chars: int) -> None:
    assert extractive_summary(history, max_chars=max_chars) == reference_summary(history, max_chars=max_chars)


def test_the_oracle_sees_every_section_filled() -> None:
    """The property draws reach every branch: a history with all of them gives all sections."""
    history = [
        checkpoint_message("## Pending Jobs\n- ship it", "basic"),
        Message.user("fix the parser"),
        Message.assistant("Reading.", [ToolCallBlock("c1", "bash", {"command": "pytest", "path": "a.py"})]),
        Message.tool("c1", "Traceback: boom", name="bash"),
        Message.assistant("  "),
    ]
    summary = extractive_summary(history)
    assert summary == reference_summary(history)
    assert "(none)" not in summary
    assert "ran: pytest" in summary and "bash: a.py" in summary and "ship it" in summary


def test_a_repeated_argument_value_gives_the_reference_lines() -> None:
    """Each distinct argument value is collapsed and clipped once per summary: the same value
    read again, run as a command or passed to another tool gives the lines the oracle writes."""
    long_path = "src/" + "deep dir/" * 40 + "x.py"
    calls = [
        ("read_file", {"path": "a  b.py"}),
        ("bash", {"command": "a  b.py"}),
        ("edit", {"file": "a  b.py"}),
        ("read_file", {"path": long_path}),
        ("read_file", {"path": long_path}),
        ("bash", {"cmd": long_path}),
    ]
    history = [Message.assistant("step", [ToolCallBlock(f"c{i}", name, args)]) for i, (name, args) in enumerate(calls)]
    assert extractive_summary(history, max_chars=12_000) == reference_summary(history, max_chars=12_000)
