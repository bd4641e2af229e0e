"""The registry stores one key per chapter: a compaction writes only what it creates."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from helpers_chapters import call_tool, chapters_kernel, registry, run_turns
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.store.jsonl import JsonlStore
from ctxkernel_chapters import plugin as chapters_plugin
from ctxkernel_chapters.registry import NAMESPACE, Registry, record_key
from ctxkernel_chapters.storage import ArchiveError
from ctxkernel_chapters.strategy import own_records


class _StoreTable:
    """A store's ``chapters`` namespace, as the strategy handle gives it (no session needed)."""

    def __init__(self, store):
        self.store = store

    def kv_get(self, key):
        return self.store.kv_get(NAMESPACE, key)

    def kv_put(self, key, value):
        self.store.kv_put(NAMESPACE, key, value)

    def kv_list(self, prefix=""):
        return self.store.kv_list(NAMESPACE, prefix)


def _session(tmp_path):
    kernel = chapters_kernel(tmp_path, window=6_000, reserve=1_000, auto=False)
    return kernel.open_session()


def _record_puts(session, monkeypatch):
    """Keys written to the chapters namespace from now on, each with its value."""
    puts: list[tuple[str, object]] = []
    real = session.store.kv_put

    def spy(namespace, key, value):
        if namespace == NAMESPACE:
            puts.append((key, value))
        return real(namespace, key, value)

    monkeypatch.setattr(session.store, "kv_put", spy)
    return puts


def test_each_chapter_has_its_own_key_and_the_session_state_holds_none(tmp_path):
    session = _session(tmp_path)
    model = run_turns(session, 6)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    run_turns(session, 6, start=6, model=model)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    records = registry(session).records(session.id)
    assert len(records) >= 2
    state = session.store.kv_get(NAMESPACE, f"sessions/{session.id}")
    assert "chapters" not in state
    assert state["archived_through"] == max(r["end_seq"] for r in records)
    for record in records:
        assert session.store.kv_get(NAMESPACE, record_key(session.id, record["number"])) == record


def test_a_compaction_writes_each_new_record_once_and_no_earlier_one(tmp_path, monkeypatch):
    session = _session(tmp_path)
    model = run_turns(session, 6)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    earlier = {record_key(session.id, r["number"]) for r in registry(session).records(session.id)}
    run_turns(session, 6, start=6, model=model)
    puts = _record_puts(session, monkeypatch)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    assert puts == []  # the compaction's one durable write is its commit in the log
    new = {record_key(session.id, r["number"]) for r in registry(session).records(session.id)} - earlier
    record_keys = [key for key, _ in puts if key.startswith("records/")]  # written by the settle
    assert new and sorted(record_keys) == sorted(new)  # one write per new record
    assert not earlier & set(record_keys)
    # the session state stays small: it carries no chapter records
    assert all("chapters" not in value for key, value in puts if key.startswith("sessions/"))
    assert all(value["status"] == "final" for key, value in puts if key.startswith("records/"))


def test_a_compaction_lists_the_records_only_when_they_changed(tmp_path, monkeypatch):
    session = _session(tmp_path)
    model = run_turns(session, 6)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    run_turns(session, 4, start=6, model=model)  # its steps settle the first compaction
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")  # lists them once
    first = registry(session).records(session.id)
    run_turns(session, 4, start=10, model=model)
    listed = []
    real = session.store.kv_list
    monkeypatch.setattr(session.store, "kv_list", lambda ns, prefix="": listed.append(prefix) or real(ns, prefix))
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    assert listed == []  # the records it cites were read when they last changed
    monkeypatch.undo()
    records = registry(session).records(session.id)
    assert records[: len(first)] == first and len(records) > len(first)
    assert own_records(session.context) == records  # the cache the settle extended is the listing
    head = session.surface.nodes[0].message.text
    assert all(r["path"] in head for r in records)


def test_an_old_single_record_layout_is_split_on_first_read(tmp_path):
    session = _session(tmp_path)
    run_turns(session, 6)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    reg = registry(session)
    records = reg.records(session.id)
    state = reg.state(session.id)
    legacy = {k: v for k, v in state.items() if k != "archived_through"} | {"chapters": records}
    for record in records:
        session.store.kv_delete(NAMESPACE, record_key(session.id, record["number"]))
    session.store.kv_put(NAMESPACE, f"sessions/{session.id}", legacy)
    assert reg.get(session.id)["chapters"] == records
    assert reg.archived_through(session.id) == max(r["end_seq"] for r in records)
    assert "chapters" not in session.store.kv_get(NAMESPACE, f"sessions/{session.id}")


