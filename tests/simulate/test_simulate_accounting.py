"""Complete imports: ``source.accounting`` counts what a file holds against what is replayed.

Each Claude Code shape is a small file written by the test (never a copy of a recording): parallel
calls whose results sit on side branches, a compaction boundary whose logical parent is not in the
file, inline sidechains and ``subagents/*.jsonl`` files, an unknown line type. The real recordings
in ../shared/transcripts are checked too when they are there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import orjson
import pytest

from ctxkernel.cli import main
from ctxkernel.simulate import (
    AssistantItem,
    Options,
    RecordingError,
    ToolResultItem,
    UserItem,
    claude_code,
    load_recording,
    run_profile,
)
from ctxkernel.simulate.accounting import CONTENT_KEYS, REASONS

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "simulate" / "fixtures"
TRANSCRIPTS = REPO.parent / "shared" / "transcripts"


def write_lines(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _line(kind: str, uuid: str, parent: str | None, **extra) -> dict:
    return {"type": kind, "uuid": uuid, "parentUuid": parent, "isSidechain": False, "sessionId": "s", **extra}


def user(uuid, parent, content, **extra):
    return _line("user", uuid, parent, message={"role": "user", "content": content}, **extra)


def assistant(uuid, parent, mid, blocks, **extra):
    message = {"id": mid, "role": "assistant", "model": "claude-x", "content": blocks}
    return _line("assistant", uuid, parent, message=message, **extra)


def call(call_id, name="Read", **arguments):
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments or {"file_path": f"{call_id}.py"}}


def result(call_id, text):
    return [{"type": "tool_result", "tool_use_id": call_id, "content": text}]


def progress(uuid, parent):
    return _line("progress", uuid, parent, data={"type": "hook_progress"})


def parallel_calls() -> list[dict]:
    """Two calls in one API message, written as Claude Code 2.x does: the second tool_use line hangs
    off a progress line, and each result's parent is its own tool_use line."""
    return [
        user("u1", None, "Read both files."),
        assistant("a1", "u1", "msg_1", [call("toolu_a")]),
        progress("p1", "a1"),
        assistant("a2", "p1", "msg_1", [call("toolu_b")]),
        user("r1", "a1", result("toolu_a", "alpha contents")),
        user("r2", "a2", result("toolu_b", "beta contents")),
        assistant("a3", "r2", "msg_2", [{"type": "text", "text": "Both read."}]),
    ]


def check_invariant(accounting: dict) -> None:
    assert "unexplained" not in accounting["reasons"], accounting
    assert set(accounting["reasons"]) <= set(REASONS)
    for key in CONTENT_KEYS:
        explained = sum(of.get(key, 0) for of in accounting["reasons"].values())
        assert accounting["raw"][key] - accounting["replayed"][key] == explained, (key, accounting)


def test_parallel_call_results_on_side_branches_are_paired(tmp_path):
    rec = load_recording(write_lines(tmp_path / "s.jsonl", parallel_calls()))
    results = [i.call_id for i in rec.items if isinstance(i, ToolResultItem)]
    assert results == ["toolu_a", "toolu_b"]
    assert [i.content for i in rec.items if isinstance(i, ToolResultItem)] == ["alpha contents", "beta contents"]
    acct = rec.accounting
    assert acct["complete"] and acct["synthetic_results"] == 0
    assert acct["raw"]["tool_calls"] == acct["replayed"]["tool_calls"] == 2
    check_invariant(acct)
    metrics = run_profile("none", rec, Options())
    assert metrics["synthetic_results"] == 0


def test_a_boundary_whose_logical_parent_is_not_in_the_file_continues_the_walk(tmp_path):
    lines = [
        user("u1", None, "The task: make the parser stream."),
        assistant("a1", "u1", "msg_1", [call("toolu_1")]),
        user("r1", "a1", result("toolu_1", "def parse(): ...")),
        assistant("a2", "r1", "msg_2", [{"type": "text", "text": "Read it."}]),
        _line(
            "system",
            "c1",
            None,
            subtype="compact_boundary",
            logicalParentUuid="cut-off",
            compactMetadata={"trigger": "auto", "preTokens": 900},
        ),
        user("s1", "c1", "This session is being continued. Summary: ...", isCompactSummary=True),
        user("u2", "s1", "Go on."),
        assistant("a3", "u2", "msg_3", [call("toolu_2")]),
        user("r2", "a3", result("toolu_2", "ok")),
        assistant("a4", "r2", "msg_4", [{"type": "text", "text": "Done."}]),
    ]
    rec = load_recording(write_lines(tmp_path / "s.jsonl", lines))
    users = [i.text for i in rec.items if isinstance(i, UserItem)]
    assert users == ["The task: make the parser stream.", "Go on."]  # the task is not lost
    assert rec.accounting["replayed"]["tool_calls"] == 2 and rec.accounting["complete"]
    assert rec.accounting["reasons"]["harness_summary"] == {"lines": 1}
    check_invariant(rec.accounting)


