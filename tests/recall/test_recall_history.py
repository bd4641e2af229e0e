"""ctxkernel.recall.history: stable ids, windows, incremental index, paging and every limit."""

from __future__ import annotations

import json

import pytest

from ctxkernel import Message, Span, ToolCallBlock
from ctxkernel.events import append_op
from ctxkernel.recall import history as H
from ctxkernel.recall.history import History, HistoryError
from ctxkernel.session import EventSpec
from ctxkernel.testing import build_kernel


@pytest.fixture
def session(tmp_path):
    return build_kernel(tmp_path).open_session()


def users(session, texts):
    """Append user messages in one batch (one fsync), returning their seqs."""
    start = session.append(
        [EventSpec("user/message", {"message": Message.user(t).to_dict()}, append_op()) for t in texts]
    )
    return list(range(start, start + len(texts)))


def window_switch(session, keep_last=1, window_id=None):
    nodes = session.surface.nodes
    data = {"window_id": window_id} if window_id else {}
    return session.compact(
        Span(nodes[0].seq, nodes[-1 - keep_last].seq, summary="handoff"), strategy="test", kind="window", data=data
    )


def test_incremental_index_scans_only_new_events(session):
    users(session, [f"m{i}" for i in range(100)])
    history = History.for_session(session)
    assert history.scanned == 100
    again = History.for_session(session)
    assert again is history and again.scanned == 100  # unchanged: 0 more events scanned
    history.list_items()
    history.search("m5")
    assert history.scanned == 100
    users(session, ["new"])
    assert History.for_session(session).scanned == 101


def test_windows_by_switch_and_retained_tail_belongs_to_its_producer(session):
    users(session, ["a " * 50, "b " * 50, "c"])
    window_switch(session, keep_last=1, window_id="w-two")
    c_seq = 2
    users(session, ["d"])
    history = History.for_session(session)
    assert [w.number for w in history.windows] == [1, 2]
    assert history.window_of(c_seq) == 1  # c stayed on the surface but was produced in window 1
    assert history.window_of(len(session.events) - 1) == 2
    assert history.window("w-two").number == 2 and history.window("win_2").number == 2
    listed = history.list_windows()
    assert listed["windows"][0]["summary_item"] == f"item_{history.windows[0].closed_by}"
    assert listed["current_window"] == 2
    in_one = history.list_items(window=1)["items"]
    assert [i["seq"] for i in in_one if i["role"] == "user"] == [0, 1, 2]
    summary = history.read_item("win_1_summary", format="json")
    assert json.loads(summary["content"])["data"]["kind"] == "window"
    with pytest.raises(HistoryError, match="current window"):
        history.read_item("win_2_summary")
    with pytest.raises(HistoryError, match="no window"):
        history.window(3)


def test_a_window_cursor_before_the_first_window_is_refused(session):
    # c0 passes the fingerprint check but names no window: it read the last window as page one
    users(session, ["a " * 50, "b " * 50, "c"])
    window_switch(session)
    history = History.for_session(session)
    first = history.list_windows(limit=1)
    assert first["next_cursor"].startswith("c2.")
    made_up = "c0." + first["next_cursor"].split(".", 1)[1]
    with pytest.raises(HistoryError, match="not one this history returned"):
        history.list_windows(limit=1, cursor=made_up)


def test_a_failed_switch_is_not_a_window(session):
    users(session, ["a", "b"])
    session.append_one("compaction/start", {"compaction_id": "x", "strategy": "t", "kind": "window"})
    session.append_one("compaction/end", {"compaction_id": "x", "error": "failed"})
    assert len(History.for_session(session).windows) == 1


def test_tool_results_are_linked_to_their_tool_by_call_id(session):
    session.user("go")
    session.prepare_request()
    session.commit_reply(Message.assistant("", [ToolCallBlock("call-9", "grep", {"pattern": "TODO"})]))
    seq = session.tool_result("call-9", "found 3 TODOs")
    history = History.for_session(session)
    item = history.read_item(f"item_{seq}")
    assert item["tool"] == "grep" and item["call_id"] == "call-9" and item["call_item"] == f"item_{seq - 1}"
    raw = json.loads(history.read_item(f"item_{seq - 1}", format="json")["content"])
    assert raw == session.events[seq - 1].to_dict()  # the complete raw event, arguments included
    hits = history.search("TODO", role="assistant")["items"]
    assert hits and hits[0]["tools"] == ["grep"]


