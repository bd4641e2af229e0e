"""An in-place compaction's one durable write is its commit; its chapters are written after it.

The commit event carries the chapter plan, so the files, artifacts and records are a rendering of
the log: a crash (an exception, a SIGKILL) anywhere between the commit and the last of those
writes is healed when the session is opened again, and the reads are the same as if nothing had
happened.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers_chapters import archive_file, call_tool, chapters_kernel, log_bytes, registry, run_turns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import StoreError
from ctxkernel_chapters import plugin as chapters_plugin
from ctxkernel_chapters.registry import NAMESPACE
from ctxkernel_chapters.strategy import state

WINDOW = {"window": 6_000, "reserve": 1_000, "auto": False}


def _compacted(home: Path):
    """A session with one committed in-place compaction whose chapters are not written yet."""
    session = chapters_kernel(home, **WINDOW).open_session()
    run_turns(session, 6)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    assert state(session.context)["unsettled"]
    return session


def _archive(home: Path, session_id: str) -> dict[str, object]:
    """Everything the chapters wrote for the session, read back through a fresh kernel: the
    chapter and artifact bytes, the records, and what the read tools answer."""
    session = chapters_kernel(home, **WINDOW).open_session(session_id)
    reg = registry(session)
    records = reg.records(session.id)
    blobs = sorted((home / "blobs" / "chapters").rglob("*"))
    return {
        "files": {str(p.relative_to(home)): p.read_bytes() for p in blobs if p.is_file()},
        "records": records,
        "archived_through": reg.archived_through(session.id),
        "next_number": reg.next_number(reg.root_of(session.id)),
        "reads": [call_tool(session, "chapters_read", chapter=r["id"]).content for r in records],
        "search": call_tool(session, "chapters_search", query="compute").content,
    }


def test_the_compaction_writes_only_its_commit(tmp_path):
    session = chapters_kernel(tmp_path, **WINDOW).open_session()
    run_turns(session, 6)
    blobs_before = sorted((tmp_path / "blobs").rglob("*")) if (tmp_path / "blobs").exists() else []
    kv_before = {p: p.read_bytes() for p in (tmp_path / "kv").rglob("*.json")}
    log_before = log_bytes(session)
    assert chapters_plugin.compact_in_place(session.context, 800, reason="test")
    # nothing but the log changed: no chapter file, no record, no allocator write
    assert (sorted((tmp_path / "blobs").rglob("*")) if (tmp_path / "blobs").exists() else []) == blobs_before
    assert {p: p.read_bytes() for p in (tmp_path / "kv").rglob("*.json")} == kv_before
    assert log_bytes(session).startswith(log_before)
    summary = next(e for e in reversed(session.events) if e.type == "compaction/summary")
    planned = summary.data["records"]
    assert [f"{session.id}/{r['number']}" for r in planned] == summary.data["chapters"]
    assert planned[0]["start_seq"] == 0 and planned[-1]["end_seq"] == summary.data["archive"]["through"]
    # the table of contents cites the chapters before their files exist; the first read writes them
    toc = session.surface.nodes[0].message.text
    records = registry(session).records(session.id)
    assert [r["number"] for r in records] == [r["number"] for r in planned]
    assert all(r["path"] in toc for r in records)
    assert not call_tool(session, "chapters_read", chapter=records[0]["id"]).is_error


def test_a_crash_after_the_commit_is_healed_when_the_session_is_opened(tmp_path):
    lived, crashed = tmp_path / "lived", tmp_path / "crashed"
    session = _compacted(lived)
    shutil.copytree(lived, crashed)  # the disk as a crash right after the commit leaves it
    log = log_bytes(session)
    expected = _archive(lived, session.id)  # this one settles in the same process
    assert expected["records"] and expected["files"]
    reopened = chapters_kernel(crashed, **WINDOW).open_session(session.id)
    stored = reopened.store.kv_list(NAMESPACE, f"records/{session.id}/")  # no read asked for them
    assert sorted(r["number"] for r in stored.values()) == [r["number"] for r in expected["records"]]
    healed = _archive(crashed, session.id)  # this one by the session_opened hook
    assert healed == expected
    assert (crashed / "sessions" / f"{session.id}.jsonl").read_bytes() == log  # healing never writes the log


class Died(BaseException):
    """The process ended here (BaseException: nothing on the way up may catch it)."""


def _die_after(store, writes: int) -> None:
    """Make the ``writes``+1-th durable blob or key-value write of ``store`` end the process."""
    left = {"n": writes}

    def wrap(real):
        def write(*args):
            if left["n"] == 0:
                raise Died
            left["n"] -= 1
            return real(*args)

        return write

    store.blob_put = wrap(store.blob_put)
    store.kv_put = wrap(store.kv_put)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=st.integers(min_value=0, max_value=12))
def test_a_crash_at_any_write_of_the_settle_heals_to_the_same_archive(tmp_path_factory, writes):
    base = tmp_path_factory.mktemp("settle")
    lived, crashed = base / "lived", base / "crashed"
    session = _compacted(lived)
    shutil.copytree(lived, crashed)
    expected = _archive(lived, session.id)
    dying = None
    # the crashed copy: a process that starts settling and dies after ``writes`` writes
    kernel = chapters_kernel(crashed, **WINDOW)
    _die_after(kernel.store, writes)
    with contextlib.suppress(Died):
        dying = kernel.open_session(session.id)  # session_opened settles
    assert dying is None or not state(dying.context)["unsettled"]
    assert _archive(crashed, session.id) == expected


WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from helpers_chapters import chapters_kernel, run_turns
    from ctxkernel_chapters import plugin, settle

    home = Path(sys.argv[1])
    session = chapters_kernel(home, window=6_000, reserve=1_000, auto=False).open_session()
    run_turns(session, 6)
    assert plugin.compact_in_place(session.context, 800, reason="test")
    print(session.id, flush=True)
    real = session.store.blob_put
    def put(key, data):
        info = real(key, data)
        if "/chapters/" in key:  # a chapter file is on disk, its record is not
            os.kill(os.getpid(), signal.SIGKILL)
        return info
    session.store.blob_put = put
    settle.settle(session.context)
    """
)


