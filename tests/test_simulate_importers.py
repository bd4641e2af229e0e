"""Importers of ctxkernel simulate, each on a small fixture written for this project."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxkernel.simulate import (
    AssistantItem,
    MarkerItem,
    RecordingError,
    ToolResultItem,
    UserItem,
    load_recording,
    sniff,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "simulate"


def kinds(recording):
    out = []
    for item in recording.items:
        if isinstance(item, UserItem):
            out.append("user")
        elif isinstance(item, AssistantItem):
            out.append("assistant:" + ",".join(c.id for c in item.message.tool_calls))
        elif isinstance(item, ToolResultItem):
            out.append("result:" + item.call_id)
        else:
            out.append("marker:" + item.kind)
    return out


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("kernel-session.jsonl", "kernel"),
        ("openai-chat.json", "openai-chat"),
        ("openai-runs.json", "openai-chat"),
        ("claude-code.jsonl", "claude-code"),
        ("codex-rollout.jsonl", "codex"),
    ],
)
def test_sniff_reads_the_content_not_the_name(tmp_path, name, fmt):
    renamed = tmp_path / "recording.data"
    renamed.write_bytes((FIXTURES / name).read_bytes())
    assert sniff(renamed) == fmt


def test_kernel_log_replays_only_what_harness_and_model_wrote():
    rec = load_recording(FIXTURES / "kernel-session.jsonl")
    assert kinds(rec) == ["user", "assistant:k1", "result:k1", "assistant:", "marker:turn_end"]
    assert rec.items[1].usage == {"input_tokens": 120, "output_tokens": 20, "cached_input_tokens": 0}
    assert rec.source["format"] == "kernel"


def test_openai_messages_keep_system_prompt_and_pairing():
    rec = load_recording(FIXTURES / "openai-chat.json")
    assert rec.system.startswith("You are a booking assistant")
    assert kinds(rec) == [
        "user",
        "assistant:call_a",
        "result:call_a",
        "assistant:",
        "user",
        "assistant:call_b,call_c",
        "result:call_b",
        "assistant:",
    ]
    assert rec.items[1].message.tool_calls[0].arguments == {"id": "ABC123"}


def test_openai_runs_are_selected_and_reused_call_ids_renamed():
    first = load_recording(FIXTURES / "openai-runs.json")
    assert first.source["run"] == 0 and first.source["runs"] == 2
    assert kinds(first) == ["user", "assistant:"]
    second = load_recording(FIXTURES / "openai-runs.json", run=1)
    # the run reuses call id r1: the second call and its result are renamed together
    assert kinds(second) == ["user", "assistant:r1", "result:r1", "assistant:r1~2", "result:r1~2", "assistant:"]
    with pytest.raises(RecordingError, match="out of range: the file holds 2 runs"):
        load_recording(FIXTURES / "openai-runs.json", run=2)


def test_claude_code_follows_the_main_chain():
    rec = load_recording(FIXTURES / "claude-code.jsonl")
    assert kinds(rec) == [
        "user",
        # one API message written as four lines, with a result between its two tool_use lines
        "assistant:toolu_1,toolu_2",
        "result:toolu_1",
        "result:toolu_2",
        "assistant:",
        "marker:compact_boundary",
        "marker:compact_summary",
        "user",
        "assistant:toolu_3",
        "user",
        "assistant:",
    ]
    texts = [i.message.text for i in rec.items if isinstance(i, AssistantItem)]
    assert "a sidechain agent's reply" not in texts and "an abandoned branch" not in texts
    merged = rec.items[1].message
    assert [b.type for b in merged.content] == ["reasoning", "tool_call", "tool_call"]
    # usage carried from the message's last line, cache reads and writes counted as input
    assert rec.items[1].usage == {"input_tokens": 1010, "output_tokens": 60, "cached_input_tokens": 900}
    boundary = next(i for i in rec.items if isinstance(i, MarkerItem) and i.kind == "compact_boundary")
    assert boundary.data == {"trigger": "manual", "pre_tokens": 1500}
    assert rec.items[3].content == "no matches"


def test_codex_rollout_items_reasoning_and_token_counts():
    rec = load_recording(FIXTURES / "codex-rollout.jsonl")
    assert kinds(rec) == ["user", "user", "assistant:call_x1", "result:call_x1", "assistant:"]
    assert rec.items[0].instruction is False  # environment context, not an instruction
    assert rec.items[1].instruction is True
    call = rec.items[2].message
    assert call.content[0].type == "reasoning" and "Listing files" in call.content[0].text
    assert call.tool_calls[0].arguments == {"command": ["bash", "-lc", "wc -l *.py"]}
    assert rec.items[2].usage["input_tokens"] == 900
    assert rec.items[4].usage == {"input_tokens": 1100, "output_tokens": 20, "cached_input_tokens": 800}
    assert rec.items[4].message.text == "Two Python files, 30 lines in total."


def test_malformed_line_names_file_line_and_expectation():
    path = FIXTURES / "claude-code-malformed.jsonl"
    with pytest.raises(RecordingError) as info:
        load_recording(path)
    text = str(info.value)
    assert f"{path}:14:" in text and "expected one JSON object per line" in text and "--lenient" in text
    lenient = load_recording(path, lenient=True)
    assert lenient.describe()["skipped_lines"] == 1
    assert lenient.skipped[0]["line"] == 14


def test_missing_or_unknown_files_are_refused(tmp_path):
    with pytest.raises(RecordingError, match="no such file"):
        load_recording(tmp_path / "absent.jsonl")
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"hello": 1}\n')
    with pytest.raises(RecordingError, match="cannot tell the format"):
        load_recording(odd)
    with pytest.raises(RecordingError, match="--run selects one run"):
        load_recording(FIXTURES / "codex-rollout.jsonl", run=1)
