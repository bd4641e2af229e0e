"""`ctxkernel store copy`: sessions move between backends with counts and hashes verified, and an
interrupted copy resumes."""

from __future__ import annotations

import json

import pytest

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.cli import main
from ctxkernel.errors import StoreError
from ctxkernel.store import cli as store_cli
from ctxkernel.store.cli import copy_sessions, open_store, session_hash
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile
from ctxkernel.testing.store import postgres_dsn, postgres_schema


def fill(store, session_id, turns, tmp_path):
    """A real session: turns with tool calls, compacting every few turns."""
    profile = make_profile(model={"context_window": 3000, "reserved_output_tokens": 500})
    kernel = Kernel(profile, store=store, home=tmp_path, entry_points=False)
    session = kernel.open_session(session_id, create=not store.exists(session_id))
    for t in range(turns):
        session.user(f"turn {t} ünïcødé 🙂")
        session.prepare_request()
        call = ToolCallBlock(f"{session_id}-{len(session.events)}", "read", {"path": f"f{t}.py"})
        session.commit_reply(Message.assistant("reading", [call]))
        session.tool_result(call.id, "x = 1\n" * 120)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"done {t}"))
        session.end_turn()
    return session


def surface_of(store, session_id, tmp_path):
    kernel = Kernel(make_profile(), store=store, home=tmp_path, entry_points=False)
    session = kernel.open_session(session_id, repair=False)
    return [n.seq for n in session.surface], [n.message.to_dict() for n in session.surface]


def same(a, b, session_id):
    return session_hash(a.header(session_id), a.read(session_id)) == session_hash(
        b.header(session_id), b.read(session_id)
    )


@pytest.fixture
def source(tmp_path):
    store = JsonlStore(tmp_path / "src")
    for sid, turns in (("alpha", 12), ("beta", 3), ("gamma", 0)):
        fill(store, sid, turns, tmp_path)
    store.kv_put("lineage", "alpha", {"chapters": ["alpha"]})
    store.blob_put("chapters/alpha/chapters/001-a.md", b"# A\n" * 1000)
    store.blob_put("decay/audit/alpha/1.json", b"{}\n")
    return store


def test_jsonl_to_sqlite_and_back(source, tmp_path):
    assert any(e.type == "compaction/summary" for e in source.read("alpha"))
    middle = open_store(f"sqlite:{tmp_path / 'mid'}")
    results = copy_sessions(source, middle, kv_namespaces=["lineage"])
    assert [(r.session, r.status) for r in results] == [("alpha", "copied"), ("beta", "copied"), ("gamma", "copied")]
    back = JsonlStore(tmp_path / "back")
    copy_sessions(middle, back, kv_namespaces=["lineage"])
    for sid in ("alpha", "beta", "gamma"):
        assert same(source, middle, sid) and same(source, back, sid)
        assert surface_of(back, sid, tmp_path) == surface_of(source, sid, tmp_path)
    assert back.kv_get("lineage", "alpha") == {"chapters": ["alpha"]}
    assert back.blob_list() == []  # blobs are copied only when asked for

    # the copy is byte-identical apart from batch markers: same canonical events
    assert [e.to_dict() for e in back.read("alpha")] == [e.to_dict() for e in source.read("alpha")]


