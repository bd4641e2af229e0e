"""The notes and history tools (Parts 4-6): privacy, atomic refusals, paging and limits."""

from __future__ import annotations

import json

import pytest

from ctxkernel import Message, ToolCallBlock
from ctxkernel.events import append_op
from ctxkernel.session import EventSpec


@pytest.fixture
def kernel(handoff_kernel):
    # the history tools from the first request (the seed's header): they come with the first
    # switch otherwise (test_handoff_config)
    return handoff_kernel(window=200_000, tools={"offer": "always"})


def call(session, name, **arguments):
    outcome = session.run_tool(ToolCallBlock(f"id-{name}", name, arguments))
    return outcome


def ok(session, name, **arguments):
    outcome = call(session, name, **arguments)
    assert not outcome.is_error, outcome.content
    return json.loads(outcome.content)


def log_bytes(session):
    return session.store.path(session.id).read_bytes()


def refused(session, name, **arguments):
    before = log_bytes(session)
    outcome = call(session, name, **arguments)
    assert outcome.is_error, outcome.content
    assert log_bytes(session) == before, "a refusal must leave the log byte-identical"
    return outcome.content


def test_notes_round_trip_under_self_notes(kernel):
    session = kernel.open_session()
    written = ok(session, "notes_write_file", path="self/notes/plan/next.md", content="step 1\n")
    assert written["path"] == "self/notes/plan/next.md" and written["version"] == 1
    ok(session, "notes_append_to_file", path="plan/next.md", content="step 2\n")  # the bare form works too
    read = ok(session, "notes_read_file", path="self/notes/plan/next.md")
    assert read["content"] == "step 1\nstep 2\n" and read["trust"] == "model-authored"
    listed = ok(session, "notes_list_files_by_prefix", prefix="self/notes/plan/")
    assert [f["path"] for f in listed["files"]] == ["self/notes/plan/next.md"]
    hits = ok(session, "notes_search_contents", query="STEP", case_sensitive=False)["hits"]
    assert [(h["path"], h["line"]) for h in hits] == [("self/notes/plan/next.md", 1), ("self/notes/plan/next.md", 2)]
    assert ok(session, "notes_search_contents", query="STEP")["hits"] == []


@pytest.mark.parametrize(
    "path", ["../other/notes/x", "/etc/passwd", "self/notes/a//b", "", "self/other/x", "a/./b", "self/notes/../x"]
)
def test_bad_note_paths_are_refused_and_write_nothing(kernel, path):
    session = kernel.open_session()
    message = refused(session, "notes_write_file", path=path, content="x")
    assert "notes_write_file refused" in message


def test_notes_of_session_a_are_unreachable_from_session_b(kernel):
    a = kernel.open_session()
    b = kernel.open_session()
    ok(a, "notes_write_file", path="secret.md", content="A's secret")
    assert "no note" in refused(b, "notes_read_file", path="secret.md")
    refused(b, "notes_read_file", path=f"../{a.id}/secret.md")
    refused(b, "notes_read_file", path=f"self/notes/../../{a.id}/notes/secret.md")
    assert ok(b, "notes_list_files_by_prefix")["files"] == []
    assert ok(b, "notes_search_contents", query="secret")["hits"] == []
    assert ok(a, "notes_read_file", path="secret.md")["content"] == "A's secret"


def test_note_size_limit_at_and_past_the_bound(kernel):
    session = kernel.open_session()
    ok(session, "notes_write_file", path="big.md", content="a" * 1_000_000)
    ok(session, "notes_write_file", path="wide.md", content="é" * 500_000)  # 1,000,000 bytes in 500,000 characters
    message = refused(session, "notes_write_file", path="big2.md", content="é" * 500_000 + "a")  # 1,000,001 bytes
    assert "1000000 bytes per note" in message
    # an append that would cross the bound is refused and the note keeps its saved content
    refused(session, "notes_append_to_file", path="big.md", content="b")
    assert ok(session, "notes_read_file", path="big.md", max_chars=10)["total_chars"] == 1_000_000


def test_session_limits_files_and_bytes_are_refused_never_evicted(kernel):
    session = kernel.open_session()
    for i in range(64):
        ok(session, "notes_write_file", path=f"n/{i:02d}.md", content="x")
    assert "limit is 64" in refused(session, "notes_write_file", path="n/64.md", content="x")
    assert ok(session, "notes_list_files_by_prefix", prefix="n/", limit=50)["total"] == 64
    other = kernel.open_session()
    for i in range(4):
        ok(other, "notes_write_file", path=f"b{i}.md", content="y" * 999_999)
    ok(other, "notes_write_file", path="b4.md", content="z" * 4)  # exactly 4,000,000 bytes
    assert "4000000" in refused(other, "notes_append_to_file", path="b4.md", content="z")
    assert ok(other, "notes_read_file", path="b0.md", max_chars=1)["total_chars"] == 999_999


