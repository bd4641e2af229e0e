"""Importers of ctxkernel simulate, each on a small fixture written for this project."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
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

FIXTURES = Path(__file__).resolve().parent / "fixtures"


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
        ("swe-agent.traj", "swe-agent"),
        ("swe-agent-trajectory-only.traj", "swe-agent"),
        ("openhands-events.json", "openhands"),
        ("openhands-run.jsonl", "openhands"),
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


def test_a_call_id_repeated_within_one_reply_pairs_its_results_in_order(tmp_path):
    def calls(*ids):
        return [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]

    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls("c1", "c1")},
        {"role": "tool", "tool_call_id": "c1", "content": "first"},
        {"role": "tool", "tool_call_id": "c1", "content": "second"},
    ]
    path = tmp_path / "chat.json"
    path.write_bytes(orjson.dumps(messages))
    rec = load_recording(path)
    assert kinds(rec) == ["user", "assistant:c1,c1~2", "result:c1", "result:c1~2"]
    assert [i.content for i in rec.items if isinstance(i, ToolResultItem)] == ["first", "second"]
    assert rec.accounting["synthetic_results"] == 0 and rec.accounting["complete"]


def test_an_id_every_reply_reuses_gets_the_next_name_each_time(tmp_path):
    call = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    reply = [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_0"}]
    path = tmp_path / "chat.json"
    n = 300  # benchmarks/bench_import.py times this shape at 10,000 and 20,000 replies
    path.write_bytes(orjson.dumps([{"role": "user", "content": "go"}, *reply * n]))
    names = kinds(load_recording(path))[1:]
    expected = ["call_0", *(f"call_0~{k}" for k in range(2, n + 1))]
    assert names == [f"{kind}:{name}" for name in expected for kind in ("assistant", "result")]


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


# -- SWE-agent and OpenHands (fixtures built from the formats' public code: fixtures/SOURCES.md) ----------
def test_swe_agent_history_replays_the_chat_the_model_saw():
    rec = load_recording(FIXTURES / "swe-agent.traj")
    assert rec.source["format"] == "swe-agent"
    assert rec.system.startswith("You are a helpful assistant")
    assert kinds(rec) == [
        "user",
        "assistant:call_v1",
        "result:call_v1",
        "assistant:call_r1",
        "result:call_r1",
        "assistant:call_e1",
        "result:call_e1",
        "assistant:call_r2,call_t1",  # two calls of one reply, answered in order
        "result:call_r2",
        "result:call_t1",
        "assistant:call_s1",
        "result:call_s1",
    ]
    assert "Do not modify the tests." in rec.items[0].text and rec.items[0].instruction
    edit = rec.items[5].message.tool_calls[0]
    assert (edit.name, edit.arguments["command"], edit.arguments["path"]) == (
        "str_replace_editor",
        "str_replace",
        "/testbed/src/lexer.py",
    )
    assert rec.recorded_peak_input_tokens is None  # SWE-agent records no per-request usage


def test_swe_agent_trajectory_without_history_replays_its_steps():
    rec = load_recording(FIXTURES / "swe-agent-trajectory-only.traj")
    assert rec.system.startswith("SETTING: You are an autonomous programmer")
    assert kinds(rec) == ["user", "assistant:swe_00001", "result:swe_00001"] + [
        "assistant:swe_00002",
        "result:swe_00002",
        "assistant:swe_00003",
        "result:swe_00003",
    ]
    call = rec.items[1].message
    assert call.text == "First I list the repository."
    assert (call.tool_calls[0].name, call.tool_calls[0].arguments) == ("bash", {"command": "ls /repo"})
    with pytest.raises(RecordingError, match="--run selects one run"):
        load_recording(FIXTURES / "swe-agent.traj", run=0)


def test_openhands_event_stream_groups_one_model_response_and_skips_bookkeeping():
    rec = load_recording(FIXTURES / "openhands-events.json")
    assert rec.system.startswith("You are OpenHands agent")
    assert kinds(rec) == [
        "user",  # the recall action and its observation are not replayed
        "assistant:toolu_01",
        "result:toolu_01",
        "assistant:toolu_02,toolu_03",  # two read actions of one model response are one reply
        "result:toolu_02",
        "result:toolu_03",
        "assistant:toolu_04",
        "result:toolu_04",
        "assistant:toolu_05",
        "result:toolu_05",
        "assistant:toolu_06",  # finish: answered by the replay's synthetic result
    ]
    first = rec.items[1]
    assert first.usage == {"input_tokens": 5200, "output_tokens": 40, "cached_input_tokens": 0}
    assert first.message.text == "Let me run the tests first."
    # the arguments the model wrote, not OpenHands' action fields
    assert first.message.tool_calls[0].arguments == {"command": "cd /workspace && python -m pytest -q"}
    assert rec.items[2].content.endswith("[Command finished with exit code 1]")
    with pytest.raises(RecordingError, match="one event stream"):
        load_recording(FIXTURES / "openhands-events.json", run=1)


def test_openhands_benchmark_run_picks_an_instance_with_run():
    first = load_recording(FIXTURES / "openhands-run.jsonl")
    assert (first.source["run"], first.source["runs"]) == (0, 2)
    assert kinds(first) == kinds(load_recording(FIXTURES / "openhands-events.json"))
    older = load_recording(FIXTURES / "openhands-run.jsonl", run=1)  # [action, observation] pairs, no metadata
    assert kinds(older) == ["user", "assistant:oh_1", "result:oh_1", "assistant:"]
    call = older.items[1].message
    assert call.text == "Find the parser."
    assert (call.tool_calls[0].name, call.tool_calls[0].arguments["command"]) == ("run", "grep -n argparse cli.py")
    with pytest.raises(RecordingError, match=r"--run 2 is out of range: the file holds 2 instances \(0\.\.1\)"):
        load_recording(FIXTURES / "openhands-run.jsonl", run=2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"history": [{"role": "robot", "content": "x", "message_type": "action"}]}', "history[0].role must be"),
        (
            '{"history": [{"role": "user", "content": [{"type": "text", "text": 7}], "message_type": "observation"}]}',
            "history[0].content[0].text must be a string",
        ),
        (
            '[{"id": "x", "source": "agent", "action": "run", "args": {"command": "ls"}}]',
            "event[0].id must be an integer event id",
        ),
        (
            '[{"id": 1, "source": "agent", "action": "run", "args": {}, "tool_call_metadata": {"tool_call_id": 5}}]',
            "tool_call_metadata.tool_call_id must be a string",
        ),
        ('{"instance_id": "a", "history": []}\n{"instance_id": "b"}\n', ":2: expected an OpenHands instance"),
    ],
)
def test_hostile_agent_logs_are_refused_naming_where(tmp_path, text, message):
    path = tmp_path / "log"
    path.write_text(text)
    with pytest.raises(RecordingError, match=re.escape(message)) as info:
        load_recording(path)
    assert str(info.value).startswith(str(path))
    if "--lenient" in str(info.value):
        assert load_recording(path, lenient=True).skipped


# -- the older SWE-agent generation and OpenHands V1 (fixtures written by the tests themselves) -----------------
def write_json(path, value, *, lines=False):
    path.write_bytes(b"\n".join(orjson.dumps(v) for v in value) if lines else orjson.dumps(value))
    return path


def test_swe_agent_older_generation_pairs_each_action_with_the_next_observation(tmp_path):
    # no message_type anywhere: an action's observation is the user message after it, and the last
    # action (submit) is answered only in its trajectory step
    history = [
        {"role": "system", "content": "SETTING: a shell."},
        {"role": "user", "content": "Here is a demonstration.", "is_demo": "True"},
        {"role": "user", "content": "ISSUE: the parser drops the last token."},
        {"role": "assistant", "content": "Find it.", "thought": "Find it.", "action": "find_file parser.py\n"},
        {"role": "user", "content": "Found 1 matches for parser.py"},
        {"role": "assistant", "content": "Open it.", "thought": "Open it.", "action": "open src/parser.py\n"},
        {"role": "user", "content": "[File: src/parser.py (40 lines total)]"},
        {"role": "assistant", "content": "Done.", "thought": "Done.", "action": "submit\n"},
    ]
    steps = [
        {"action": "find_file parser.py\n", "observation": "Found 1 matches for parser.py", "thought": "Find it."},
        {
            "action": "open src/parser.py\n",
            "observation": "[File: src/parser.py (40 lines total)]",
            "thought": "Open it.",
        },
        {"action": "submit\n", "observation": "diff --git a/src/parser.py b/src/parser.py", "thought": "Done."},
    ]
    rec = load_recording(write_json(tmp_path / "old.traj", {"history": history, "trajectory": steps, "info": {}}))
    assert kinds(rec) == [
        "user",
        "user",
        "assistant:swe_00001",
        "result:swe_00001",
        "assistant:swe_00002",
        "result:swe_00002",
        "assistant:swe_00003",
        "result:swe_00003",
    ]
    assert [item.instruction for item in rec.items[:2]] == [False, True]  # the demonstration is no instruction
    assert rec.items[3].content == "Found 1 matches for parser.py"
    assert rec.items[-1].content.startswith("diff --git")
    assert rec.items[2].message.tool_calls[0].arguments == {"command": "find_file parser.py\n"}


def v1_action(event_id, call_id, response_id, command, thought=""):
    return {
        "kind": "ActionEvent",
        "id": event_id,
        "timestamp": "2026-01-01T00:00:00",
        "source": "agent",
        "thought": [{"type": "text", "text": thought}] if thought else [],
        "action": {"kind": "ExecuteBashAction", "command": command, "is_input": False},
        "tool_name": "execute_bash",
        "tool_call_id": call_id,
        "tool_call": {"id": call_id, "name": "execute_bash", "arguments": orjson.dumps({"command": command}).decode()},
        "llm_response_id": response_id,
    }


def v1_observation(event_id, call_id, output, exit_code=0):
    return {
        "kind": "ObservationEvent",
        "id": event_id,
        "source": "environment",
        "tool_name": "execute_bash",
        "tool_call_id": call_id,
        "action_id": "a",
        "observation": {
            "kind": "ExecuteBashObservation",
            "output": output,
            "error": False,
            "metadata": {"exit_code": exit_code},
        },
    }


def v1_message(event_id, role, text):
    return {
        "kind": "MessageEvent",
        "id": event_id,
        "source": "user" if role == "user" else "agent",
        "llm_message": {"role": role, "content": [{"type": "text", "text": text, "cache_prompt": False}]},
        "extended_content": [],
    }


def test_openhands_v1_sdk_output_groups_parallel_calls_and_reads_every_result_kind(tmp_path):
    history = [
        v1_action("e1", "call_a", "resp-1", "ls", thought="Look around first."),
        v1_action("e2", "call_b", "resp-1", "cat README.md"),  # the same model response: one reply
        {"kind": "ConversationStateUpdateEvent", "id": "s1", "source": "environment", "key": "x", "value": 1},
        v1_observation("o1", "call_a", "README.md src"),
        v1_observation("o2", "call_b", "No such file", exit_code=1),
        v1_action("e3", "call_c", "resp-2", "rm -rf /tmp/x"),
        {
            "kind": "UserRejectObservation",
            "id": "o3",
            "source": "user",
            "tool_name": "execute_bash",
            "tool_call_id": "call_c",
            "action_id": "e3",
            "rejection_reason": "not allowed",
        },
        v1_action("e4", "call_d", "resp-3", "make"),
        {
            "kind": "AgentErrorEvent",
            "id": "o4",
            "source": "agent",
            "tool_name": "execute_bash",
            "tool_call_id": "call_d",
            "error": "the tool timed out",
        },
        v1_message("m1", "assistant", "I could not build it."),
    ]
    second = [
        {
            "kind": "SystemPromptEvent",
            "id": "p",
            "source": "agent",
            "system_prompt": {"type": "text", "text": "You are OpenHands."},
            "tools": [],
        },
        v1_message("m0", "user", "Fix the build."),
        v1_action("e1", "call_z", "resp-9", "make"),
        v1_observation("o1", "call_z", "ok"),
    ]
    runs = [
        {"instance_id": "one", "instruction": "Tidy the repository.", "history": history},
        {"instance_id": "two", "instruction": "Fix the build.", "history": second},
    ]
    path = write_json(tmp_path / "output.jsonl", runs, lines=True)
    assert sniff(path) == "openhands"
    rec = load_recording(path)
    assert kinds(rec) == [
        "user",  # the instance's instruction: the history opens with the agent's work
        "assistant:call_a,call_b",
        "result:call_a",
        "result:call_b",
        "assistant:call_c",
        "result:call_c",
        "assistant:call_d",
        "result:call_d",
        "assistant:",
    ]
    assert rec.items[0].text == "Tidy the repository." and rec.items[0].instruction
    assert rec.items[1].message.text == "Look around first."
    assert rec.items[1].message.tool_calls[1].arguments == {"command": "cat README.md"}
    assert rec.items[3].content == "No such file\n[Command finished with exit code 1]"
    assert (rec.items[5].content, rec.items[5].is_error) == ("Action rejected: not allowed", True)
    assert (rec.items[7].content, rec.items[7].is_error) == ("the tool timed out", True)
    other = load_recording(path, run=1)
    assert other.system == "You are OpenHands."
    assert kinds(other) == ["user", "assistant:call_z", "result:call_z"]  # told once, not twice
    assert (other.source["run"], other.source["runs"]) == (1, 2)


def test_openhands_v1_event_without_a_call_id_is_refused_naming_where(tmp_path):
    action = v1_action("e1", "call_a", "resp-1", "ls")
    del action["tool_call_id"]
    path = write_json(tmp_path / "output.jsonl", [{"instance_id": "one", "history": [action]}], lines=True)
    with pytest.raises(RecordingError, match=re.escape("history[0].tool_call_id must be a string")):
        load_recording(path)
    assert load_recording(path, lenient=True).skipped
