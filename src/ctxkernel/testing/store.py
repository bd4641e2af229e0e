"""The store conformance suite, for ctxkernel's backends and for anyone writing another one.

Subclass :class:`StoreConformance` in a test module and give it a ``store_factory`` fixture that
returns a *callable*: each call opens a new store object on the same backing storage (the same
home, database or schema), as a second process would::

    import pytest
    from ctxkernel.testing.store import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def store_factory(self, tmp_path):
            return lambda: MyStore(tmp_path)

Every test then runs unchanged against that backend: create, append with the expected next seq,
a stale writer's :class:`ConflictError` with nothing written, reads by range (bounded by an end
too), session listing, the key-value table, leases (exclusive, taken over after expiry or by
token), 1 MB events, any Unicode, a 100,000-event session, racing writers, ``repair()`` and the
blob table (put/get/stat/list/delete, chunked values,
refused keys and sizes, readers that never see part of a write).

PostgreSQL helpers: :func:`postgres_dsn` returns ``$CTXKERNEL_TEST_PG_DSN`` when a server answers
there, and otherwise skips the test with the reason, or fails it when ``CI`` is true (CI must run
these tests). :func:`postgres_schema` gives a test its own schema, dropped afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..errors import ConflictError, SessionExistsError, SessionNotFoundError, StoreError
from ..events import Event
from ..store.base import (
    BLOB_CHUNK_BYTES,
    MAX_BLOB_BYTES,
    MAX_BLOB_KEY,
    BlobInfo,
    EventStore,
    SessionHeader,
    deferred_sync,
)

PG_DSN_ENV = "CTXKERNEL_TEST_PG_DSN"

#: any Unicode scalar value (surrogates are not characters and cannot be encoded as UTF-8)
unicode_text = st.text(st.characters(codec="utf-8"), max_size=200)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | unicode_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(unicode_text, inner, max_size=4),
    max_leaves=12,
)

HARD_UNICODE = '\x00 nul · é · 日本語 · עברית · 👩‍👩‍👧 · e\u0301 · \ufeff · \uffff · \U0010ffff · \u2028\u2029 · "\\'


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def postgres_dsn() -> str:
    """The test server's connection string; skips (locally) or fails (under CI) without one."""
    dsn = os.environ.get(PG_DSN_ENV)
    problem = None
    if not dsn:
        problem = f"{PG_DSN_ENV} is not set (run the tests through scripts/test-services.sh, as `make test` does)"
    else:
        try:
            import psycopg

            psycopg.connect(dsn, connect_timeout=5).close()
        except ImportError:
            problem = "psycopg is not installed (pip install 'ctxkernel[postgres]')"
        except Exception as exc:  # any failure to reach the server is the reason
            problem = f"no PostgreSQL server answers at {PG_DSN_ENV}: {str(exc).strip()}"
    if problem:
        if in_ci():
            pytest.fail(f"PostgreSQL tests must run under CI=true, but {problem}", pytrace=False)
        pytest.skip(problem)
    return dsn  # type: ignore[return-value]