def test_sidechains_and_subagent_files_are_counted_not_replayed(tmp_path):
    lines = [
        *parallel_calls(),
        {**assistant("x1", "a3", "msg_side", [call("toolu_s1"), call("toolu_s2")]), "isSidechain": True},
        {**user("x2", "x1", result("toolu_s1", "side")), "isSidechain": True},
    ]
    session = write_lines(tmp_path / "sess.jsonl", lines)
    subagents = tmp_path / "sess" / "subagents"
    subagents.mkdir(parents=True)
    write_lines(
        subagents / "agent-1.jsonl",
        [
            {**user("y1", None, "Find the bug."), "isSidechain": True},
            {
                **assistant("y2", "y1", "msg_y", [call("toolu_y1"), call("toolu_y2"), call("toolu_y3")]),
                "isSidechain": True,
            },
        ],
    )
    acct = load_recording(session).accounting
    assert acct["raw"]["sidechain_calls"] == 5 and acct["replayed"]["sidechain_calls"] == 0
    assert acct["reasons"]["sidechain"]["sidechain_calls"] == 2
    assert acct["reasons"]["subagent"]["sidechain_calls"] == 3
    assert not acct["complete"]
    check_invariant(acct)


def test_an_unknown_line_type_is_counted_under_a_reason(tmp_path):
    lines = [*parallel_calls(), {"type": "telemetry-v9", "uuid": "t1", "parentUuid": "a3", "payload": {}}]
    acct = load_recording(write_lines(tmp_path / "s.jsonl", lines)).accounting
    assert acct["reasons"]["unknown_type"] == {"lines": 1}
    assert acct["reasons"]["harness_bookkeeping"] == {"lines": 1}  # the progress line
    check_invariant(acct)


def test_abandoned_branches_are_counted(tmp_path):
    lines = [
        *parallel_calls()[:-1],
        assistant("old", "r2", "msg_old", [call("toolu_old")]),
        assistant("a3", "r2", "msg_2", [{"type": "text", "text": "Both read."}]),
    ]
    acct = load_recording(write_lines(tmp_path / "s.jsonl", lines)).accounting
    assert acct["reasons"]["abandoned_branch"] == {"assistant_messages": 1, "tool_calls": 1}
    check_invariant(acct)


def test_a_call_without_result_in_the_file_is_the_only_synthetic_result(tmp_path):
    lines = parallel_calls()
    del lines[5]  # toolu_b's result
    rec = load_recording(write_lines(tmp_path / "s.jsonl", lines))
    assert rec.accounting["synthetic_results"] == 1
    assert rec.accounting["reasons"]["no_result_in_file"] == {"unanswered_calls": 1}
    assert rec.accounting["complete"]  # every call and result the file holds was replayed
    assert run_profile("none", rec, Options())["synthetic_results"] == 1


def test_a_server_tool_call_is_replayed_in_its_message_not_counted_as_a_call(tmp_path):
    # web search runs on the provider: its call and result stay in the reply, no client result
    search = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}}
    found = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    lines = [
        user("u1", None, "Search for it."),
        assistant("a1", "u1", "msg_1", [search, found, {"type": "text", "text": "Found it."}]),
    ]
    rec = load_recording(write_lines(tmp_path / "s.jsonl", lines))
    check_invariant(rec.accounting)
    assert rec.accounting["complete"] and rec.accounting["raw"]["tool_calls"] == 0


def test_a_call_id_reused_by_a_later_message_is_counted_as_two_calls(tmp_path):
    # some Anthropic-compatible providers number their calls per reply: ids repeat across replies
    lines = [
        user("u1", None, "Read it twice."),
        assistant("a1", "u1", "msg_1", [call("call_0")]),
        user("r1", "a1", result("call_0", "first")),
        assistant("a2", "r1", "msg_2", [call("call_0")]),
        user("r2", "a2", result("call_0", "second")),
        assistant("a3", "r2", "msg_3", [call("call_1"), call("call_1")]),  # twice in one message
        user("r3", "a3", result("call_1", "third") + result("call_1", "fourth")),
    ]
    rec = load_recording(write_lines(tmp_path / "s.jsonl", lines))
    check_invariant(rec.accounting)
    assert rec.accounting["raw"]["tool_calls"] == rec.accounting["replayed"]["tool_calls"] == 4


