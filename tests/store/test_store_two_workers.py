"""Two worker processes, one session, one PostgreSQL store (and the same on SQLite).

A session started by one worker is resumed by the other with the same surface; while one holds an
open compaction transaction the other's compaction is refused as busy, naming the holder; appends
racing from both leave no gap and no duplicate seq.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from ctxkernel.store.cli import open_store
from ctxkernel.testing.store import postgres_dsn, postgres_schema

WORKER = Path(__file__).with_name("two_workers_worker.py")


class Worker:
    def __init__(self, spec: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def send(self, **cmd):
        try:
            self.proc.stdin.write(orjson.dumps(cmd).decode() + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # the worker died; its traceback is in the captured stderr
            raise AssertionError(f"worker exited with {self.proc.wait()} before {cmd['op']!r}") from None

    def recv(self):
        line = self.proc.stdout.readline()
        assert line, f"worker exited with {self.proc.wait()}"
        answer = orjson.loads(line)
        assert "fatal" not in answer, answer["fatal"]
        return answer

    def __call__(self, **cmd):
        self.send(**cmd)
        return self.recv()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


def two_workers(spec: str, proof_line) -> None:
    a, b = Worker(spec), Worker(spec)
    try:
        # started by one ...
        view_a = a(op="open")
        for i in range(10):
            view_a = a(op="turn", text=f"a{i}")
        sid = view_a["session"]
        store = open_store(spec)
        assert any(e.type == "compaction/summary" for e in store.read(sid)), "the turns should have compacted"
        # ... resumed by the other with the same surface, messages and pressure
        view_b = b(op="open", session=sid)
        for key in ("events", "surface", "messages", "pressure"):
            assert view_b[key] == view_a[key], key
        view_b = b(op="turn", text="b0")
        view_a = a(op="open", session=sid)
        assert view_a["surface"] == view_b["surface"] and view_a["messages"] == view_b["messages"]

        # one holds an open compaction transaction: the other is refused as busy, naming the holder
        held = a(op="hold_compaction")
        assert held["open_compaction"] is not None
        refused = b(op="compact")
        assert not refused["ok"] and refused["error_type"] == "CompactionBusyError"
        assert held["open_compaction"]["compaction_id"] in refused["error"]
        assert f"pid {held['pid']}" in refused["error"]
        released = a(op="release")
        assert released["committed"] and released["error"] is None
        b(op="turn", text="b1")
        again = b(op="compact")
        assert again["ok"], again  # free again once the holder committed

        # appends racing from both: no gap, no duplicate, every acknowledged append present
        at = time.time() + 1.0
        a.send(op="race", n=150, at=at)
        b.send(op="race", n=150, at=at)
        race_a, race_b = a.recv(), b.recv()
        events = list(store.read(sid))
        assert [e.seq for e in events] == list(range(len(events)))
        assert not set(race_a["acked"]) & set(race_b["acked"])
        for race in (race_a, race_b):
            assert len(race["acked"]) == 150
            for i, seq in enumerate(race["acked"]):
                assert events[seq].type == "race/tick" and events[seq].data == {"worker": race["pid"], "i": i}
        ticks = [e.seq for e in events if e.type == "race/tick"]
        assert len(ticks) == 300
        proof_line(
            f"two workers [{store.backend}]: resumed with the same surface ({len(view_b['surface'])} nodes), busy "
            f"compaction refused naming pid {held['pid']}, 300 racing appends with "
            f"{race_a['conflicts'] + race_b['conflicts']} conflicts retried, seqs 0..{len(events) - 1} with no gap"
        )
        store.close()
    finally:
        a.close()
        b.close()


@pytest.mark.postgres
def test_two_workers_on_postgres(proof_line):
    with postgres_schema(postgres_dsn()) as dsn:
        two_workers(f"postgres:{dsn}", proof_line)


def test_two_workers_on_sqlite(tmp_path, proof_line):
    two_workers(f"sqlite:{tmp_path}", proof_line)


def test_two_workers_on_jsonl(tmp_path, proof_line):
    two_workers(f"jsonl:{tmp_path}", proof_line)