@contextlib.contextmanager
def postgres_schema(dsn: str) -> Iterator[str]:
    """A connection string whose tables live in a fresh schema, dropped on exit."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    schema = f"ctxtest_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield make_conninfo(dsn, options=f"-csearch_path={schema}")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def event(seq: int, data: dict[str, Any] | None = None, kind: str = "test/note") -> Event:
    """An ignorable plugin event: valid in any log, with any data."""
    return Event(seq, kind, data if data is not None else {"n": seq}, "2026-01-01T00:00:00.000Z", None, True)


def batch(start: int, count: int, **data: Any) -> list[Event]:
    return [event(start + i, {"n": start + i, **data}) for i in range(count)]


def header(session_id: str, **extra: Any) -> SessionHeader:
    return SessionHeader(id=session_id, created="2026-01-01T00:00:00.000Z", **extra)


def holder(name: str) -> dict[str, Any]:
    """A lease holder as the kernel writes one (host, pid, start, token)."""
    return {"host": f"host-{name}", "pid": 1000, "started": "2026-01-01T00:00:00Z", "token": f"token-{name}"}


def dump(store: EventStore, session_id: str, start: int = 0) -> list[dict[str, Any]]:
    return [e.to_dict() for e in store.read(session_id, start)]


class StoreConformance:
    """The contract every :class:`EventStore` keeps. Provide ``store_factory`` (see module doc)."""

    #: events in the long-session test; a backend's own suite may not lower it
    LONG_SESSION_EVENTS = 100_000

    @pytest.fixture
    def store_factory(self) -> Callable[[], EventStore]:
        msg = "subclasses of StoreConformance must define a store_factory fixture"
        raise NotImplementedError(msg)

    @pytest.fixture
    def store(self, store_factory: Callable[[], EventStore]) -> Iterator[EventStore]:
        store = store_factory()
        yield store
        store.close()

    @pytest.fixture
    def other(self, store_factory: Callable[[], EventStore]) -> Iterator[EventStore]:
        """A second store object on the same storage: another process's view."""
        store = store_factory()
        yield store
        store.close()

    # -- sessions --------------------------------------------------------------------------------
    def test_implements_the_protocol(self, store: EventStore) -> None:
        assert isinstance(store, EventStore)
        assert store.backend in ("jsonl", "sqlite", "postgres") or isinstance(store.backend, str)

    def test_create_round_trips_the_header(self, store: EventStore, other: EventStore) -> None:
        made = header("s1", parent="s0", origin="test", profile="basic", extra={"k": ["v", 1]})
        assert not store.exists("s1")
        store.create(made)
        assert store.exists("s1") and other.exists("s1")
        assert other.header("s1") == made
        assert store.next_seq("s1") == 0
        assert list(store.read("s1")) == []

    def test_create_refuses_a_taken_id_and_keeps_the_first(self, store: EventStore, other: EventStore) -> None:
        store.create(header("s1", origin="first"))
        store.append("s1", batch(0, 2), 0)
        with pytest.raises(SessionExistsError):
            other.create(header("s1", origin="second"))
        assert store.header("s1").origin == "first"
        assert store.next_seq("s1") == 2

    @pytest.mark.parametrize("bad", ["", "../escape", "a/b", "a b", "-lead", "x" * 129, "a..b"])
    def test_invalid_session_ids_are_refused(self, store: EventStore, bad: str) -> None:
        with pytest.raises(StoreError):
            store.create(header(bad))
        assert store.list_sessions() == []

    def test_missing_session_is_reported(self, store: EventStore) -> None:
        assert not store.exists("nope")
        for call in (
            lambda: store.header("nope"),
            lambda: store.next_seq("nope"),
            lambda: list(store.read("nope")),
            lambda: store.append("nope", batch(0, 1), 0),
            lambda: store.repair("nope"),
        ):
            with pytest.raises(SessionNotFoundError):
                call()
        assert not store.exists("nope")

    def test_list_sessions_is_sorted_and_shared(self, store: EventStore, other: EventStore) -> None:
        ids = ["b", "a", "C", "a-2", "a.1", "z_9"]
        for session_id in ids:
            store.create(header(session_id))
        assert store.list_sessions() == sorted(ids)
        assert other.list_sessions() == sorted(ids)

    # -- appends ---------------------------------------------------------------------------------
    def test_append_with_expected_next_seq(self, store: EventStore, other: EventStore) -> None:
        store.create(header("s"))
        store.append("s", batch(0, 3), 0)
        store.append("s", batch(3, 1), 3)
        assert store.next_seq("s") == 4 and other.next_seq("s") == 4
        assert [e.seq for e in other.read("s")] == [0, 1, 2, 3]
        assert dump(other, "s") == [e.to_dict() for e in batch(0, 3) + batch(3, 1)]

    def test_stale_writer_conflicts_and_writes_nothing(self, store: EventStore, other: EventStore) -> None:
        store.create(header("s"))
        store.append("s", batch(0, 2), 0)
        assert other.next_seq("s") == 2  # the other writer looked ...
        store.append("s", batch(2, 1, by="first"), 2)  # ... and then someone else appended
        before = dump(store, "s")
        with pytest.raises(ConflictError) as info:
            other.append("s", batch(2, 3, by="stale"), 2)
        assert (info.value.session_id, info.value.expected_seq, info.value.actual_seq) == ("s", 2, 3)
        assert isinstance(info.value, StoreError)
        assert dump(store, "s") == before and dump(other, "s") == before
        assert store.next_seq("s") == other.next_seq("s") == 3

    def test_writer_ahead_of_the_log_conflicts(self, store: EventStore) -> None:
        store.create(header("s"))
        store.append("s", batch(0, 1), 0)
        with pytest.raises(ConflictError):
            store.append("s", batch(5, 1), 5)  # would leave a gap
        assert store.next_seq("s") == 1

    def test_malformed_batches_are_refused_before_writing(self, store: EventStore) -> None:
        store.create(header("s"))
        store.append("s", batch(0, 1), 0)
        with pytest.raises(StoreError):
            store.append("s", [], 1)
        with pytest.raises(StoreError):
            store.append("s", [event(1), event(3)], 1)  # seqs must run on
        with pytest.raises((StoreError, TypeError)):
            store.append("s", [event(1), event(2, {"bad": object()})], 1)  # not JSON: nothing written
        assert store.next_seq("s") == 1
        assert dump(store, "s") == [batch(0, 1)[0].to_dict()]
        store.append("s", batch(1, 1), 1)  # and the log is still usable
        assert store.next_seq("s") == 2

    def test_a_deferred_sync_append_is_an_append(self, store: EventStore, other: EventStore) -> None:
        """An append inside ``deferred_sync`` (the kernel's compaction lock) only skips waiting
        for the disk: it is checked, ordered and visible like any other, and the next durable
        append follows it (a store without the method appends durably)."""
        store.create(header("s"))
        with deferred_sync(store):
            store.append("s", batch(0, 2, lock=True), 0)
            assert other.next_seq("s") == 2
            with pytest.raises(ConflictError):
                store.append("s", batch(0, 1), 0)
        store.append("s", batch(2, 1, commit=True), 2)
        assert dump(other, "s") == [e.to_dict() for e in batch(0, 2, lock=True) + batch(2, 1, commit=True)]

    def test_racing_writers_leave_no_gap_or_duplicate(self, store_factory: Callable[[], EventStore]) -> None:
        first = store_factory()
        first.create(header("race"))
        acked: dict[str, list[int]] = {}
        errors: list[BaseException] = []

        def writer(name: str) -> None:
            store = store_factory()
            mine = acked.setdefault(name, [])
            try:
                while len(mine) < 40:
                    seq = store.next_seq("race")
                    try:
                        store.append("race", [event(seq, {"writer": name}), event(seq + 1, {"writer": name})], seq)
                    except ConflictError:
                        continue
                    mine.append(seq)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                store.close()

        threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        events = list(first.read("race"))
        assert [e.seq for e in events] == list(range(240))
        for name, seqs in acked.items():
            for seq in seqs:  # each acknowledged batch is in the log, whole, under its writer
                assert events[seq].data["writer"] == events[seq + 1].data["writer"] == name
        first.close()

    # -- reads -----------------------------------------------------------------------------------
    def test_reads_by_range(self, store: EventStore) -> None:
        store.create(header("s"))
        store.append("s", batch(0, 10), 0)
        store.append("s", batch(10, 5), 10)
        everything = dump(store, "s")
        assert [e["seq"] for e in everything] == list(range(15))
        for start in (0, 1, 9, 10, 11, 14):
            assert dump(store, "s", start) == everything[start:]
        assert dump(store, "s", 15) == []
        assert dump(store, "s", 1000) == []

    def test_bounded_reads(self, store: EventStore, other: EventStore) -> None:
        store.create(header("s"))
        store.append("s", batch(0, 10), 0)
        store.append("s", batch(10, 5), 10)
        everything = dump(store, "s")
        for start, end in ((0, 1), (0, 10), (3, 7), (9, 11), (10, 15), (14, 15), (0, 15)):
            assert [e.to_dict() for e in store.read("s", start, end)] == everything[start:end]
            assert [e.to_dict() for e in other.read("s", start, end)] == everything[start:end]
        # an end past the log stops at the log; an empty or reversed range reads nothing
        assert [e.seq for e in store.read("s", 12, 1000)] == [12, 13, 14]
        assert list(store.read("s", 5, 5)) == [] and list(store.read("s", 7, 3)) == []
        assert list(store.read("s", 15, 20)) == []
        # a bounded read never yields an event appended after it was asked for past its end
        reader = store.read("s", 13, 16)
        other.append("s", batch(15, 3), 15)
        assert [e.seq for e in reader] in ([13, 14], [13, 14, 15])
        assert [e.seq for e in store.read("s", 14, 17)] == [14, 15, 16]

    def test_read_is_a_snapshot_of_whole_batches(self, store: EventStore, other: EventStore) -> None:
        store.create(header("s"))
        store.append("s", batch(0, 3), 0)
        reader = store.read("s")
        first = next(reader)
        other.append("s", batch(3, 3), 3)
        rest = list(reader)
        assert [first.seq, *[e.seq for e in rest]] in ([0, 1, 2], [0, 1, 2, 3, 4, 5])

    def test_kernel_events_round_trip(self, store: EventStore) -> None:
        store.create(header("s"))
        events = [
            Event(0, "turn/start", {"turn": 1}, "2026-01-01T00:00:00.000Z"),
            Event(
                1,
                "user/message",
                {"message": {"role": "user", "content": [{"type": "text", "text": "hi"}]}},
                "2026-01-01T00:00:00.001Z",
                {"op": "append"},
            ),
            Event(2, "turn/end", {"turn": 1, "reason": "completed"}, "2026-01-01T00:00:00.002Z"),
        ]
        store.append("s", events, 0)
        assert list(store.read("s")) == events

    def test_one_megabyte_events(self, store: EventStore, other: EventStore) -> None:
        store.create(header("big"))
        big_ascii = "x" * (1 << 20)
        big_wide = "日本語🙂" * (1 << 18)  # over 3 MB of UTF-8
        store.append("big", [event(0, {"text": big_ascii}), event(1, {"text": big_wide})], 0)
        store.append("big", [event(2, {"after": True})], 2)
        got = list(other.read("big"))
        assert got[0].data["text"] == big_ascii and got[1].data["text"] == big_wide
        assert got[2].data == {"after": True}

    def test_hard_unicode_round_trips(self, store: EventStore, other: EventStore) -> None:
        store.create(header("u", extra={"note": HARD_UNICODE}))
        data = {"text": HARD_UNICODE, HARD_UNICODE: [HARD_UNICODE]}
        store.append("u", [event(0, data)], 0)
        assert list(other.read("u"))[0].data == data
        assert other.header("u").extra == {"note": HARD_UNICODE}
        store.kv_put("ns", "k", {"v": HARD_UNICODE})
        assert other.kv_get("ns", "k") == {"v": HARD_UNICODE}

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
            HealthCheck.too_slow,
        ],
    )
    @given(payload=st.dictionaries(unicode_text, json_values, max_size=5), text=unicode_text)
    def test_any_unicode_and_json_round_trips(self, store: EventStore, payload: dict[str, Any], text: str) -> None:
        session_id = f"h{uuid.uuid4().hex}"
        store.create(header(session_id, origin=text))
        store.append(session_id, [event(0, payload), event(1, {"t": text})], 0)
        got = list(store.read(session_id))
        assert got[0].data == payload and got[1].data == {"t": text}
        assert store.header(session_id).origin == text
        store.kv_put("prop", session_id, payload)
        assert store.kv_get("prop", session_id) == payload

    def test_long_session(self, store: EventStore, other: EventStore) -> None:
        total = self.LONG_SESSION_EVENTS
        step = 1000
        store.create(header("long"))
        for start in range(0, total, step):
            store.append("long", [event(s, {"n": s, "pad": "y" * 64}) for s in range(start, start + step)], start)
        assert other.next_seq("long") == total
        seen = 0
        for expected, got in enumerate(other.read("long")):
            assert got.seq == expected and got.data["n"] == expected
            seen += 1
        assert seen == total
        assert [e.seq for e in other.read("long", total - 3)] == [total - 3, total - 2, total - 1]
        other.append("long", [event(total)], total)
        assert store.next_seq("long") == total + 1

    # -- key-value table ---------------------------------------------------------------------------
    def test_key_value_table(self, store: EventStore, other: EventStore) -> None:
        assert store.kv_get("lineage", "a") is None
        assert store.kv_list("lineage") == {}
        store.kv_put("lineage", "a", {"parent": None, "chapters": [1, 2]})
        store.kv_put("lineage", "a/b", [1, "two", 3.5, True, None])
        store.kv_put("lineage", "b", "text")
        store.kv_put("notes", "a", 42)
        assert other.kv_get("lineage", "a") == {"parent": None, "chapters": [1, 2]}
        assert other.kv_list("lineage") == {
            "a": {"parent": None, "chapters": [1, 2]},
            "a/b": [1, "two", 3.5, True, None],
            "b": "text",
        }
        assert list(other.kv_list("lineage")) == ["a", "a/b", "b"]
        assert other.kv_list("lineage", "a") == {
            "a": {"parent": None, "chapters": [1, 2]},
            "a/b": [1, "two", 3.5, True, None],
        }
        assert other.kv_list("lineage", "a/") == {"a/b": [1, "two", 3.5, True, None]}
        assert other.kv_list("notes") == {"a": 42}
        other.kv_put("lineage", "a", {"replaced": True})
        assert store.kv_get("lineage", "a") == {"replaced": True}
        store.kv_delete("lineage", "a")
        store.kv_delete("lineage", "never-there")
        assert other.kv_get("lineage", "a") is None
        assert set(other.kv_list("lineage")) == {"a/b", "b"}

    def test_key_value_names_at_their_bounds(self, store: EventStore, other: EventStore) -> None:
        # every name check_kv_name accepts is stored, whatever it makes of a file name
        longest, slashed = "n" * 256, "a/" * 127 + "z"
        for namespace, key in ((longest, "k"), ("ns", longest), ("ns", slashed), ("ns", "fa"), ("ns", "fa/b")):
            store.kv_put(namespace, key, {"key": key})
            assert other.kv_get(namespace, key) == {"key": key}
        assert other.kv_list(longest) == {"k": {"key": "k"}}
        assert list(other.kv_list("ns")) == sorted(["fa", "fa/b", longest, slashed])
        assert other.kv_list("ns", "a/") == {slashed: {"key": slashed}}
        store.kv_delete("ns", longest)
        assert other.kv_get("ns", longest) is None and longest not in other.kv_list("ns")

    def test_key_value_refuses_bad_names_and_values(self, store: EventStore) -> None:
        for namespace, key in (("", "k"), ("ns", ""), ("ns", "../k"), ("n s", "k"), ("ns", "a/../b")):
            with pytest.raises(StoreError):
                store.kv_put(namespace, key, 1)
        with pytest.raises(StoreError):
            store.kv_put("ns", "k", {"bad": object()})
        assert store.kv_get("ns", "k") is None

    # -- leases --------------------------------------------------------------------------------------
    def test_lease_is_exclusive_until_released(self, store: EventStore, other: EventStore) -> None:
        a, b = holder("a"), holder("b")
        taken = store.lease_acquire("compaction/s", a, 30)
        assert taken.acquired and taken.holder == a and taken.previous is None
        refused = other.lease_acquire("compaction/s", b, 30)
        assert not refused.acquired and refused.holder == a and 0 < refused.remaining <= 30
        assert other.lease_acquire("compaction/s", a, 30).acquired  # a retried call by the holder
        assert other.lease_renew("compaction/s", a["token"], 30)
        assert not store.lease_renew("compaction/s", b["token"], 30)
        other.lease_release("compaction/s", b["token"])  # not b's: a no-op
        assert not store.lease_acquire("compaction/s", b, 30).acquired
        store.lease_release("compaction/s", a["token"])
        after = other.lease_acquire("compaction/s", b, 30)
        assert after.acquired and after.previous is None  # released, so nobody lost it
        assert store.lease_acquire("compaction/other", a, 30).acquired  # leases are per name

    def test_an_expired_lease_is_taken_over_naming_who_lost_it(self, store: EventStore, other: EventStore) -> None:
        a, b = holder("a"), holder("b")
        assert store.lease_acquire("compaction/s", a, 0.3).acquired
        assert not other.lease_acquire("compaction/s", b, 30).acquired
        time.sleep(0.5)
        taken = other.lease_acquire("compaction/s", b, 30)
        assert taken.acquired and taken.holder == b and taken.previous == a
        assert not store.lease_renew("compaction/s", a["token"], 30)  # the old holder finds out
        store.lease_release("compaction/s", a["token"])  # and its release takes nothing from b
        assert not store.lease_acquire("compaction/s", holder("c"), 30).acquired

    def test_a_lease_is_replaced_only_for_the_token_named(self, store: EventStore, other: EventStore) -> None:
        a, b = holder("a"), holder("b")
        store.lease_acquire("compaction/s", a, 30)
        assert not other.lease_acquire("compaction/s", b, 30, replace="someone-else").acquired
        taken = other.lease_acquire("compaction/s", b, 30, replace=a["token"])
        assert taken.acquired and taken.previous == a

    def test_lease_requests_are_checked(self, store: EventStore) -> None:
        for name, who, seconds in (
            ("../x", holder("a"), 1),
            ("ok", {"host": "h"}, 1),
            ("ok", {"token": ""}, 1),
            ("ok", holder("a"), 0),
            ("ok", holder("a"), -1),
            ("ok", holder("a"), float("nan")),
        ):
            with pytest.raises(StoreError):
                store.lease_acquire(name, who, seconds)

    # -- repair and lifecycle --------------------------------------------------------------------------
    def test_repair_of_a_clean_log_changes_nothing(self, store: EventStore) -> None:
        store.create(header("s"))
        assert not store.repair("s").repaired
        store.append("s", batch(0, 4), 0)
        before = dump(store, "s")
        report = store.repair("s")
        assert not report.repaired and report.dropped_events == 0 and report.truncated_bytes == 0
        assert dump(store, "s") == before
        store.append("s", batch(4, 1), 4)
        assert store.next_seq("s") == 5

    def test_reopen_after_close(self, store_factory: Callable[[], EventStore]) -> None:
        store = store_factory()
        store.create(header("s"))
        store.append("s", batch(0, 2), 0)
        store.kv_put("ns", "k", "v")
        store.close()
        again = store_factory()
        assert dump(again, "s") == [e.to_dict() for e in batch(0, 2)]
        assert again.kv_get("ns", "k") == "v"
        again.close()

    # -- blobs -----------------------------------------------------------------------------------------
    def test_blob_round_trip(self, store: EventStore, other: EventStore) -> None:
        assert store.blob_get("chapters/r/chapters/001-a.md") is None
        assert store.blob_stat("chapters/r/chapters/001-a.md") is None
        assert store.blob_list() == []
        info = store.blob_put("chapters/r/chapters/001-a.md", "# A\n\nbody é".encode())
        assert info == BlobInfo.of("chapters/r/chapters/001-a.md", "# A\n\nbody é".encode())
        assert other.blob_get("chapters/r/chapters/001-a.md") == "# A\n\nbody é".encode()
        assert other.blob_stat("chapters/r/chapters/001-a.md") == info
        store.blob_put("empty", b"")
        assert other.blob_get("empty") == b"" and other.blob_stat("empty") == BlobInfo.of("empty", b"")
        store.blob_delete("empty")
        store.blob_delete("never-there")
        assert other.blob_get("empty") is None and other.blob_stat("empty") is None

    def test_blob_overwrite_replaces_the_whole_value(self, store: EventStore, other: EventStore) -> None:
        big = bytes(range(256)) * (BLOB_CHUNK_BYTES // 128 + 3)  # over two chunks
        store.blob_put("k", big)
        assert other.blob_get("k") == big
        store.blob_put("k", b"small")
        assert other.blob_get("k") == b"small"
        assert other.blob_stat("k") == BlobInfo.of("k", b"small")
        assert [i.key for i in other.blob_list()] == ["k"]

    def test_blob_chunk_boundaries(self, store: EventStore, other: EventStore) -> None:
        for size in (1, BLOB_CHUNK_BYTES - 1, BLOB_CHUNK_BYTES, BLOB_CHUNK_BYTES + 1, 3 * BLOB_CHUNK_BYTES + 7):
            data = os.urandom(size)
            store.blob_put(f"sizes/{size}", data)
            got = other.blob_get(f"sizes/{size}")
            assert got is not None and len(got) == size and got == data
            assert other.blob_stat(f"sizes/{size}") == BlobInfo(f"sizes/{size}", size, hashlib.sha256(data).hexdigest())

    def test_blob_list_by_prefix(self, store: EventStore, other: EventStore) -> None:
        keys = ["b/x", "a/2", "a/1", "ab", "a/sub/deep.md", "A"]
        for key in keys:
            store.blob_put(key, key.encode())
        assert [i.key for i in other.blob_list()] == sorted(keys)
        assert [i.key for i in other.blob_list("a/")] == ["a/1", "a/2", "a/sub/deep.md"]
        assert [i.key for i in other.blob_list("a")] == ["a/1", "a/2", "a/sub/deep.md", "ab"]
        assert [i.key for i in other.blob_list("a/sub/")] == ["a/sub/deep.md"]
        assert other.blob_list("zz/") == []
        assert {i.key: i for i in other.blob_list()}["ab"] == BlobInfo.of("ab", b"ab")

    @pytest.mark.parametrize(
        "bad",
        [
            "",
            "/abs",
            "../x",
            "a/../b",
            "a/..",
            "a//b",
            "a/",
            ".hidden",
            "a/.tmp",
            "a b",
            "a\\b",
            "a\x00b",
            "é",
            "x" * (MAX_BLOB_KEY + 1),
        ],
    )
    def test_blob_keys_are_checked(self, store: EventStore, bad: str) -> None:
        for call in (
            lambda: store.blob_put(bad, b"x"),
            lambda: store.blob_get(bad),
            lambda: store.blob_stat(bad),
            lambda: store.blob_delete(bad),
        ):
            with pytest.raises(StoreError, match="letters, digits"):
                call()
        assert store.blob_list() == []

    def test_blob_size_is_bounded(self, store: EventStore) -> None:
        store.blob_put("k", b"before")
        with pytest.raises(StoreError, match=f"limit of {MAX_BLOB_BYTES} bytes"):
            store.blob_put("k", b"x" * (MAX_BLOB_BYTES + 1))
        with pytest.raises(StoreError, match="must be bytes"):
            store.blob_put("k", "text")  # type: ignore[arg-type]
        assert store.blob_get("k") == b"before"

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
            HealthCheck.too_slow,
        ],
    )
    @given(data=st.binary(max_size=4096), part=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))
    def test_any_bytes_round_trip(self, store: EventStore, data: bytes, part: str) -> None:
        if ".." in part:
            return
        key = f"prop/{uuid.uuid4().hex}/{part}"
        assert store.blob_put(key, data) == BlobInfo.of(key, data)
        assert store.blob_get(key) == data
        assert store.blob_stat(key) == BlobInfo.of(key, data)

    def test_blob_readers_never_see_part_of_a_write(self, store_factory: Callable[[], EventStore]) -> None:
        values = [bytes([n]) * (BLOB_CHUNK_BYTES + 1000 * n) for n in range(1, 4)]  # two chunks each
        first = store_factory()
        first.blob_put("hot", values[0])
        errors: list[BaseException] = []
        seen: list[bytes] = []
        stop = threading.Event()

        def writer(n: int) -> None:
            store = store_factory()
            try:
                for _ in range(8):
                    store.blob_put("hot", values[n])
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                store.close()

        def reader() -> None:
            store = store_factory()
            try:
                while not stop.is_set():
                    got = store.blob_get("hot")
                    assert got is not None
                    seen.append(got)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                store.close()

        writers = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
        readers = [threading.Thread(target=reader) for _ in range(2)]
        for t in readers + writers:
            t.start()
        for t in writers:
            t.join()
        stop.set()
        for t in readers:
            t.join()
        assert not errors
        assert seen and all(got in values for got in seen)
        assert first.blob_get("hot") in values
        first.close()

    def test_blobs_survive_reopen(self, store_factory: Callable[[], EventStore]) -> None:
        store = store_factory()
        store.blob_put("a/b", b"kept")
        store.close()
        again = store_factory()
        assert again.blob_get("a/b") == b"kept"
        assert [i.key for i in again.blob_list()] == ["a/b"]
        again.close()