def test_a_main_line_whose_parent_is_a_sidechain_line_does_not_replay_the_sidechain(tmp_path):
    lines = [
        user("u1", None, "Find the bug."),
        {**user("x1", "u1", "Subagent: look in parser.py."), "isSidechain": True},
        assistant("a1", "x1", "msg_1", [{"type": "text", "text": "Found it."}]),
    ]
    rec = load_recording(write_lines(tmp_path / "s.jsonl", lines))
    assert [i.text for i in rec.items if isinstance(i, UserItem)] == ["Find the bug."]
    assert rec.accounting["reasons"]["sidechain"] == {"lines": 1}
    check_invariant(rec.accounting)


def test_reply_lines_without_a_message_id_are_counted_by_their_request_id(tmp_path):
    first, second = (
        assistant("a1", "u1", None, [{"type": "text", "text": "Reading."}]),
        assistant("a2", "a1", None, [call("toolu_1")]),
    )
    for line in (first, second):
        del line["message"]["id"]
        line["requestId"] = "req_1"
    lines = [user("u1", None, "Read it."), first, second, user("r1", "a2", result("toolu_1", "ok"))]
    rec = load_recording(write_lines(tmp_path / "s.jsonl", lines))
    assert rec.accounting["raw"]["assistant_messages"] == rec.accounting["replayed"]["assistant_messages"] == 1
    check_invariant(rec.accounting)


def missing_parents_walk(m: int) -> list[dict]:
    """3m lines whose walk crosses a block of walked lines to find each missing parent's
    predecessor (hostile; benchmarks/bench_import.py times it at 12,000 and 24,000 lines)."""
    parent: dict[int, str | None] = {3 * m - 1: "u" + str(m)}
    parent.update({m + i: "u" + str(m + i + 1) for i in range(m)})  # the block, walked first
    for k in range(m - 1):
        parent[2 * m + k] = "cut-off"  # a missing parent: back past the block ...
        parent[m - 1 - k] = "u" + str(2 * m + k + 1)  # ... to a line that leads up again
    return [user(f"u{i}", parent.get(i), "x") for i in range(3 * m)]


def test_a_walk_of_many_missing_parents_replays_every_line_but_one(tmp_path):
    m = 100
    rec = load_recording(write_lines(tmp_path / "s.jsonl", missing_parents_walk(m)))
    assert len(rec.items) == 3 * m - 1  # all but u0, which the last jump back does not reach
    check_invariant(rec.accounting)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if p.suffix in (".json", ".jsonl", ".traj")))
def test_every_fixture_accounts_for_everything(name):
    rec = load_recording(FIXTURES / name, lenient="malformed" in name)
    check_invariant(rec.accounting)


def test_openhands_v1_bookkeeping_events_are_counted(tmp_path):
    def event(i, kind, **extra):
        return {"id": f"e{i}", "timestamp": "2025-10-30T10:00:00", "source": "agent", "kind": kind, **extra}

    history = [
        event(
            0, "MessageEvent", source="user", llm_message={"role": "user", "content": [{"type": "text", "text": "Go"}]}
        ),
        event(1, "ConversationStateUpdateEvent", key="execution_status", value="running"),
        event(
            2,
            "ActionEvent",
            tool_call_id="c1",
            tool_name="terminal",
            llm_response_id="r1",
            tool_call={"arguments": "{}"},
        ),
        event(3, "ObservationEvent", tool_call_id="c1", tool_name="terminal", observation={"content": "ok"}),
        event(4, "PauseEvent"),
        event(5, "SomethingNew", value=1),
    ]
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"instance_id": "i1", "instruction": "Go", "history": history}) + "\n")
    acct = load_recording(path).accounting
    assert acct["reasons"]["harness_bookkeeping"] == {"lines": 2}
    assert acct["reasons"]["unknown_type"] == {"lines": 1}
    assert acct["complete"]
    check_invariant(acct)