def test_ids_are_stable_across_switches_and_nothing_is_evicted_past_2100_events(session):
    seqs = users(session, [f"message {i}" for i in range(700)])
    before = History.for_session(session).read_item("item_5")["content"]
    window_switch(session)
    seqs += users(session, [f"message {i}" for i in range(700, 1400)])
    window_switch(session)
    seqs += users(session, [f"message {i}" for i in range(1400, 2150)])
    assert len(session.events) > 2_100
    history = History.for_session(session)
    assert history.read_item("item_5")["content"] == before == "message 5"
    found, cursor = [], None
    while True:
        page = history.list_items(role="user", limit=50, cursor=cursor)
        found += [i["seq"] for i in page["items"]]
        if not page["has_more"]:
            break
        cursor = page["next_cursor"]
    assert found == seqs
    assert history.read_item(f"item_{seqs[0]}")["content"] == "message 0"


# -- limits, each at and just past its bound ------------------------------------------------------------
def test_list_limit_default_max_and_past_max(session):
    users(session, [f"m{i}" for i in range(60)])
    history = History.for_session(session)
    assert len(history.list_items()["items"]) == H.LIST_DEFAULT == 20
    assert len(history.list_items(limit=50)["items"]) == 50
    with pytest.raises(HistoryError, match="limit must be 1..50"):
        history.list_items(limit=51)
    with pytest.raises(HistoryError, match="limit must be 1..50"):
        history.search("m", limit=51)
    assert len(history.search("m", limit=50)["items"]) == 50


def test_chars_per_item_default_max_and_past_max(session):
    users(session, ["a" * 1_001, "b" * 2_000])
    history = History.for_session(session)
    items = history.list_items()["items"]
    assert len(items[0]["preview"]) == 400 and items[0]["truncated"]
    assert len(history.list_items(max_chars=1_000)["items"][0]["preview"]) == 1_000
    with pytest.raises(HistoryError, match="max_chars per item must be 1..1000"):
        history.list_items(max_chars=1_001)
    exact = users(session, ["c" * 400])[0]
    item = history.list_items(seq_from=exact)["items"][0]
    assert item["preview"] == "c" * 400 and "truncated" not in item
    snippet = history.search("b", max_chars=1_000)["items"][0]["snippet"]
    assert len(snippet) <= 1_000


def test_preview_total_per_page(session):
    users(session, ["p" * 1_000] * 13)
    history = History.for_session(session)
    page = history.list_items(limit=50, max_chars=1_000)
    total = sum(len(i["preview"]) for i in page["items"])
    assert total <= H.PREVIEW_CHARS_PER_PAGE == 12_000
    assert len(page["items"]) == 12 and page["has_more"]
    rest = history.list_items(limit=50, max_chars=1_000, cursor=page["next_cursor"])
    assert len(rest["items"]) == 1 and not rest["has_more"]


def test_scan_events_per_page(session):
    users(session, ["filler"] * 2_000 + ["needle"])
    history = History.for_session(session)
    first = history.search("needle")
    assert first["items"] == [] and first["scanned_events"] == 2_000 and first["has_more"]
    second = history.search("needle", cursor=first["next_cursor"])
    assert [i["seq"] for i in second["items"]] == [2_000] and not second["has_more"]
    # exactly 2,000 events: one page holds them all
    small = build_kernel(session.kernel.home / "other").open_session()
    users(small, ["filler"] * 1_999 + ["needle"])
    page = History.for_session(small).search("needle")
    assert page["scanned_events"] == 2_000 and not page["has_more"] and len(page["items"]) == 1


def test_scan_chars_per_page_checks_a_large_event_in_full(session):
    users(session, ["x" * 1_000_000, "y" * 999_999, "z" * 10, "needle"])
    history = History.for_session(session)
    page = history.search("needle")
    # 1,999,999 characters do not reach the bound: the third event is scanned, then the bound is hit
    assert page["scanned_events"] == 3 and page["scanned_chars"] == 2_000_009 and page["has_more"]
    more = history.search("needle", cursor=page["next_cursor"])
    assert [i["seq"] for i in more["items"]] == [3]
    big = users(session, ["w" * 3_000_000 + "needle"])[0]
    whole = history.search("needle", seq_from=big)
    assert [i["seq"] for i in whole["items"]] == [big] and whole["scanned_chars"] == 3_000_006


