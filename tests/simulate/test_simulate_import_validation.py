"""Imported transcripts are hostile input: every line's shape is checked, bad input is an import
error naming file:line and the field (exit 2), never an assertion or a profile that fails later."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel.cli import main
from ctxkernel.simulate import Options, RecordingError, compare, load_recording, reading, sniff
from ctxkernel.simulate.reading import check_item

FIXTURES = Path(__file__).resolve().parent / "fixtures"
JSONL_FIXTURES = ["kernel-session.jsonl", "claude-code.jsonl", "codex-rollout.jsonl", "openhands-run.jsonl"]
JSON_FIXTURES = [
    "openai-chat.json",
    "openai-runs.json",
    "swe-agent.traj",
    "swe-agent-trajectory-only.traj",
    "openhands-events.json",
]


def _lines(name: str) -> list[Any]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def _write_lines(path: Path, values: list[Any]) -> Path:
    path.write_text("".join(json.dumps(v) + "\n" for v in values))
    return path


# -- the two reported gaps ---------------------------------------------------------------------------
def test_a_kernel_tool_result_holding_a_user_message_is_an_import_error(tmp_path):
    values = _lines("kernel-session.jsonl")
    at = next(i for i, v in enumerate(values) if v.get("type") == "tool/result")
    values[at]["data"]["message"] = {
        "role": "user",
        "content": [{"type": "text", "text": "hi"}],
        "source": {"kind": "user"},
    }
    path = _write_lines(tmp_path / "k.jsonl", values)
    with pytest.raises(RecordingError, match=rf"k\.jsonl:{at + 1}: .*data\.message\.role 'user'"):
        load_recording(path)


def test_a_kernel_reply_whose_provider_is_not_a_string_is_an_import_error(tmp_path):
    values = _lines("kernel-session.jsonl")
    at = next(i for i, v in enumerate(values) if v.get("type") == "assistant/message")
    values[at]["data"]["message"]["source"]["provider"] = []  # unhashable: it used to raise a TypeError
    path = _write_lines(tmp_path / "k.jsonl", values)
    # the kernel's own event check refuses it first, naming the field
    with pytest.raises(RecordingError, match=rf"k\.jsonl:{at + 1}: .*source fields \['provider'\] must be strings"):
        load_recording(path)


def test_a_claude_code_text_block_holding_a_number_is_bad_input_not_a_failed_profile(tmp_path, capsys):
    values = _lines("claude-code.jsonl")
    at = next(i for i, v in enumerate(values) if v.get("type") == "user" and isinstance(v["message"]["content"], str))
    values[at]["message"]["content"] = [{"type": "text", "text": 42}]
    path = _write_lines(tmp_path / "c.jsonl", values)
    with pytest.raises(RecordingError, match=rf"c\.jsonl:{at + 1}: .*content\[0\]\.text must be a string, got int 42"):
        load_recording(path)
    assert main(["simulate", "--transcript", str(path), "--profile", "basic", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"c.jsonl:{at + 1}" in err and "Traceback" not in err


def test_lenient_skips_the_bad_line_and_counts_it(tmp_path):
    values = _lines("claude-code.jsonl")
    at = next(i for i, v in enumerate(values) if v.get("type") == "user" and isinstance(v["message"]["content"], str))
    values[at]["message"]["content"] = [{"type": "text", "text": 42}]
    recording = load_recording(_write_lines(tmp_path / "c.jsonl", values), lenient=True)
    assert [s["line"] for s in recording.skipped] == [at + 1]


def test_a_claude_code_reply_line_with_no_id_at_all_is_refused_naming_the_ids(tmp_path):
    values = [
        {"type": "user", "uuid": "u1", "parentUuid": None, "message": {"role": "user", "content": "hi"}},
        {
            "type": "assistant",
            "uuid": "a1",
            "parentUuid": "u1",
            "message": {"id": "", "role": "assistant", "content": []},
        },
        # an empty message.id like the line on the chain, no requestId and no uuid
        {"type": "assistant", "parentUuid": "a1", "message": {"id": "", "role": "assistant", "content": []}},
    ]
    with pytest.raises(RecordingError, match=r"c\.jsonl:3: .*message\.id \(or requestId\)"):
        load_recording(_write_lines(tmp_path / "c.jsonl", values))


def test_tool_arguments_nested_past_what_the_replay_can_serialize_are_an_import_error(tmp_path):
    deep: Any = 1
    for _ in range(300):  # orjson reads 1,024 levels but writes 254
        deep = {"a": deep}
    call = {"type": "tool_use", "id": "toolu_deep", "name": "Bash", "input": deep}
    values = [
        {"type": "user", "uuid": "u1", "parentUuid": None, "message": {"role": "user", "content": "hi"}},
        {"type": "assistant", "uuid": "a1", "parentUuid": "u1", "message": {"id": "m1", "content": [call]}},
    ]
    with pytest.raises(RecordingError, match=r"c\.jsonl:2: .*nested at most 254 levels"):
        load_recording(_write_lines(tmp_path / "c.jsonl", values))


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"input_tokens": -1}, "input_tokens"),
        ({"output_tokens": "9"}, "output_tokens"),
        ({"input_tokens": True}, "input_tokens"),
    ],
)
def test_usage_counts_must_be_non_negative_integers(tmp_path, usage, field):
    values = _lines("claude-code.jsonl")
    at = next(i for i, v in enumerate(values) if v.get("type") == "assistant")
    values[at]["message"]["usage"] = usage
    with pytest.raises(RecordingError, match=rf":{at + 1}: .*usage\.{field} must be a non-negative integer"):
        load_recording(_write_lines(tmp_path / "c.jsonl", values))


# -- sniffing a long first line ----------------------------------------------------------------------
def test_a_codex_file_whose_first_line_is_over_64_kib_is_sniffed(tmp_path):
    values = _lines("codex-rollout.jsonl")
    values[0]["payload"]["instructions"] = "be careful. " * 20_000  # ~240 KB first line
    path = _write_lines(tmp_path / "rollout.jsonl", values)
    assert len(path.read_text().splitlines()[0]) > 65536
    assert sniff(path) == "codex"
    assert load_recording(path).system.startswith("be careful.")


def test_a_claude_code_file_whose_first_message_is_over_64_kib_is_sniffed(tmp_path):
    values = [v for v in _lines("claude-code.jsonl") if v.get("type") != "file-history-snapshot"]
    values[0]["message"]["content"] = "pasted log line\n" * 10_000
    path = _write_lines(tmp_path / "session.jsonl", values)
    assert sniff(path) == "claude-code"
    assert load_recording(path).items[0].text.startswith("pasted log line")


def test_a_first_line_past_the_bound_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "LINE_LIMIT", 1024 * 1024)
    path = tmp_path / "huge.jsonl"
    path.write_text('{"type": "session_meta", "payload": {"x": "' + "a" * (2 * 1024 * 1024) + '"}}\n')
    size = len(path.read_bytes()) - 1
    with pytest.raises(
        RecordingError,
        match=rf"huge\.jsonl:1: the line is {size:,} bytes, longer than the 1 MiB \(1,048,576 bytes\) a recording line",
    ):
        sniff(path)


# -- size bounds and a byte order mark ------------------------------------------------------------
@pytest.mark.parametrize("lenient", [False, True])
def test_a_later_line_past_the_bound_is_refused_naming_it_even_when_lenient(tmp_path, monkeypatch, lenient):
    values = _lines("claude-code.jsonl")
    path = _write_lines(tmp_path / "c.jsonl", values)
    longest = max(len(line) for line in path.read_bytes().splitlines())
    monkeypatch.setattr(reading, "LINE_LIMIT", longest)
    assert len(load_recording(path, lenient=lenient).items) > 0  # a line of exactly the limit is read
    values[2]["padding"] = "x" * longest
    path = _write_lines(tmp_path / "c.jsonl", values)
    size = len(path.read_bytes().splitlines()[2])
    with pytest.raises(RecordingError, match=rf"c\.jsonl:3: the line is {size:,} bytes, longer than the "):
        load_recording(path, lenient=lenient)


@pytest.mark.parametrize("name", JSONL_FIXTURES + JSON_FIXTURES)
def test_a_file_past_the_bound_is_refused_before_it_is_read(tmp_path, monkeypatch, name):
    path = tmp_path / name
    path.write_bytes((FIXTURES / name).read_bytes())
    monkeypatch.setattr(reading, "FILE_LIMIT", path.stat().st_size)
    load_recording(path)  # a file of exactly the limit is read
    monkeypatch.setattr(reading, "FILE_LIMIT", path.stat().st_size - 1)
    size = path.stat().st_size
    limit = f"{size - 1:,} bytes" if size - 1 < 1024 else rf"\S+ KiB \({size - 1:,} bytes\)"
    with pytest.raises(
        RecordingError, match=rf"{re.escape(name)}: the file is {size:,} bytes, larger than the {limit}"
    ):
        load_recording(path, lenient=True)


def test_a_whole_json_document_past_the_bound_is_refused_by_its_importer_too(tmp_path, monkeypatch):
    path = tmp_path / "chat.json"
    path.write_bytes((FIXTURES / "openai-chat.json").read_bytes())
    monkeypatch.setattr(reading, "FILE_LIMIT", 100)
    with pytest.raises(RecordingError, match=r"chat\.json: the file is [\d,]+ bytes, larger than the 100 bytes"):
        load_recording(path, format="openai-chat")  # not sniffed: the importer's own read is bounded


def test_a_subagent_file_past_the_bounds_is_refused_naming_it(tmp_path, monkeypatch):
    values = _lines("claude-code.jsonl")
    session = _write_lines(tmp_path / "sess.jsonl", values)
    subagents = tmp_path / "sess" / "subagents"
    subagents.mkdir(parents=True)
    line = {"type": "assistant", "uuid": "y1", "isSidechain": True, "message": {"id": "m", "content": []}}
    agent = _write_lines(subagents / "agent-1.jsonl", [line, {**line, "padding": "x" * 5000}])
    monkeypatch.setattr(reading, "LINE_LIMIT", 4096)
    with pytest.raises(RecordingError, match=r"agent-1\.jsonl:2: the line is [\d,]+ bytes, longer than the 4 KiB"):
        load_recording(session)
    monkeypatch.setattr(reading, "LINE_LIMIT", 64 * 1024)
    monkeypatch.setattr(reading, "FILE_LIMIT", agent.stat().st_size - 1)
    assert session.stat().st_size < agent.stat().st_size
    with pytest.raises(RecordingError, match=r"agent-1\.jsonl: the file is [\d,]+ bytes, larger than the "):
        load_recording(session)


@pytest.mark.parametrize("name", JSONL_FIXTURES + JSON_FIXTURES)
def test_a_byte_order_mark_at_the_start_is_skipped(tmp_path, name):
    original = FIXTURES / name
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + original.read_bytes())
    assert sniff(path) == sniff(original)
    assert repr(load_recording(path).items) == repr(load_recording(original).items)


# -- one reply of very many calls --------------------------------------------------------------------
def _one_reply_of_calls(tmp_path: Path, fmt: str, n: int) -> Path:
    if fmt == "claude-code":  # one line per call of one API message, as Claude Code writes them
        lines: list[Any] = [{"type": "user", "uuid": "u", "message": {"role": "user", "content": "go"}}]
        for i in range(n):
            message = {"id": "m1", "role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "R"}]}
            lines.append({"type": "assistant", "uuid": f"a{i}", "parentUuid": lines[-1]["uuid"], "message": message})
        return _write_lines(tmp_path / "session.jsonl", lines)
    events: list[Any] = [
        {"kind": "MessageEvent", "id": "m", "source": "user", "llm_message": {"role": "user", "content": "go"}}
    ]
    for i in range(n):  # V1 SDK events: the calls of one model response, then their results
        call = {"tool_call_id": f"t{i}", "tool_name": "terminal", "tool_call": {"arguments": "{}"}}
        events.append({"kind": "ActionEvent", "id": f"a{i}", "source": "agent", "llm_response_id": "r1", **call})
    for i in range(n):
        result = {"tool_call_id": f"t{i}", "observation": {"content": "ok"}}
        events.append({"kind": "ObservationEvent", "id": f"o{i}", "source": "environment", **result})
    path = tmp_path / "events.json"
    path.write_text(json.dumps(events))
    return path


@pytest.mark.parametrize("fmt", ["claude-code", "openhands"])
def test_a_reply_of_very_many_calls_keeps_every_call(tmp_path, fmt):
    n = 300  # benchmarks/bench_import.py times this shape at 15,000 and 30,000 calls
    recording = load_recording(_one_reply_of_calls(tmp_path, fmt, n))
    assert [c.id for c in recording.items[1].message.tool_calls] == [f"t{i}" for i in range(n)]
    assert recording.accounting["replayed"]["tool_calls"] == recording.accounting["raw"]["tool_calls"] == n


def test_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(RecordingError, match="empty"):
        sniff(path)


# -- every mutation of a valid line is a clean import or an import error ----------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["type", "text", "role", "content", "id"]), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            out += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            out += _paths(inner, (*prefix, index))
    return out


@st.composite
def mutated(draw: Any, name: str) -> tuple[str, str]:
    """A fixture with one value somewhere in one line (message, for the JSON files) replaced or deleted."""
    if name in JSON_FIXTURES:
        doc = json.loads((FIXTURES / name).read_text())
        target = doc
    else:
        values = _lines(name)
        index = draw(st.integers(0, len(values) - 1))
        target = values[index]
    path = draw(st.sampled_from(_paths(target)))
    replacement = draw(json_values)
    if not path:
        target = replacement
    else:
        parent = target
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
    if name in JSON_FIXTURES:
        return json.dumps(target if path else replacement), repr(path)
    values[index] = target
    return "".join(json.dumps(v) + "\n" for v in values), f"line {index + 1} at {path!r}"


def _import_or_refuse(tmp_path: Path, text: str):
    path = tmp_path / "recording"
    path.write_text(text)
    try:
        recording = load_recording(path)
    except RecordingError as exc:
        assert str(exc).startswith(str(path)), exc  # names the file (and the line or message)
        return None
    for item in recording.items:
        assert check_item(item) is None, item
    return recording


@pytest.mark.parametrize("name", JSONL_FIXTURES + JSON_FIXTURES)
@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_line_imports_cleanly_or_is_an_import_error(tmp_path, name, data):
    text, _ = data.draw(mutated(name))
    _import_or_refuse(tmp_path, text)


@pytest.mark.parametrize("name", JSONL_FIXTURES + JSON_FIXTURES)
@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_clean_import_of_a_mutated_line_replays(tmp_path, name, data):
    text, where = data.draw(mutated(name))
    recording = _import_or_refuse(tmp_path, text)
    if recording is None:
        return
    report = compare(["basic"], recording, Options(workdir=tmp_path))
    profile = report["profiles"][0]
    assert profile["status"] == "ok", (where, profile["error"])


# -- OpenHands fields of the wrong type ------------------------------------------------------------
@pytest.mark.parametrize("cause", [4.0, "4", True])
def test_an_openhands_observation_whose_cause_is_not_an_event_id_is_refused(tmp_path, cause):
    events = json.loads((FIXTURES / "openhands-events.json").read_text())
    assert events[5]["cause"] == 4 and events[4]["action"] == "run"
    events[5]["cause"] = cause
    path = tmp_path / "events.json"
    path.write_text(json.dumps(events))
    with pytest.raises(RecordingError, match=r"events\.json: event\[5\]: .*event\[5\]\.cause must be the integer id"):
        load_recording(path)
    recording = load_recording(path, lenient=True)  # skipped and counted, never bookkeeping
    assert [s["line"] for s in recording.skipped] == ["event[5]"]
    assert recording.accounting["reasons"]["malformed_line"]["lines"] == 1


@pytest.mark.parametrize("instruction", [5, ["Fix the bug."], {"text": "Fix the bug."}])
def test_an_openhands_instruction_that_is_not_a_string_is_refused(tmp_path, instruction):
    values = _lines("openhands-run.jsonl")
    values[0]["instruction"] = instruction
    path = _write_lines(tmp_path / "run.jsonl", values)
    with pytest.raises(RecordingError, match=r"run\.jsonl:1: expected an instance whose instruction is a string"):
        load_recording(path)
    recording = load_recording(path, lenient=True)  # the instance is replayed, the instruction counted
    assert [s["line"] for s in recording.skipped] == [1]
    assert recording.accounting["reasons"]["malformed_line"]["lines"] == 1


# -- a lone surrogate escape ---------------------------------------------------------------------------
def _cut_inside_an_emoji(value: Any, wanted: set[str]) -> Any:
    """``value`` with each string of ``wanted`` ending in a lone high surrogate, as a JavaScript
    string cut inside an emoji ends."""
    if isinstance(value, str):
        return value + "\ud83d" if value in wanted else value
    if isinstance(value, dict):
        return {k: _cut_inside_an_emoji(v, wanted) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_inside_an_emoji(v, wanted) for v in value]
    return value


@pytest.mark.parametrize("name", JSONL_FIXTURES + JSON_FIXTURES)
def test_a_lone_surrogate_escape_becomes_a_replacement_character(tmp_path, name):
    """``"\\ud83d"`` with no low half is what a JavaScript string cut inside an emoji writes; the
    line is read, the lone half becoming U+FFFD, instead of being refused whole."""
    original = FIXTURES / name
    path = tmp_path / name
    wanted = {item.text for item in load_recording(original).items if type(item).__name__ == "UserItem"}
    if name in JSONL_FIXTURES:
        _write_lines(path, [_cut_inside_an_emoji(line, wanted) for line in _lines(name)])
    else:
        document = _cut_inside_an_emoji(json.loads(original.read_text()), wanted)
        path.write_text(json.dumps(document, indent=1))
    assert b"\\ud83d" in path.read_bytes()
    assert sniff(path) == sniff(original)
    items = repr(load_recording(path).items)
    assert "\ufffd" in items
    assert items.replace("\ufffd", "") == repr(load_recording(original).items)


def test_an_unreadable_first_line_is_refused_saying_why_it_is_not_json(tmp_path):
    path = tmp_path / "session.jsonl"
    path.write_bytes(b'{"type": "user", "message": {"content": "a\x01b"}}\n{"type": "user"}\n')
    with pytest.raises(RecordingError, match=r"session\.jsonl:1: .*\(invalid JSON: .*control character"):
        sniff(path)


# -- tool-call ids and names past the kernel's bounds ----------------------------------------------------
def _openai_chat_with(tmp_path: Path, *, call_id: str | None = None, name: str | None = None) -> Path:
    messages = json.loads((FIXTURES / "openai-chat.json").read_text())
    first = next(c for m in messages for c in m.get("tool_calls") or [])
    old = first["id"]
    if call_id is not None:
        first["id"] = call_id
        for m in messages:
            if m.get("tool_call_id") == old:
                m["tool_call_id"] = call_id
    if name is not None:
        first["function"]["name"] = name
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(messages))
    return path


@pytest.mark.parametrize("call_id", ["", "call_" + "a" * 300], ids=["empty", "overlong"])
def test_an_empty_or_overlong_call_id_is_renamed_and_its_result_follows(tmp_path, call_id):
    recording = load_recording(_openai_chat_with(tmp_path, call_id=call_id))
    calls = [c for item in recording.items if hasattr(item, "message") for c in item.message.tool_calls]
    renamed = calls[0].id
    assert renamed != call_id and 0 < len(renamed) <= 256 and renamed.endswith("~1")
    results = [item.call_id for item in recording.items if type(item).__name__ == "ToolResultItem"]
    assert renamed in results
    profile = compare(["basic"], recording, Options(workdir=tmp_path))["profiles"][0]
    assert profile["status"] == "ok", profile["error"]


@pytest.mark.parametrize("name", ["", "n" * 257], ids=["empty", "overlong"])
def test_a_tool_name_out_of_bounds_is_an_import_error_naming_it(tmp_path, name):
    with pytest.raises(RecordingError, match=r"message 2: .*tool call 0: name must be a string of 1-256 characters"):
        load_recording(_openai_chat_with(tmp_path, name=name))