# -- the command -----------------------------------------------------------------------------------------
def test_table_says_what_was_not_replayed_and_strict_refuses(tmp_path, capsys):
    lines = [
        *parallel_calls(),
        {**assistant("x1", "a3", "msg_side", [call("toolu_s1")]), "isSidechain": True},
    ]
    path = write_lines(tmp_path / "s.jsonl", lines)
    assert main(["simulate", "--transcript", str(path), "--profile", "none", "--no-progress"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("not replayed:")]
    assert len(notes) == 1 and "1 sidechain call (sidechain)" in notes[0]
    assert main(["simulate", "--transcript", str(path), "--profile", "none", "--strict", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "not replayed" in err and "--strict" in err
    complete = write_lines(tmp_path / "ok.jsonl", parallel_calls())
    assert main(["simulate", "--transcript", str(complete), "--profile", "none", "--strict", "--no-progress"]) == 0
    assert "not replayed:" not in capsys.readouterr().out


# -- the real recordings -----------------------------------------------------------------------------------
def _transcripts() -> list[Path]:
    if not TRANSCRIPTS.is_dir():
        return []
    return sorted(p for p in TRANSCRIPTS.glob("*/*") if p.suffix in (".json", ".jsonl", ".traj"))


@pytest.mark.transcripts
@pytest.mark.skipif(
    not _transcripts(), reason=f"no real transcripts at {TRANSCRIPTS} (they are not part of the project)"
)
@pytest.mark.parametrize("path", _transcripts(), ids=lambda p: p.stem[:40])
def test_real_recordings_are_imported_whole(path):
    rec = load_recording(path)
    check_invariant(rec.accounting)
    assert rec.accounting["complete"], rec.accounting
    calls = {c.id for i in rec.items if isinstance(i, AssistantItem) for c in i.message.tool_calls}
    answered = {i.call_id for i in rec.items if isinstance(i, ToolResultItem)}
    # a synthetic result only for a call whose result is truly absent from the file
    text = path.read_text()
    for call_id in calls - answered:
        assert not re.search(rf'"(?:tool_use_id|tool_call_id|call_id)":\s*"{re.escape(call_id)}"', text)
    assert rec.accounting["synthetic_results"] == len(calls - answered)


@pytest.mark.transcripts
@pytest.mark.skipif(
    not _transcripts(), reason=f"no real transcripts at {TRANSCRIPTS} (they are not part of the project)"
)
def test_claude_code_session_replays_every_call_with_its_result():
    path = next((p for p in _transcripts() if p.parent.name == "claude-code"), None)
    if path is None:
        pytest.skip("no Claude Code transcript")
    held = {
        b["id"]
        for line in path.read_bytes().splitlines()
        for b in ((orjson.loads(line).get("message") or {}).get("content") or [])
        if isinstance(b, dict) and b.get("type") == "tool_use"
    }
    rec = load_recording(path)
    answered = {i.call_id for i in rec.items if isinstance(i, ToolResultItem)}
    assert held <= answered


def test_corpus_mode_leaves_subagent_files_to_their_session(tmp_path):
    from ctxkernel.simulate.corpus import find_files

    session = write_lines(tmp_path / "sess.jsonl", parallel_calls())
    subagents = tmp_path / "sess" / "subagents"
    subagents.mkdir(parents=True)
    write_lines(subagents / "agent-1.jsonl", [{**user("y1", None, "Find it."), "isSidechain": True}])
    lone = tmp_path / "other" / "subagents"
    lone.mkdir(parents=True)
    orphan = write_lines(lone / "agent-2.jsonl", [user("z1", None, "Alone.")])
    assert find_files(str(tmp_path)) == [orphan, session]  # an orphan (no session beside it) is replayed


def test_strict_corpus_mode_exits_2_when_a_session_was_not_replayed_whole(tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_lines(folder / "whole.jsonl", parallel_calls())
    side = {**assistant("x1", "a3", "msg_side", [call("toolu_s1")]), "isSidechain": True}
    write_lines(folder / "partial.jsonl", [*parallel_calls(), side])
    args = ["simulate", "--transcripts", str(folder), "--profile", "none", "--no-progress"]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--strict"]) == 2
    err = capsys.readouterr().err
    assert "partial.jsonl" in err and "1 sidechain call" in err and "whole.jsonl" not in err


def test_more_subagent_files_than_the_bound_are_refused_not_counted_in_part(tmp_path, monkeypatch):
    session = write_lines(tmp_path / "sess.jsonl", parallel_calls())
    subagents = tmp_path / "sess" / "subagents"
    subagents.mkdir(parents=True)
    for n in range(3):
        write_lines(subagents / f"agent-{n}.jsonl", [assistant(f"y{n}", None, f"msg_y{n}", [call(f"toolu_y{n}")])])
    monkeypatch.setattr(claude_code, "MAX_SUBAGENT_FILES", 3)
    assert load_recording(session).accounting["raw"]["sidechain_calls"] == 3
    monkeypatch.setattr(claude_code, "MAX_SUBAGENT_FILES", 2)
    with pytest.raises(RecordingError, match=r"subagents: 3 subagent files, more than the 2 read beside one session"):
        load_recording(session)
