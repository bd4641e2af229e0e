"""Scoped history lookup, context_remaining, notes tools' bounds, window ids, steward policy."""

from __future__ import annotations

import uuid

import orjson
import uuid6
from helpers_rollover import call, rollover_kernel, step
from hypothesis import given
from hypothesis import strategies as st

from ctxkernel import Message, ScriptedModel
from ctxkernel_rollover import is_uuid7, next_window_id
from ctxkernel_rollover.state import state_of
from ctxkernel_rollover.window_ids import timestamp_ms


def two_windows(kernel):
    session = kernel.open_session()
    session.user("first window request")
    model = ScriptedModel(
        [
            Message.assistant("", [call("r1", "read_file", path="a.py")]),
            Message.assistant("", [call("n", "new_context", next_goal="second")]),
            Message.assistant("in window two", [call("r2", "read_file", path="b.py")]),
            Message.assistant("done"),
        ]
    )
    step(session, model, harness=lambda c: f"contents of {c.arguments['path']} " * 50)
    step(session, model)
    session.end_turn()
    session.user("second window request")
    step(session, model, harness=lambda c: f"contents of {c.arguments['path']} " * 50)
    step(session, model)
    return session


def run(session, name, **arguments):
    outcome = session.run_tool({"id": "t", "name": name, "arguments": arguments})
    return outcome


def test_history_lookup_by_window_id_role_and_seq_range_is_bounded(tmp_path):
    session = two_windows(rollover_kernel(tmp_path, window=32_000, reserve=2_000))
    state = state_of(session.context)
    first = orjson.loads(run(session, "history_lookup", window=state.first, role="tool").content)
    assert [i["id"] for i in first["items"]] and all(i["role"] == "tool" for i in first["items"])
    assert {i["window_id"] for i in first["items"]} == {state.first}
    assert "a.py" in orjson.dumps(first["items"]).decode() and "b.py" not in orjson.dumps(first["items"]).decode()
    second = orjson.loads(run(session, "history_lookup", window=state.current, role="tool").content)
    assert "b.py" in orjson.dumps(second["items"]).decode() and "a.py" not in orjson.dumps(second["items"]).decode()
    assert {i["window_id"] for i in second["items"]} == {state.current}
    found = orjson.loads(run(session, "history_lookup", query="first window request", role="user").content)
    assert len(found["items"]) == 1
    ranged = orjson.loads(run(session, "history_lookup", seq_from=0, seq_to=3, limit=2, max_chars=10).content)
    assert len(ranged["items"]) <= 2 and all(len(i.get("preview", "")) <= 11 for i in ranged["items"])
    too_many = run(session, "history_lookup", limit=51)
    assert too_many.is_error and "limit" in too_many.content
    seq = next(e.seq for e in session.events if e.type == "tool/result")
    read = orjson.loads(run(session, "history_read", item=f"item_{seq}", max_chars=30).content)
    assert "a.py" in orjson.dumps(read).decode()
    assert run(session, "history_read", item=f"item_{seq}", max_chars=20_001).is_error


def test_context_remaining_reports_the_window_and_the_thresholds(tmp_path):
    session = two_windows(rollover_kernel(tmp_path, window=32_000, reserve=2_000))
    text = run(session, "context_remaining").content
    p = session.pressure()
    assert f"{p.remaining} tokens remain of the 30000-token window" in text
    assert state_of(session.context).current in text and "75%" in text and "90%" in text
    seed = session.surface.nodes[0].message.text
    assert "Context remaining: about " in seed and " of 30000 tokens" in seed


def test_note_tools_page_and_bound_their_output(tmp_path):
    session = two_windows(rollover_kernel(tmp_path, window=32_000, reserve=2_000))
    for i in range(25):
        assert not run(session, "note_create", path=f"n/{i:02}", content=f"line {i}\n" + "x" * 50).is_error
    listing = run(session, "note_list", prefix="n/", limit=10).content
    assert listing.count("\n- ") == 10 and "note_list(cursor='n/09')" in listing
    body = run(session, "note_create", path="long", content="y" * 30_000)
    assert not body.is_error
    page = run(session, "note_get", note="long", max_chars=100).content
    assert "offset_chars=100" in page and len(page) < 600
    run(session, "note_update", note="long", content="short now")
    assert "y" * 50 in run(session, "note_get", note="long", version=1, max_chars=60).content
    assert run(session, "note_get", note="long", version=3).is_error
    hits = run(session, "note_search", query="line 1").content
    assert hits.startswith("[model-authored] n/01:1: line 1")


def test_note_get_past_the_end_is_refused_naming_the_length(tmp_path):
    """A page past a note's end is an error saying how long the note is (it answered an empty
    note, as if the note had no text), and nothing is written."""
    session = two_windows(rollover_kernel(tmp_path, window=32_000, reserve=2_000))
    assert not run(session, "note_create", path="plan", content="step one").is_error
    before = session.store.path(session.id).read_bytes()
    past = run(session, "note_get", note="plan", offset_chars=999)
    assert past.is_error and "999" in past.content and "8 characters" in past.content, past.content
    assert session.store.path(session.id).read_bytes() == before
    assert not run(session, "note_get", note="plan", offset_chars=8).is_error  # the end itself: an empty page


