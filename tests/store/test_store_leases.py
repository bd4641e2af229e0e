"""The compaction lease across hosts: a holder SIGKILLed inside its compaction transaction is taken
over by a worker of another host only after its lease expired (never before), by the store's
clock; on postgres the workers' own clocks, skewed on purpose, do not matter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import orjson
import pytest

from ctxkernel import Kernel
from ctxkernel.compaction import Span, whole_surface_but_last
from ctxkernel.errors import CompactionBusyError
from ctxkernel.store.cli import open_store
from ctxkernel.testing import make_profile
from ctxkernel.testing.store import postgres_dsn, postgres_schema

WORKER = Path(__file__).with_name("two_workers_worker.py")
LEASE_SECONDS = 1.5


def worker(spec: str, host: str, clock_offset: float) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "WORKER_HOST_ID": host,
        "WORKER_LEASE_SECONDS": str(LEASE_SECONDS),
        "WORKER_CLOCK_OFFSET": str(clock_offset),
    }
    return subprocess.Popen(
        [sys.executable, str(WORKER), spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )


def ask(proc: subprocess.Popen[str], **cmd):
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(orjson.dumps(cmd).decode() + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line, f"worker exited with {proc.wait()}"
    answer = orjson.loads(line)
    assert "fatal" not in answer, answer["fatal"]
    return answer


def store_clock_and_expiry(spec: str, name: str) -> tuple[float, float]:
    """(the store's clock now, the lease's expiry) in seconds, read the way the store judges it."""
    backend, target = spec.split(":", 1)
    if backend == "postgres":
        import psycopg

        with psycopg.connect(target) as conn:
            now, expires = conn.execute(
                "SELECT extract(epoch FROM clock_timestamp()), extract(epoch FROM expires) "
                "FROM ctxkernel_leases WHERE name = %s",
                (name,),
            ).fetchone()
        return float(now), float(expires)
    if backend == "sqlite":
        import sqlite3

        with sqlite3.connect(Path(target) / "ctxkernel.sqlite3") as db:
            (expires,) = db.execute("SELECT expires FROM leases WHERE name = ?", (name,)).fetchone()
        return time.time(), expires
    path = Path(target) / "leases" / (urllib.parse.quote(name, safe="") + ".json")
    return time.time(), orjson.loads(path.read_bytes())["expires"]


def takeover_after_expiry(spec: str, clock_offset: float, home: Path, monkeypatch, proof_line) -> None:
    holder = worker(spec, "host-a", clock_offset)
    try:
        sid = ask(holder, op="open")["session"]
        for i in range(4):
            ask(holder, op="turn", text=f"a{i}")
        held = ask(holder, op="hold_compaction")  # inside the transaction: its start is in the log
        compaction_id = held["open_compaction"]["compaction_id"]
        # the other host, its clock skewed the other way, opens the session meanwhile
        if clock_offset:
            real_time = time.time
            monkeypatch.setattr(time, "time", lambda: real_time() - clock_offset)
        profile = make_profile(store={"host_id": "host-b", "lease_seconds": LEASE_SECONDS})
        kernel = Kernel(profile, store=open_store(spec), home=home, entry_points=False)
        reopened = kernel.open_session(sid)
        assert reopened.open_compaction is not None  # repair on open leaves a live lease alone
        time.sleep(LEASE_SECONDS / 2)  # at least one renewal happens while the transaction runs
        name = f"compaction/{sid}"
        _, renewed_to = store_clock_and_expiry(spec, name)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        killed_at, expires = store_clock_and_expiry(spec, name)
        assert expires >= renewed_to  # nobody renews a dead holder's lease
        refused = 0
        deadline = time.monotonic() + LEASE_SECONDS * 20
        while True:
            assert time.monotonic() < deadline, "the dead holder's lease was never taken over"
            start, end = whole_surface_but_last(reopened.surface)
            before, lease_expiry = store_clock_and_expiry(spec, name)
            try:
                reopened.compact(Span(start, end, summary="taken over"), strategy="basic")
            except CompactionBusyError as exc:
                assert "host 'host-a'" in str(exc) and f"pid {held['pid']}" in str(exc)
                after, _ = store_clock_and_expiry(spec, name)
                assert before < lease_expiry + 0.05, "refused although the lease had expired"
                refused += 1
                time.sleep(0.05)
                continue
            assert before >= lease_expiry - 0.05 or after >= lease_expiry, "taken over before the lease expired"
            break
        (end_event,) = [
            e for e in reopened.events if e.type == "compaction/end" and e.data["compaction_id"] == compaction_id
        ]
        takeover = end_event.data["takeover"]
        assert takeover["reason"] == "its holder's lease expired"
        assert takeover["holder"]["host"] == "host-a" and takeover["holder"]["pid"] == held["pid"]
        assert takeover["by"]["host"] == "host-b"
        assert not any(
            e.type == "compaction/summary" and e.data["compaction_id"] == compaction_id for e in reopened.events
        )
        assert reopened.open_compaction is None
        assert refused >= 3, "the lease should have been refused for most of its remaining time"
        waited = expires - killed_at
        proof_line(
            f"lease [{spec.split(':')[0]}{f', clocks skewed ±{clock_offset:g}s' if clock_offset else ''}]: holder on "
            f"host-a SIGKILLed inside its compaction; host-b refused {refused} times over {waited:.2f} s until the "
            "lease expired by the store's clock, then took over (recorded in the compaction's error end)"
        )
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@pytest.mark.postgres
@pytest.mark.parametrize("clock_offset", [0.0, 3600.0], ids=["same-clocks", "skewed-clocks"])
def test_postgres_lease_is_taken_over_only_after_expiry(clock_offset, tmp_path, monkeypatch, proof_line):
    with postgres_schema(postgres_dsn()) as dsn:
        takeover_after_expiry(f"postgres:{dsn}", clock_offset, tmp_path, monkeypatch, proof_line)


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_local_lease_is_taken_over_only_after_expiry(backend, tmp_path, monkeypatch, proof_line):
    takeover_after_expiry(f"{backend}:{tmp_path / 'store'}", 0.0, tmp_path / "home", monkeypatch, proof_line)
