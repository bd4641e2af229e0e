"""The conformance suite can fail: broken stores are caught by the tests meant for them."""

from __future__ import annotations

import inspect

import pytest

from ctxkernel.store.rows import encode_event
from ctxkernel.store.sqlite import SqliteStore
from ctxkernel.testing.store import StoreConformance


class NoConflictCheck(SqliteStore):
    """Appends after whatever is there, ignoring the writer's expected seq."""

    def append(self, session_id, events, expected_seq):
        actual = self.next_seq(session_id)
        moved = [type(e)(actual + i, e.type, e.data, e.time, e.surface, e.ignorable) for i, e in enumerate(events)]
        super().append(session_id, moved, actual)


class NotAtomic(SqliteStore):
    """Writes a batch one event at a time: a failure midway leaves part of it."""

    def append(self, session_id, events, expected_seq):
        for event in events:
            encode_event(event)
            super().append(session_id, [event], event.seq)


class UnsortedListing(SqliteStore):
    """Lists sessions in insertion order, not sorted."""

    def list_sessions(self):
        return [row[0] for row in self._query("SELECT id FROM sessions ORDER BY rowid")]


class IgnoresEnd(SqliteStore):
    """Reads to the end of the log whatever end the caller asked for."""

    def read(self, session_id, start=0, end=None):
        return super().read(session_id, start)


@pytest.mark.parametrize(
    ("broken", "test"),
    [
        (NoConflictCheck, "test_stale_writer_conflicts_and_writes_nothing"),
        (NoConflictCheck, "test_writer_ahead_of_the_log_conflicts"),
        (NotAtomic, "test_malformed_batches_are_refused_before_writing"),
        (UnsortedListing, "test_list_sessions_is_sorted_and_shared"),
        (IgnoresEnd, "test_bounded_reads"),
    ],
)
def test_suite_catches(broken, test, tmp_path):
    suite = StoreConformance()
    method = getattr(suite, test)
    wants = inspect.signature(method).parameters
    args = {name: broken(tmp_path) for name in ("store", "other") if name in wants}
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        method(**args)