def test_body_read_default_max_and_past_max(session):
    seq = users(session, ["r" * 45_000])[0]
    history = History.for_session(session)
    first = history.read_item(f"item_{seq}")
    assert len(first["content"]) == H.READ_CHARS_DEFAULT == 8_000 and first["next_offset_chars"] == 8_000
    page = history.read_item(f"item_{seq}", max_chars=20_000, offset_chars=first["next_offset_chars"])
    assert len(page["content"]) == 20_000 and page["next_offset_chars"] == 28_000
    last = history.read_item(f"item_{seq}", max_chars=20_000, offset_chars=28_000)
    assert len(last["content"]) == 17_000 and "next_offset_chars" not in last
    with pytest.raises(HistoryError, match="max_chars must be 1..20000"):
        history.read_item(f"item_{seq}", max_chars=20_001)
    with pytest.raises(HistoryError, match="past the end"):
        history.read_item(f"item_{seq}", offset_chars=45_001)


def test_search_is_case_sensitive_unless_asked(session):
    users(session, ["Deploy the Parser", "parser notes"])
    history = History.for_session(session)
    assert [i["seq"] for i in history.search("Parser")["items"]] == [0]
    assert [i["seq"] for i in history.search("Parser", case_sensitive=False)["items"]] == [0, 1]


def test_paging_keeps_filters_and_order(session):
    users(session, [f"m{i}" for i in range(30)])
    history = History.for_session(session)
    page = history.list_items(limit=10, order="desc")
    assert [i["seq"] for i in page["items"]] == list(range(29, 19, -1))
    nxt = history.list_items(limit=10, order="desc", cursor=page["next_cursor"])
    assert [i["seq"] for i in nxt["items"]] == list(range(19, 9, -1))
    with pytest.raises(HistoryError, match="same filters and order"):
        history.list_items(limit=10, cursor=page["next_cursor"])
    with pytest.raises(HistoryError, match="not one this history returned"):
        history.list_items(cursor="nonsense")


def test_goal_checklist_and_unknown_ids(session):
    session.user("the goal")
    session.prepare_request()
    todos = {"todos": [{"content": "one", "status": "completed"}, {"content": "two", "status": "pending"}]}
    session.commit_reply(Message.assistant("", [ToolCallBlock("t", "TodoWrite", todos)]))
    session.tool_result("t", "ok")
    history = History.for_session(session)
    assert history.read_item("goal")["content"] == "the goal"
    checklist = history.read_item("checklist")["content"]
    assert "[completed] todo_" in checklist and "[pending] todo_" in checklist
    assert [t.open for t in history.checklist()] == [False, True]
    with pytest.raises(HistoryError, match="unknown id"):
        history.read_item("note_1")
    with pytest.raises(HistoryError, match="no item_999"):
        history.read_item("item_999")


def test_native_summary_checkpoints_show_as_windows(session):
    """Issue #15: a basic checkpoint replaces the surface head like a window switch, so
    history_list_windows lists it (opened_as "checkpoint"), next to switches ("switch")."""
    for i in range(6):
        session.user(f"task {i}: " + "read the code " * 40)
        session.prepare_request()
        session.commit_reply(Message.assistant("done " * 40))
        session.end_turn()
    nodes = session.surface.nodes
    session.compact(Span(nodes[0].seq, nodes[5].seq), strategy="basic", kind="summary")
    window_switch(session)
    listed = History.for_session(session).list_windows()["windows"]
    assert [(w["window"], w["strategy"], w["opened_as"]) for w in listed] == [
        (1, None, None),
        (2, "basic", "checkpoint"),
        (3, "test", "switch"),
    ]
    summary = next(e for e in session.events if e.type == "compaction/summary")
    assert listed[0]["summary_item"] == f"item_{summary.seq}" and listed[1]["opened_by"] == f"item_{summary.seq}"
