"""The log: replay determinism, citation rules, crash repair at every byte, corruption reports,
and two processes writing one session."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxkernel import (
    AgentLoop,
    ConflictError,
    CorruptionError,
    EventSpec,
    Message,
    ScriptedModel,
    SurfaceError,
    ToolCallBlock,
)
from ctxkernel.snapshot import LazyEvents
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.surface import replay
from ctxkernel.testing import build_kernel

REPO = Path(__file__).resolve().parents[1]
SMALL_WINDOW = {"context_window": 6000, "reserved_output_tokens": 1000}


def scripted_work(turns: int, kernel: Any, session: Any) -> None:
    """Turns of tool-calling work that overflow a small window, so basic compacts."""
    counter = {"n": 0}

    def script(messages: Any, system: str, tools: Any) -> Message:
        counter["n"] += 1
        n = counter["n"]
        if n % 3:
            return Message.assistant(
                f"reading {n}",
                [ToolCallBlock(f"c{n}a", "read", {"path": f"f{n}.py"}), ToolCallBlock(f"c{n}b", "grep", {"q": str(n)})],
            )
        return Message.assistant(f"done {n}")

    loop = AgentLoop(session, ScriptedModel(script), lambda call: f"{call.name} output\n" + "x = 1\n" * 60)
    for turn in range(turns):
        loop.run(f"task {turn}")


def surface_snapshot(session: Any) -> dict[str, Any]:
    return {
        "seqs": [n.seq for n in session.surface],
        "messages": [n.message.to_dict() for n in session.surface],
        "pressure": session.pressure().to_dict(),
        "events": len(session.events),
    }


@pytest.fixture
def worked(tmp_path: Path) -> tuple[Any, Any, Path]:
    kernel = build_kernel(tmp_path, model=SMALL_WINDOW)
    session = kernel.open_session()
    scripted_work(12, kernel, session)
    assert sum(e.type == "compaction/summary" for e in session.events) >= 2  # replacements happened
    return kernel, session, kernel.store.path(session.id)


# -- replay determinism -----------------------------------------------------------------------------
def test_same_log_same_surface_in_process(worked: tuple[Any, Any, Path]) -> None:
    kernel, session, _ = worked
    live = surface_snapshot(session)
    assert surface_snapshot(kernel.open_session(session.id)) == live
    # a fresh store object (nothing cached) and the bare fold agree too
    fresh = build_kernel(kernel.home, model=SMALL_WINDOW)
    assert surface_snapshot(fresh.open_session(session.id)) == live
    folded = replay(JsonlStore(kernel.home).read(session.id))
    assert [n.seq for n in folded] == live["seqs"]


def test_same_log_same_surface_after_a_process_restart(worked: tuple[Any, Any, Path]) -> None:
    kernel, session, _ = worked
    code = textwrap.dedent(
        f"""
        import orjson, sys
        from ctxkernel.testing import build_kernel
        kernel = build_kernel(sys.argv[1], model={SMALL_WINDOW!r})
        s = kernel.open_session(sys.argv[2])
        out = {{"seqs": [n.seq for n in s.surface], "messages": [n.message.to_dict() for n in s.surface],
               "pressure": s.pressure().to_dict(), "events": len(s.events)}}
        sys.stdout.write(orjson.dumps(out).decode())
        """
    )
    before = kernel.store.path(session.id).read_bytes()
    proc = subprocess.run(
        [sys.executable, "-c", code, str(kernel.home), session.id],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(orjson.dumps(surface_snapshot(session)))
    assert kernel.store.path(session.id).read_bytes() == before  # a clean log is only read


# -- citations -------------------------------------------------------------------------------------
def test_a_replace_that_omits_a_shadowed_citation_is_rejected(worked: tuple[Any, Any, Path]) -> None:
    kernel, session, path = worked
    session.user("one more")
    seqs = [n.seq for n in session.surface]
    start, end = seqs[0], seqs[2]
    before = path.read_bytes()
    surface_before = surface_snapshot(session)
    replacement = {"message": Message.user("summary").to_dict()}
    with pytest.raises(SurfaceError, match=rf"shadows \[{seqs[1]}\] without citing them"):
        session.append(
            [
                EventSpec(
                    "user/message", replacement, {"op": "replace", "start": start, "end": end, "cites": [start, end]}
                )
            ]
        )
    with pytest.raises(SurfaceError, match="not in the range"):
        session.append(
            [
                EventSpec(
                    "user/message",
                    replacement,
                    {"op": "replace", "start": start, "end": end, "cites": [*seqs[:3], 10**6]},
                )
            ]
        )
    assert path.read_bytes() == before
    assert surface_snapshot(session) == surface_before


def test_a_stored_replace_without_full_citations_is_reported_not_replayed(tmp_path: Path) -> None:
    kernel = build_kernel(tmp_path)
    session = kernel.open_session()
    for text in ("a", "b", "c"):
        session.user(text)
    session.end_turn()
    path = kernel.store.path(session.id)
    # hand-write what the kernel would refuse: seq 2 and 3 shadowed, only 2 cited
    bad = {
        "seq": len(session.events),
        "type": "user/message",
        "time": "2026-01-01T00:00:00.000Z",
        "data": {"message": Message.user("s").to_dict()},
        "surface": {"op": "replace", "start": 2, "end": 3, "cites": [2]},
    }
    end = {"seq": bad["seq"] + 1, "type": "turn/start", "time": "2026-01-01T00:00:00.000Z", "data": {"turn": 2}}
    with open(path, "ab") as f:
        f.write(orjson.dumps(bad) + b"\n" + orjson.dumps(end) + b"\n")
    before = path.read_bytes()
    with pytest.raises(CorruptionError, match=rf"event {bad['seq']} \(user/message\) cannot be replayed"):
        build_kernel(tmp_path).open_session(session.id)
    assert path.read_bytes() == before


# -- torn tails --------------------------------------------------------------------------------------
def last_batch_lines(data: bytes) -> tuple[bytes, list[bytes]]:
    """The file before its last batch, and the last batch's lines (with newlines)."""
    lines = data.splitlines(keepends=True)
    i = len(lines) - 1
    while i > 1 and b'"more":true' in lines[i - 1]:
        i -= 1
    return b"".join(lines[:i]), lines[i:]