@pytest.mark.postgres
def test_jsonl_to_postgres_and_back_with_the_command(source, tmp_path, capsys):
    with postgres_schema(postgres_dsn()) as dsn:
        assert main(["store", "copy", f"jsonl:{tmp_path / 'src'}", f"postgres:{dsn}", "--kv-namespace", "lineage"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["ok"] and [s["status"] for s in out["sessions"]] == ["copied"] * 3
        pg = open_store(f"postgres:{dsn}")
        for row in out["sessions"]:
            count, digest = session_hash(source.header(row["session"]), source.read(row["session"]))
            assert (row["events"], row["sha256"]) == (count, digest)
        assert pg.kv_get("lineage", "alpha") == {"chapters": ["alpha"]}
        assert main(["store", "copy", f"postgres:{dsn}", f"jsonl:{tmp_path / 'back'}"]) == 0
        capsys.readouterr()
        back = JsonlStore(tmp_path / "back")
        for sid in ("alpha", "beta", "gamma"):
            assert same(source, back, sid)
            assert surface_of(back, sid, tmp_path) == surface_of(source, sid, tmp_path)
        # a second run verifies and writes nothing
        assert main(["store", "copy", f"jsonl:{tmp_path / 'src'}", f"postgres:{dsn}"]) == 0
        assert [s["status"] for s in json.loads(capsys.readouterr().out)["sessions"]] == ["verified"] * 3
        pg.close()


class Interrupted(Exception):
    pass


class FailingStore:
    """Delegates to a store, failing the n-th append as a killed copy would."""

    def __init__(self, inner, fail_at):
        self.inner, self.fail_at, self.appends = inner, fail_at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def append(self, session_id, events, expected_seq):
        self.appends += 1
        if self.appends == self.fail_at:
            raise Interrupted
        self.inner.append(session_id, events, expected_seq)


def test_interrupted_copy_resumes_mid_session(source, tmp_path, monkeypatch):
    monkeypatch.setattr(store_cli, "CHUNK_EVENTS", 10)  # many chunks per session
    target = JsonlStore(tmp_path / "dst")
    with pytest.raises(Interrupted):
        copy_sessions(source, FailingStore(target, fail_at=4))
    have = target.next_seq("alpha")
    assert 0 < have < source.next_seq("alpha")
    # chunks end only where no compaction is open: the partial copy never shows half of one
    partial = list(target.read("alpha"))
    starts = {e.data["compaction_id"] for e in partial if e.type == "compaction/start"}
    ends = {e.data["compaction_id"] for e in partial if e.type == "compaction/end"}
    assert starts == ends
    surface_of(target, "alpha", tmp_path)  # replays
    results = copy_sessions(source, target)
    assert [(r.session, r.status) for r in results] == [("alpha", "resumed"), ("beta", "copied"), ("gamma", "copied")]
    assert results[0].appended == source.next_seq("alpha") - have
    for sid in ("alpha", "beta", "gamma"):
        assert same(source, target, sid)


def test_copy_picks_up_events_added_since(source, tmp_path):
    target = JsonlStore(tmp_path / "dst")
    copy_sessions(source, target)
    before = source.next_seq("beta")
    fill(source, "beta", 2, tmp_path)
    results = {r.session: r for r in copy_sessions(source, target)}
    assert results["beta"].status == "resumed" and results["beta"].appended == source.next_seq("beta") - before
    assert results["alpha"].status == "verified" and results["alpha"].appended == 0
    assert same(source, target, "beta")


def test_diverged_target_is_refused_and_left_alone(source, tmp_path):
    target = JsonlStore(tmp_path / "dst")
    copy_sessions(source, target, ["beta"])
    other = JsonlStore(tmp_path / "other")
    fill(other, "beta", 4, tmp_path)  # same id, different history
    before = [e.to_dict() for e in other.read("beta")]
    with pytest.raises(StoreError, match="beta"):
        copy_sessions(source, other, ["beta"])
    assert [e.to_dict() for e in other.read("beta")] == before


def test_bad_store_spec_is_explained(capsys):
    assert main(["store", "copy", "mysql:x", "jsonl:/tmp/x"]) == 2  # a malformed argument: usage error
    err = capsys.readouterr().err
    assert "jsonl:PATH, sqlite:PATH, postgres:DSN" in err


def test_blobs_are_copied_by_prefix_verified_and_skipped_when_present(source, tmp_path):
    from ctxkernel.store.cli import copy_blobs

    target = open_store(f"sqlite:{tmp_path / 'mid'}")
    copy_sessions(source, target, ["alpha"], blob_prefixes=["chapters/"])
    assert target.blob_list() == source.blob_list("chapters/")
    assert target.blob_get("chapters/alpha/chapters/001-a.md") == b"# A\n" * 1000
    assert copy_blobs(source, target, "chapters/") == 0  # resumed: nothing to write again
    source.blob_put("chapters/alpha/chapters/001-a.md", b"changed")
    assert copy_blobs(source, target, "") == 2  # the changed one and the decay record
    assert target.blob_get("chapters/alpha/chapters/001-a.md") == b"changed"
