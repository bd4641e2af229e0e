"""The batch append's faster paths (store8) store what the paths they replaced stored.

* sqlite inserts a batch as multi-row INSERTs (chunks of ``INSERT_CHUNKS`` rows, the seq
  computed from the batch's first) instead of ``executemany`` of one row per event: the rows are
  the same, of the same SQL types, and a batch that meets a stray row (a corrupt table) or holds
  an event that is not JSON leaves nothing behind, as before;
* jsonl serialises a batch in three flat passes and records the line offsets with one
  ``accumulate``: the bytes are the old per-event loop's, and the offsets are what a fresh scan of
  the file finds;
* ``Event`` sets its slots through their descriptors: the same object the dataclass's generated
  frozen ``__init__`` builds, positional or by keyword.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel.errors import CorruptionError, StoreError
from ctxkernel.events import Event
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.store.rows import encode_event
from ctxkernel.store.sqlite import INSERT_CHUNKS, SqliteStore
from ctxkernel.testing.store import header

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
DATA = st.dictionaries(st.text(max_size=8), JSON, max_size=4)
#: plugin events (what a store reads back must pass the envelope check: ignorable, no surface)
TYPES = st.sampled_from(["bench/tick", "t/x", "handoff/note", "ünï/cødé"])
#: batch sizes around the chunk sizes and past the largest
SIZES = st.one_of(st.integers(1, 9), st.sampled_from([63, 64, 65, 100, 127, 128, 129, 200]))
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def drawn_batches(draw: Any, count: int) -> list[list[Event]]:
    """``count`` batches of drawn sizes; the events cycle through a few drawn types and payloads
    (drawing each event's own would make an example cost seconds)."""
    types, payloads = draw(st.lists(TYPES, min_size=1, max_size=3)), draw(st.lists(DATA, min_size=1, max_size=5))
    batches, seq = [], 0
    for _ in range(count):
        size = draw(SIZES)
        batches.append(
            [
                Event(s, types[s % len(types)], payloads[s % len(payloads)], "2026-01-01T00:00:00.000Z", None, True)
                for s in range(seq, seq + size)
            ]
        )
        seq += size
    return batches


# -- sqlite ------------------------------------------------------------------------------------------
def reference_rows(session_id: str, batches: list[list[Event]]) -> list[tuple[Any, ...]]:
    """What the one-row ``executemany`` path stored: (session, seq, type, body) per event."""
    return [(session_id, e.seq, e.type, encode_event(e), "integer", "text") for b in batches for e in b]


def stored_rows(store: SqliteStore, session_id: str) -> list[tuple[Any, ...]]:
    return store._query(
        "SELECT session, seq, type, body, typeof(seq), typeof(body) FROM events WHERE session = ? ORDER BY seq",
        (session_id,),
    )


@SETTINGS
@given(data=st.data(), count=st.integers(1, 4))
def test_sqlite_multi_row_inserts_store_the_rows_executemany_stored(tmp_path_factory, data, count):
    store = SqliteStore(tmp_path_factory.mktemp("sqlite"))
    batches = drawn_batches(data.draw, count)
    store.create(header("s"))
    for batch in batches:
        store.append("s", batch, batch[0].seq)
    assert stored_rows(store, "s") == reference_rows("s", batches)
    assert store.next_seq("s") == batches[-1][-1].seq + 1
    assert [e.to_dict() for e in store.read("s")] == [e.to_dict() for b in batches for e in b]
    store.close()


@SETTINGS
@given(data=st.data(), stray=st.integers(0, 199))
def test_sqlite_a_batch_meeting_a_stray_row_stores_nothing(tmp_path_factory, data, stray):
    store = SqliteStore(tmp_path_factory.mktemp("sqlite"))
    (batch,) = drawn_batches(data.draw, 1)
    stray %= len(batch)
    store.create(header("s"))
    # a row the bookkeeping does not know of (a damaged table): the insert meets it at `stray`
    with sqlite3.connect(store.path) as db:
        db.execute("INSERT INTO events VALUES ('s', ?, 't/x', '{}')", (stray,))
    with pytest.raises(CorruptionError, match="already holds seqs"):
        store.append("s", batch, 0)
    assert stored_rows(store, "s") == [("s", stray, "t/x", "{}", "integer", "text")]
    assert store.next_seq("s") == 0
    store.close()


def test_sqlite_an_event_that_is_not_json_stores_nothing(tmp_path):
    store = SqliteStore(tmp_path)
    store.create(header("s"))
    batch = [Event(s, "t/x", {"n": s}, "", None, True) for s in range(70)]
    batch[66] = Event(66, "t/x", {"n": {1, 2}}, "", None, True)
    with pytest.raises(StoreError, match="event 66 .* not JSON-serialisable"):
        store.append("s", batch, 0)
    assert stored_rows(store, "s") == [] and store.next_seq("s") == 0


def test_sqlite_prepares_at_most_one_statement_per_chunk_size(tmp_path):
    store = SqliteStore(tmp_path)
    store.create(header("s"))
    seq = 0
    for size in (1, 100, 3, 64, 250, 7):
        store.append("s", [Event(s, "t/x", {}, "", None, True) for s in range(seq, seq + size)], seq)
        seq += size
    from ctxkernel.store.sqlite import _insert_events_sql

    assert set(INSERT_CHUNKS) >= {1, 2, 4, 32, 64}
    assert _insert_events_sql.cache_info().currsize <= len(INSERT_CHUNKS)
    assert store.next_seq("s") == seq == len(stored_rows(store, "s"))


# -- jsonl -------------------------------------------------------------------------------------------
def reference_payload(batch: list[Event]) -> bytes:
    """The per-event loop the batch serialisation replaced."""
    lines = []
    last = len(batch) - 1
    for i, event in enumerate(batch):
        raw = event.to_dict()
        if i != last:
            raw["more"] = True
        lines.append(orjson.dumps(raw))
    return b"\n".join(lines) + b"\n"


@SETTINGS
@given(data=st.data(), count=st.integers(1, 4))
def test_jsonl_batches_are_the_bytes_and_offsets_of_the_per_event_loop(tmp_path_factory, data, count):
    home = tmp_path_factory.mktemp("jsonl")
    store = JsonlStore(home, fsync=False)
    batches = drawn_batches(data.draw, count)
    store.create(header("s"))
    for batch in batches:
        store.append("s", batch, batch[0].seq)
    path = store.path("s")
    head = path.read_bytes().split(b"\n", 1)[0] + b"\n"
    assert path.read_bytes() == head + b"".join(reference_payload(b) for b in batches)
    appended = store._index["s"]
    fresh = JsonlStore(home)
    assert fresh.next_seq("s") == appended.count
    assert (fresh._index["s"].offsets, fresh._index["s"].end) == (appended.offsets, appended.end)
    assert [e.to_dict() for e in fresh.read("s", 1)] == [e.to_dict() for b in batches for e in b][1:]


def test_jsonl_an_event_that_is_not_json_writes_nothing(tmp_path):
    store = JsonlStore(tmp_path, fsync=False)
    store.create(header("s"))
    before = store.path("s").read_bytes()
    batch = [Event(s, "t/x", {"n": s}, "", None, True) for s in range(5)]
    batch[3] = Event(3, "t/x", {"n": {1, 2}}, "", None, True)
    with pytest.raises(TypeError):  # orjson.JSONEncodeError, as before
        store.append("s", batch, 0)
    assert store.path("s").read_bytes() == before and store.next_seq("s") == 0


# -- Event ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class GeneratedEvent:
    """Event's fields with the dataclass's own generated frozen ``__init__``."""

    seq: int
    type: str
    data: dict[str, Any]
    time: str = ""
    surface: dict[str, Any] | None = None
    ignorable: bool = False


FIELDS = [f.name for f in dataclasses.fields(Event)]
ANY = st.one_of(st.integers(), st.text(max_size=5), st.none(), st.booleans(), DATA)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(ANY, min_size=3, max_size=6), by_keyword=st.integers(0, 6))
def test_event_is_what_the_generated_init_builds(values, by_keyword):
    positional, keywords = values[:by_keyword], dict(zip(FIELDS[by_keyword:], values[by_keyword:], strict=False))
    if len(positional) + len(keywords) < 3:
        return
    event, generated = Event(*positional, **keywords), GeneratedEvent(*positional, **keywords)
    assert [getattr(event, f) for f in FIELDS] == [getattr(generated, f) for f in FIELDS]
    assert repr(event) == repr(generated).replace("GeneratedEvent", "Event")
    assert dataclasses.replace(event, seq=7) == Event(7, *[getattr(event, f) for f in FIELDS[1:]])
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.seq = 1  # type: ignore[misc]


def test_event_refuses_what_the_generated_init_refuses():
    for args, kwargs in (((1,), {}), ((1, "a/b", {}, "", None, False, "extra"), {}), ((1, "a/b"), {"bogus": 1})):
        with pytest.raises(TypeError):
            GeneratedEvent(*args, **kwargs)
        with pytest.raises(TypeError):
            Event(*args, **kwargs)
