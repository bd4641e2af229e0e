"""jsonl store: the offsets a snapshot-primed index reads back are the ones a full scan finds."""

from __future__ import annotations

from array import array

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel.store.jsonl import JsonlStore, _Index
from ctxkernel.testing.store import event, header

#: line sizes around the backward read's first block (64 KB) and its doublings, and small ones
SIZES = st.one_of(st.integers(0, 300), st.integers(30_000, 200_000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(SIZES, min_size=1, max_size=12), data=st.data())
def test_reading_back_from_a_snapshot_finds_the_offsets_a_full_scan_finds(tmp_path_factory, sizes, data):
    root = tmp_path_factory.mktemp("log")
    writer = JsonlStore(root)
    writer.create(header("s"))
    writer.append("s", [event(i, {"pad": "x" * n}) for i, n in enumerate(sizes)], 0)
    full = JsonlStore(root)
    whole, _, _ = full._scan("s")  # the fresh computation: every offset from event 0
    last = data.draw(st.integers(1, len(sizes) - 1) if len(sizes) > 1 else st.just(0), label="snapshot covers to")
    start = data.draw(st.integers(0, last), label="read from")
    reader = JsonlStore(root)
    # as snapshot_read primes it: the offset of the last event the snapshot covers, and its end
    end = whole.offsets[last + 1] if last + 1 < len(sizes) else whole.end
    reader._index["s"] = _Index(offsets=array("q", [whole.offsets[last]]), end=end, base=last)
    reader._primed.add("s")
    assert [e.seq for e in reader.read("s", start)] == list(range(start, len(sizes)))
    index = reader._index["s"]
    assert index.base == start
    assert index.offsets == whole.offsets[start:]