def test_a_cut_at_every_byte_of_the_last_line_reopens_to_the_last_complete_event(
    worked: tuple[Any, Any, Path], tmp_path: Path
) -> None:
    kernel, session, path = worked
    data = path.read_bytes()
    prefix, batch = last_batch_lines(data)
    assert len(batch) == 1, "the fixture's log ends with a one-event batch (turn/end)"
    line = batch[0]
    expected = [e.to_dict() for e in session.events[:-1]]
    home = tmp_path / "cuts"
    target = home / "sessions" / path.name
    target.parent.mkdir(parents=True)
    for cut in range(len(line)):  # every offset short of the full line with its newline
        target.write_bytes(prefix + line[:cut])
        store = JsonlStore(home)
        assert [e.to_dict() for e in store.read(session.id)] == expected, f"cut at byte {cut}"
        report = store.repair(session.id)
        assert report.repaired == (cut > 0)
        assert target.read_bytes() == prefix  # exactly the torn bytes were cut, nothing else
    # the kernel reopens it at the last complete event (the final reply and its step/end);
    # nothing was pending, so the repair adds nothing and the turn can still be ended
    target.write_bytes(prefix + line[: len(line) // 2])
    reopened = build_kernel(home, model=SMALL_WINDOW).open_session(session.id)
    assert [e.to_dict() for e in reopened.events] == expected
    assert reopened.turn_open and [n.seq for n in reopened.surface] == [n.seq for n in session.surface]
    reopened.end_turn()


def test_a_batch_cut_midway_is_dropped_whole(tmp_path: Path) -> None:
    kernel = build_kernel(tmp_path)
    session = kernel.open_session()
    session.user("hello")
    complete = len(session.events)
    session.append([EventSpec(f"test/e{i}", {"i": i}, ignorable=True) for i in range(4)])
    path = kernel.store.path(session.id)
    data = path.read_bytes()
    prefix, batch = last_batch_lines(data)
    assert len(batch) == 4
    body = b"".join(batch)
    home = tmp_path / "cuts"
    target = home / "sessions" / path.name
    target.parent.mkdir(parents=True)
    for cut in range(len(body)):  # includes cuts just after a complete line inside the batch
        target.write_bytes(prefix + body[:cut])
        store = JsonlStore(home)
        assert len(list(store.read(session.id))) == complete, f"cut at byte {cut}"
        store.repair(session.id)
        assert target.read_bytes() == prefix


# -- corruption -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("defect", ["bad json", "wrong seq", "unknown type"])
def test_a_defect_before_the_end_names_file_and_line_and_rewrites_nothing(
    worked: tuple[Any, Any, Path], defect: str
) -> None:
    kernel, session, path = worked
    lines = path.read_bytes().splitlines(keepends=True)
    n = len(lines) // 2  # a line in the middle, well before the last turn/end
    event = orjson.loads(lines[n])
    if defect == "bad json":
        lines[n] = lines[n][:-5] + b"\n"
    elif defect == "wrong seq":
        event["seq"] += 1
        lines[n] = orjson.dumps(event) + b"\n"
    else:
        event["type"] = "mystery/thing"
        lines[n] = orjson.dumps(event) + b"\n"
    path.write_bytes(b"".join(lines))
    before = path.read_bytes()
    with pytest.raises(CorruptionError) as info:
        build_kernel(kernel.home, model=SMALL_WINDOW, store={"snapshot_every": 0}).open_session(session.id)
    assert f"{path}:{n + 1}:" in str(info.value)
    assert path.read_bytes() == before
    # opened from a snapshot, the damaged part of the history is read (and refused) on first use
    with pytest.raises(CorruptionError) as info:
        reopened = build_kernel(kernel.home, model=SMALL_WINDOW).open_session(session.id)
        assert isinstance(reopened.events, LazyEvents) and reopened.events.base > n
        list(reopened.events)
    # named by file and line (the store's check) or by seq (the kernel's type check)
    assert f"{path}:{n + 1}:" in str(info.value) or f"event {n - 1} has unknown type" in str(info.value)
    assert path.read_bytes() == before


# -- two processes, one session ---------------------------------------------------------------------------
def _writer(home: str, session_id: str, worker: int, batches: int, acks: Any) -> None:
    kernel = build_kernel(Path(home))
    session = kernel.open_session(session_id, repair=False)
    conflicts = 0
    for b in range(batches):
        batch = [EventSpec(f"test/w{worker}", {"worker": worker, "batch": b, "i": i}, ignorable=True) for i in range(3)]
        while True:
            try:
                first = session.append(batch)
                break
            except ConflictError:
                conflicts += 1
                session.refresh()  # another writer won: re-read, then try again
        acks.put((worker, b, first))
    acks.put((worker, None, conflicts))


@pytest.mark.timeout(300)
def test_two_processes_appending_never_corrupt_the_log(tmp_path: Path) -> None:
    kernel = build_kernel(tmp_path)
    session = kernel.open_session()
    session.user("shared")
    base = len(session.events)
    ctx = multiprocessing.get_context("fork")
    acks = ctx.Queue()
    workers, batches = 3, 25
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), session.id, w, batches, acks)) for w in range(workers)]
    for p in procs:
        p.start()
    acknowledged: list[tuple[int, int, int]] = []
    done = 0
    conflicts = 0
    while done < workers:
        worker, b, first = acks.get(timeout=240)
        if b is None:
            done += 1
            conflicts += first
        else:
            acknowledged.append((worker, b, first))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    events = list(JsonlStore(tmp_path).read(session.id))
    assert [e.seq for e in events] == list(range(base + workers * batches * 3))
    for worker, b, first in acknowledged:
        got = [(e.data["worker"], e.data["batch"], e.data["i"]) for e in events[first : first + 3]]
        assert got == [(worker, b, 0), (worker, b, 1), (worker, b, 2)]  # no lost or interleaved batch
    assert len(acknowledged) == workers * batches
    print(f"{conflicts} conflicts resolved by re-reading")  # usually > 0: the writers raced
    reopened = build_kernel(tmp_path).open_session(session.id)
    assert [e.to_dict() for e in reopened.events] == [e.to_dict() for e in events]