def test_note_read_and_list_limits(kernel):
    session = kernel.open_session()
    ok(session, "notes_write_file", path="long.md", content="L" * 30_000)
    first = ok(session, "notes_read_file", path="long.md")
    assert len(first["content"]) == 8_000 and first["next_offset_chars"] == 8_000
    page = ok(session, "notes_read_file", path="long.md", offset_chars=8_000, max_chars=20_000)
    assert len(page["content"]) == 20_000 and page["next_offset_chars"] == 28_000
    refused(session, "notes_read_file", path="long.md", max_chars=20_001)
    for i in range(55):
        ok(session, "notes_write_file", path=f"many/{i:02d}", content="m")
    listed = ok(session, "notes_list_files_by_prefix", prefix="self/notes/many/")
    assert len(listed["files"]) == 20 and listed["has_more"]
    full = ok(session, "notes_list_files_by_prefix", prefix="many/", limit=50)
    assert len(full["files"]) == 50
    rest = ok(session, "notes_list_files_by_prefix", prefix="many/", limit=50, cursor=full["next_cursor"])
    assert len(rest["files"]) == 5 and not rest["has_more"]
    refused(session, "notes_list_files_by_prefix", limit=51)


def test_note_search_bounds_files_lines_and_line_chars(kernel):
    session = kernel.open_session()
    for i in range(11):
        ok(session, "notes_write_file", path=f"s/{i:02d}.md", content="\n".join(["hit"] * 6))
    ok(session, "notes_write_file", path="t/a.md", content="hit" + "q" * 397 + "\n" + "hit" + "q" * 398)
    result = ok(session, "notes_search_contents", query="hit", prefix="s/")
    assert result["files_matched"] == 10 and result["truncated"]
    per_file = {}
    for h in result["hits"]:
        per_file[h["path"]] = per_file.get(h["path"], 0) + 1
    assert set(per_file.values()) == {5}
    lines = ok(session, "notes_search_contents", query="hit", prefix="t/")["hits"]
    assert len(lines[0]["text"]) == 400 and lines[0]["text"].endswith("q")  # at the bound: whole
    assert lines[1]["text"] == ("hit" + "q" * 398)[:400] + "…"  # one past: clipped


def test_history_tools_page_the_raw_log(kernel):
    session = kernel.open_session()
    session.append(
        [EventSpec("user/message", {"message": Message.user(f"msg {i}").to_dict()}, append_op()) for i in range(60)]
    )
    listed = ok(session, "history_list_items")
    assert len(listed["items"]) == 20 and listed["has_more"] and listed["items"][0]["id"] == "item_0"
    assert len(ok(session, "history_list_items", limit=50)["items"]) == 50
    assert "limit: integer (1..50)" in refused(session, "history_list_items", limit=51)  # the schema's bound
    refused(session, "history_list_items", max_chars=1_001)
    found = ok(session, "history_search_contents", query="MSG 5", case_sensitive=False)
    assert [i["id"] for i in found["items"]] == ["item_5"] + [f"item_{i}" for i in range(50, 60)]
    assert ok(session, "history_search_contents", query="MSG 5")["items"] == []
    item = ok(session, "history_read_item", id="item_7", format="json")
    assert json.loads(item["content"]) == session.events[7].to_dict()
    refused(session, "history_read_item", id="item_7", max_chars=20_001)
    windows = ok(session, "history_list_windows")
    assert windows["current_window"] == 1 and windows["windows"][0]["ref"] == "win_1"


def test_new_context_answers_requested(kernel):
    session = kernel.open_session()
    outcome = call(session, "new_context", reason="phase done")
    assert not outcome.is_error and outcome.content.startswith("requested")
    again = call(session, "new_context")
    assert "already pending" in again.content


def test_new_context_names_the_history_tools_only_for_after_the_switch(handoff_kernel):
    """The history tools come with the first switch: the answer to new_context in a session that
    has hidden nothing does not tell the model they are there now."""
    session = handoff_kernel(window=20_000).open_session()
    session.user("start")
    session.prepare_request()
    session.commit_reply(Message.assistant("", [ToolCallBlock("n1", "new_context", {})]))
    answer = session.run_tool(session.pending_calls[0]).content
    assert answer.startswith("requested") and "from then on the history_* tools" in answer
    assert not any(session.owns_tool(name) for name in ("history_read_item", "history_list_items"))