def test_a_sigkill_between_a_chapter_file_and_its_record_is_healed(tmp_path):
    lived, killed = tmp_path / "lived", tmp_path / "killed"
    proc = subprocess.run(
        [sys.executable, "-c", WRITER, str(killed), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    session_id = proc.stdout.split()[0]
    files = sorted(p.name for p in (killed / "blobs" / "chapters").rglob("*.md"))
    assert files, "the writer died before any chapter file"
    assert [p for p in (killed / "kv" / NAMESPACE).rglob("*.json") if "records" in p.name] == []
    shutil.copytree(killed, lived)
    log = (killed / "sessions" / f"{session_id}.jsonl").read_bytes()
    healed = _archive(killed, session_id)
    assert healed["records"] and all(not r.startswith("chapters_read refused") for r in healed["reads"])
    assert (killed / "sessions" / f"{session_id}.jsonl").read_bytes() == log
    again = _archive(lived, session_id)  # a second, independent heal of the same disk
    assert again == healed


def test_a_store_error_leaves_the_chapters_to_the_next_settle(tmp_path, monkeypatch):
    session = _compacted(tmp_path)
    real = session.store.blob_put

    def full(key, data):
        raise StoreError("disk full (forced by the test)")

    monkeypatch.setattr(session.store, "blob_put", full)
    registry(session)  # logged, not raised: the step goes on
    assert state(session.context)["unsettled"] and registry(session).records(session.id) == []
    monkeypatch.setattr(session.store, "blob_put", real)
    records = registry(session).records(session.id)
    assert records and not state(session.context)["unsettled"]
    assert not call_tool(session, "chapters_read", chapter=records[0]["id"]).is_error


def test_a_settled_chapter_is_still_refused_when_tampered(tmp_path):
    session = _compacted(tmp_path)
    record = registry(session).records(session.id)[0]
    path = archive_file(session, record["path"])
    path.write_bytes(path.read_bytes().replace(b"task 0", b"task 9"))
    outcome = call_tool(session, "chapters_read", chapter=record["id"])
    assert outcome.is_error and "sha256" in outcome.content


def test_an_edited_plan_in_the_log_is_reported_not_written(tmp_path):
    session = _compacted(tmp_path)
    data = state(session.context)["unsettled"][0]
    data["root"] = "../outside"  # what an edited log line would say
    assert chapters_plugin.committed_records(session.context) == []  # a table of contents leaves it out
    assert registry(session).records(session.id) == []
    assert not state(session.context)["unsettled"]  # reported once (logged), not tried at every step
    assert not (tmp_path / "outside").exists() and not (tmp_path / "blobs").exists()


def test_a_lost_chapter_file_is_written_again_from_the_log_on_read(tmp_path):
    session = _compacted(tmp_path)
    record = registry(session).records(session.id)[0]
    path = archive_file(session, record["path"])
    original = path.read_bytes()
    expected = call_tool(session, "chapters_read", chapter=record["id"]).content
    path.unlink()
    assert call_tool(session, "chapters_search", query="compute").content.count("refused") == 0
    assert path.read_bytes() == original  # the same bytes: the record's sha256 checked them
    path.unlink()
    assert call_tool(session, "chapters_read", chapter=record["id"]).content == expected


def test_a_lost_chapter_whose_record_does_not_match_the_log_stays_reported(tmp_path):
    session = _compacted(tmp_path)
    record = registry(session).records(session.id)[0]
    archive_file(session, record["path"]).unlink()
    session.store.kv_put(NAMESPACE, f"records/{session.id}/{record['number']:06d}", {**record, "sha256": "0" * 64})
    outcome = call_tool(session, "chapters_read", chapter=record["id"])
    assert outcome.is_error and "not in the archive" in outcome.content
    assert not archive_file(session, record["path"]).exists()
