"""``ctxkernel export SESSION --to DIR`` (#19 item 1): a session's strategy files, out of the store
and into a folder as the seeds lay them out, each verified by sha256; never outside DIR."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from export_support import plant_temporary_links
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Kernel, Message, StoreError, ToolCallBlock
from ctxkernel.cli import main
from ctxkernel.store.export import write_export

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("CTXKERNEL_"):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    monkeypatch.setenv("CTXKERNEL_HOME", str(home))
    monkeypatch.chdir(REPO)  # ./profiles is on the profile search path
    yield home
    from ctxkernel.logging import reset_logging

    reset_logging()


def _turns(session, count: int) -> None:
    for n in range(count):
        session.user(f"task {n}: read module {n} and explain it " + "detail " * 40)
        request = session.prepare_request()
        call = ToolCallBlock(f"c{n}", "read_file", {"path": f"src/m{n}.py"})
        session.commit_reply(Message.assistant("reading", [call]))
        session.tool_result(f"c{n}", f"# module {n}\n" + "x = compute(1, 2)\n" * 60)
        request = session.prepare_request()
        assert request.messages
        session.commit_reply(Message.assistant(f"module {n} computes things " + "because " * 30))
        session.end_turn()


def _export(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["export", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_chapters_and_handoff_files_are_exported_as_the_seeds_lay_them_out(tmp_path, capsys):
    from ctxkernel_chapters.plugin import compact_in_place
    from ctxkernel_handoff import compact_now

    chapters = Kernel.from_profile("chapters").open_session()
    _turns(chapters, 8)
    assert compact_in_place(chapters.context, 800, reason="test")
    handoff = Kernel.from_profile("handoff").open_session()
    _turns(handoff, 4)
    assert compact_now(handoff.context).committed

    code, out, err = _export(capsys, chapters.id, "--to", str(tmp_path / "out"), "--json")
    assert code == 0, err
    report = json.loads(out)
    paths = [row["path"] for row in report["files"]]
    assert any(p.startswith("chapters/") and "/chapters/" in p and p.endswith(".md") for p in paths), paths
    for row in report["files"]:
        data = (tmp_path / "out" / row["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == row["sha256"] and len(data) == row["bytes"]
        # the very bytes the store holds for the strategy
        assert chapters.store.blob_get(row["path"]) == data
    assert {p.split("/")[0] for p in paths} == {"chapters"}

    code, out, err = _export(capsys, handoff.id, "--to", str(tmp_path / "out2"))
    assert code == 0, err
    assert "verified by sha256" in out
    note = (tmp_path / "out2" / "handoff" / "handoff.md").read_text()
    assert note.strip() and (tmp_path / "out2" / "handoff" / "handoff-log.md").read_text().startswith("- win_")


def test_a_session_without_files_exports_nothing(tmp_path, capsys):
    session = Kernel.from_profile("basic").open_session()
    _turns(session, 1)
    code, out, _ = _export(capsys, session.id, "--to", str(tmp_path / "out"), "--json")
    assert code == 0 and json.loads(out)["files"] == []


def test_bad_targets_and_sessions_are_clear_errors(tmp_path, capsys):
    session = Kernel.from_profile("basic").open_session()
    code, _, err = _export(capsys, "no-such-session", "--to", str(tmp_path / "out"))
    assert code == 2 and "no session 'no-such-session'" in err
    code, _, err = _export(capsys, "../escape", "--to", str(tmp_path / "out"))
    assert code == 2 and "invalid session id" in err
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    from ctxkernel_decay.plugin import audit

    # give the basic session a file to write, through decay's audit (a strategy's blobs)
    audit(session.context, {"kind": "test"})
    code, _, err = _export(capsys, session.id, "--to", str(blocker / "sub"))
    # a bad --to is a usage error (exit 2, as the docs say), naming the file and what is accepted
    assert code == 2 and "export: error" in err and f"{blocker} is a file, not a folder" in err, err
    assert "accepted: a folder" in err


def test_a_target_inside_the_stores_folder_is_refused(tmp_path, env, capsys):
    from ctxkernel_handoff import compact_now

    session = Kernel.from_profile("handoff").open_session()
    _turns(session, 4)
    assert compact_now(session.context).committed

    def files() -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in sorted(env.rglob("*")) if p.is_file()}

    before = files()
    (tmp_path / "link").symlink_to(env / "blobs")
    for target in (env, env / "blobs", env / "sessions" / "new", tmp_path / "link"):
        code, out, err = _export(capsys, session.id, "--to", str(target))
        assert code == 2 and "inside the store's folder" in err and "Traceback" not in err, (target, err)
        assert files() == before and not out
    code, _, err = _export(capsys, session.id, "--to", str(tmp_path / "out"))
    assert code == 0, err


def test_paths_that_leave_the_folder_are_refused_and_nothing_is_written(tmp_path):
    for bad in ("../x", "/etc/passwd", "a/../../x", ".hidden", "a//b", "a\\..\\b", ""):
        with pytest.raises(StoreError, match="accepted: a relative path"):
            write_export(tmp_path / "out", {"mine": {"ok.txt": b"fine", bad: b"evil"}})
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    with pytest.raises(StoreError, match="both export"):
        write_export(tmp_path / "out", {"one": {"same": b"1"}, "two": {"same": b"2"}})


def test_a_link_planted_in_the_folder_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "out"
    target.mkdir()
    (target / "chapters").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreError, match="is a link; it could lead outside the export folder"):
        write_export(target, {"chapters": {"chapters/r/chapters/001-a.md": b"# a"}})
    assert list(outside.iterdir()) == []
    # a link in place of the file itself is replaced, never written through
    (target / "f.txt").symlink_to(outside / "victim.txt")
    written = write_export(target, {"s": {"f.txt": b"data"}})
    assert not (outside / "victim.txt").exists() and (target / "f.txt").read_bytes() == b"data"
    assert written[0].sha256 == hashlib.sha256(b"data").hexdigest()


def test_a_link_planted_at_a_temporary_name_is_not_written_through(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep me")
    target = tmp_path / "out"
    plant_temporary_links(target / "notes", "plan.md", victim, monkeypatch)
    written = write_export(target, {"s": {"notes/plan.md": b"exported"}})
    assert victim.read_bytes() == b"keep me"
    assert (target / "notes" / "plan.md").read_bytes() == b"exported" and not (
        target / "notes" / "plan.md"
    ).is_symlink()
    assert written[0].sha256 == hashlib.sha256(b"exported").hexdigest()


part = st.text(st.sampled_from("ab.-_/\\x0"), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(paths=st.lists(part, min_size=1, max_size=4, unique=True))
def test_whatever_the_paths_nothing_lands_outside_the_folder(tmp_path, paths):
    base = tmp_path / f"case{abs(hash(tuple(paths)))}"
    target = base / "out"
    try:
        written = write_export(target, {"s": {p: p.encode() for p in paths}})
    except StoreError:
        written = []
    outside = [p for p in base.rglob("*") if target not in p.parents and p != target]
    assert outside == []
    for f in written:
        assert (target / f.path).resolve().is_relative_to(target.resolve())