def test_steward_saves_the_goal_and_rolls_over_only_when_reminded(tmp_path):
    from ctxkernel_rollover.plugin import steward_actions

    kernel = rollover_kernel(tmp_path, window=12_000, reserve=1_000)
    session = kernel.open_session()
    session.user("port the parser")
    request = session.prepare_request()
    assert steward_actions(session.context, request) is None
    for i in range(40):
        session.commit_reply(Message.assistant("", [call(f"r{i}", "read", path="x")]))
        session.tool_result(f"r{i}", f"data {i} and some more words\n" * 60)
        request = session.prepare_request()
        if "<rollover-reminder" in request.messages[-1].text:
            break
        assert steward_actions(session.context, request) is None
    assert "<rollover-reminder" in request.messages[-1].text
    calls = steward_actions(session.context, request)
    assert [c["name"] for c in calls] == ["note_create", "new_context"]
    assert calls[0]["arguments"]["content"] == "port the parser"


@given(st.integers(min_value=0, max_value=(1 << 48) - 2))
def test_next_window_id_sorts_after_any_previous_id(ts):
    previous = str(uuid6.UUID(int=(ts << 80) | (0xFFFF << 64) | 0xFFFF, version=7))
    new = next_window_id(previous)
    assert is_uuid7(new) and uuid.UUID(new).int > uuid.UUID(previous).int
    assert timestamp_ms(new) >= ts


def test_window_ids_are_monotonic_within_a_process():
    ids = [next_window_id(None) for _ in range(200)]
    assert ids == sorted(ids) and len(set(ids)) == 200 and all(is_uuid7(i) for i in ids)
    assert not is_uuid7(str(uuid.uuid4())) and not is_uuid7("nope")


def test_a_note_written_right_after_a_switch_carries_the_new_window(tmp_path):
    # the commit hook stamps the notes with the window id of the commit's own data; a note
    # written before the state is folded again (no step in between) carries the new window
    from ctxkernel.recall.notes import Notes
    from ctxkernel_rollover.switch import switch

    session = rollover_kernel(tmp_path).open_session()
    session.user("start")
    session.prepare_request()
    session.commit_reply(Message.assistant("reading"))
    first = state_of(session.context).current
    result = switch(session.context, "manual")
    note = Notes.for_session(session).write("after/switch", "written at once")
    assert note.window == result.data["window_id"] == state_of(session.context).current != first


def test_the_steward_writes_only_from_the_request_and_within_its_cap(tmp_path):
    """It restates the user's message the request shows, at most STEWARD_GOAL_CHARS of it (a
    model's notes are short), never the log's: a request that does not show it gives no goal."""
    import dataclasses

    from ctxkernel_rollover.plugin import STEWARD_GOAL_CHARS, steward_actions

    kernel = rollover_kernel(tmp_path, window=12_000, reserve=1_000)
    session = kernel.open_session()
    session.user("port the parser, " + "keeping every public name as it is; " * 200)
    for i in range(40):
        request = session.prepare_request()
        if "<rollover-reminder" in request.messages[-1].text:
            break
        session.commit_reply(Message.assistant("", [call(f"r{i}", "read", path="x")]))
        session.tool_result(f"r{i}", f"data {i} and some more words\n" * 60)
    calls = steward_actions(session.context, request)
    goal = calls[0]["arguments"]["content"]
    assert goal.startswith("port the parser") and len(goal) == STEWARD_GOAL_CHARS == 600
    unseen = dataclasses.replace(request, messages=[m for m in request.messages if m.source.kind != "user"])
    calls = steward_actions(session.context, unseen)
    assert [c["name"] for c in calls] == ["new_context"] and calls[0]["arguments"]["next_goal"] is None


def test_a_refused_note_call_before_the_first_window_leaves_the_log_as_it_was(tmp_path):
    # the note tools recorded the first window before their checks: a refusal still wrote it
    session = rollover_kernel(tmp_path, max_note_bytes=100).open_session()
    path = session.store.path(session.id)
    before = path.read_bytes() if path.exists() else b""
    refused = [
        ("note_create", {"path": "../outside", "content": "x"}),
        ("note_create", {"path": "big", "content": "x" * 101}),
        ("note_append", {"path": "", "text": "x"}),
        ("note_append", {"path": "big", "text": "x" * 101}),
        ("note_update", {"note": "n_0123456789abcdef", "content": "x"}),
        ("note_update", {"note": "nowhere", "content": "x"}),
        ("note_delete", {"note": "nowhere"}),
    ]
    for name, arguments in refused:
        outcome = run(session, name, **arguments)
        assert outcome.is_error, (name, outcome.content)
        assert (path.read_bytes() if path.exists() else b"") == before, (name, outcome.content)
    assert state_of(session.context).current is None
    # a call that passes its checks records the first window, then writes
    assert not run(session, "note_create", path="goal", content="x").is_error
    assert state_of(session.context).current is not None