def _record(session_id, number, end_seq):
    return {
        "id": f"{session_id}/{number}",
        "number": number,
        "path": f"{session_id}/chapters/{number:03d}.md",
        "start_seq": end_seq,
        "end_seq": end_seq,
        "sha256": "0" * 64,
        "tokens": 1,
        "status": "final",
    }


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=2_000_000), min_size=1, max_size=12, unique=True))
def test_records_list_in_chapter_order_and_archived_through_is_the_furthest_end(numbers):
    with tempfile.TemporaryDirectory() as home:
        reg = Registry(_StoreTable(JsonlStore(Path(home), fsync=False)))
        for n in numbers:  # written in any order, one compaction each
            reg.add_final("s1", [_record("s1", n, n * 3)])
        reg.add_final("s10", [_record("s10", 1, 10**9)])  # a prefix sibling
        assert [r["number"] for r in reg.records("s1")] == sorted(numbers)
        assert reg.archived_through("s1") == max(numbers) * 3
        assert reg.state("s1")["next_chapter"] == max(numbers) + 1


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        (
            "sessions/s1",
            {"root": "s1", "parent": None, "next_chapter": "2"},
            "'next_chapter' = '2'; accepted: an integer",
        ),
        ("sessions/s1", {"parent": None}, "has no 'root'"),
        ("sessions/s1", ["s1"], "is list, not an object"),
        ("sessions/s1", {"root": "s1", "parent": 7}, "'parent' = 7; accepted: a string or null"),
        (
            "sessions/s1",
            {"root": "s1", "parent": "s0", "parent_archived_through": "9"},
            "'parent_archived_through' = '9'; accepted: an integer",
        ),
        ("records/s1/000001", {**_record("s1", 1, 3), "number": "1"}, "'number' = '1'; accepted: an integer"),
        ("records/s1/000001", {k: v for k, v in _record("s1", 1, 3).items() if k != "end_seq"}, "has no 'end_seq'"),
        ("records/s1/000001", {**_record("s1", 1, 3), "tokens": True}, "'tokens' = True"),
        ("roots/s1", {"next_chapter": None}, "'next_chapter' = None; accepted: an integer"),
        ("roots/s1", 5, "is int, not an object"),
    ],
)
def test_a_registry_entry_of_another_shape_is_an_archive_error_naming_it(tmp_path, key, value, problem):
    # state["next_chapter"], r["number"], record["end_seq"] were read as they were: a KeyError or
    # TypeError inside a tool or a step, or a wrong number compared and written back
    store = JsonlStore(tmp_path, fsync=False)
    reg = Registry(_StoreTable(store))
    reg.add_final("s1", [_record("s1", 1, 3)])
    reg.allocate("s1", 1)
    store.kv_put(NAMESPACE, key, value)
    before = store.kv_list(NAMESPACE)
    calls = {
        "sessions/": (
            lambda: reg.state("s1"),
            lambda: reg.add_final("s1", [_record("s1", 2, 5)]),
            lambda: reg.get("s1"),
        ),
        "records/": (lambda: reg.records("s1"), lambda: reg.find("s1", "s1/1"), lambda: reg.lineage_records("s1")),
        "roots/": (lambda: reg.next_number("s1"), lambda: reg.allocate("s1", 2), lambda: reg.advance("s1", 9)),
    }[key[: key.index("/") + 1]]
    for call in calls:
        with pytest.raises(ArchiveError, match=rf"{key!r} .*{re.escape(problem)}.*is not used"):
            call()
    assert store.kv_list(NAMESPACE) == before


def test_a_chapters_tool_answers_a_damaged_registry_entry_with_a_tool_error(tmp_path):
    session = _session(tmp_path)
    run_turns(session, 6)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    reg = registry(session)
    record = reg.records(session.id)[0]
    key = record_key(session.id, record["number"])
    session.store.kv_put(NAMESPACE, key, {k: v for k, v in record.items() if k != "path"})
    outcome = call_tool(session, "chapters_read", chapter=record["id"])
    assert outcome.is_error and "chapters_read refused" in outcome.content and "has no 'path'" in outcome.content
    session.store.kv_put(NAMESPACE, key, record)
    state_key = f"sessions/{session.id}"
    session.store.kv_put(NAMESPACE, state_key, {**reg.state(session.id), "next_chapter": "9"})
    before = session.store.kv_list(NAMESPACE), session.store.list_sessions(), session.next_seq
    ends = [e.seq for e in session.events if e.type == "turn/end"]
    outcome = call_tool(
        session,
        "chapters_continue",
        title="next",
        handoff_note="go on",
        chapters=[{"start_seq": 0, "end_seq": ends[-1], "title": "all"}],
    )
    assert outcome.is_error and "chapters_continue refused" in outcome.content, outcome.content
    assert "'next_chapter' = '9'" in outcome.content
    assert (session.store.kv_list(NAMESPACE), session.store.list_sessions(), session.next_seq) == before