def test_a_stale_writer_gets_a_conflict_and_writes_nothing(tmp_path: Path) -> None:
    kernel = build_kernel(tmp_path)
    a = kernel.open_session()
    a.user("x")
    b = build_kernel(tmp_path).open_session(a.id, repair=False)
    a.emit("test", "first", {})
    path = kernel.store.path(a.id)
    before = path.read_bytes()
    with pytest.raises(ConflictError, match="Nothing was written"):
        b.append([EventSpec("test/second", {}, ignorable=True)])
    assert path.read_bytes() == before
    b.refresh()
    b.emit("test", "second", {})
    assert [e.type for e in JsonlStore(tmp_path).read(a.id)][-2:] == ["test/first", "test/second"]


def test_copy_of_a_log_is_a_byte_for_byte_replay(worked: tuple[Any, Any, Path], tmp_path: Path) -> None:
    """Replay depends on the bytes alone: a copy under another home gives the same surface."""
    kernel, session, path = worked
    other = tmp_path / "copy"
    (other / "sessions").mkdir(parents=True)
    shutil.copy(path, other / "sessions" / path.name)
    assert surface_snapshot(build_kernel(other, model=SMALL_WINDOW).open_session(session.id)) == surface_snapshot(
        session
    )
    assert os.path.getsize(other / "sessions" / path.name) == os.path.getsize(path)


def test_opening_and_refreshing_a_long_log_leave_the_collector_alone(tmp_path, monkeypatch):
    # the garbage collector belongs to the host's process: the library never switches it, not
    # even around the bulk loads of a cold open, a snapshot's tail or a refresh
    import gc

    kernel = build_kernel(tmp_path, fsync=False)
    writer = kernel.open_session(create=True)
    writer.append([EventSpec("test/tick", {"n": n}, ignorable=True) for n in range(1_500)])
    writer.write_snapshot()
    writer.append([EventSpec("test/tick", {"n": n}, ignorable=True) for n in range(1_500)])
    switched: list[str] = []
    for name in ("disable", "enable", "freeze", "set_threshold"):
        monkeypatch.setattr(gc, name, lambda *args, name=name: switched.append(name))
    reader = build_kernel(tmp_path, fsync=False).open_session(writer.id)
    writer.append([EventSpec("test/tick", {"n": n}, ignorable=True) for n in range(1_500)])
    assert reader.refresh() == 1_500
    monkeypatch.undo()
    assert switched == []
    assert len(reader.events) == len(writer.events)
