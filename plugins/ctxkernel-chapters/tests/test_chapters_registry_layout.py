"""The registry stores one key per chapter: a compaction writes only what it creates."""

from __future__ import annotations

import tempfile
from pathlib import Path

from helpers_chapters import chapters_kernel, registry, run_turns
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.store.jsonl import JsonlStore
from ctxkernel_chapters import plugin as chapters_plugin
from ctxkernel_chapters.registry import NAMESPACE, Registry, record_key
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


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=2_000_000), min_size=1, max_size=12, unique=True))
def test_records_list_in_chapter_order_and_archived_through_is_the_furthest_end(numbers):
    with tempfile.TemporaryDirectory() as home:
        reg = Registry(_StoreTable(JsonlStore(Path(home), fsync=False)))
        for n in numbers:  # written in any order, one compaction each
            reg.add_final("s1", [{"id": f"s1/{n}", "number": n, "end_seq": n * 3, "status": "final"}])
        reg.add_final("s10", [{"id": "s10/1", "number": 1, "end_seq": 10**9, "status": "final"}])  # a prefix sibling
        assert [r["number"] for r in reg.records("s1")] == sorted(numbers)
        assert reg.archived_through("s1") == max(numbers) * 3
        assert reg.state("s1")["next_chapter"] == max(numbers) + 1
