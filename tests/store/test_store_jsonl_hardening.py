"""jsonl store under hostile conditions: a deleted lock file, a damaged complete line."""

from __future__ import annotations

import threading

import pytest

from ctxkernel.errors import ConflictError, CorruptionError, StoreError
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing.store import event, header


def test_deleting_lock_files_cannot_let_a_second_writer_in(tmp_path):
    """Writer A has checked the seq inside the lock and is about to write; the lock files are
    deleted and writer B (another store object, as another process would be) appends. B must not
    get in while A holds the lock: every acknowledged batch ends up in the log."""
    a, b = JsonlStore(tmp_path), JsonlStore(tmp_path)
    a.create(header("s"))
    a.append("s", [event(0), event(1)], 0)
    b.lock_timeout = 0.3  # B gives up instead of waiting for A; with the bug it never waits at all

    a_checked, release_a = threading.Event(), threading.Event()
    scan = a._scan

    def scan_then_pause(session_id, **kwargs):
        out = scan(session_id, **kwargs)
        a_checked.set()  # A's seq check is done: it is inside the lock, before its write
        assert release_a.wait(30)
        return out

    a._scan = scan_then_pause  # type: ignore[method-assign]
    acknowledged: dict[str, dict] = {}
    outcome: dict[str, BaseException] = {}

    def write(name, store, data):
        try:
            store.append("s", [event(2, data)], 2)
            acknowledged[name] = data
        except (StoreError, ConflictError) as exc:
            outcome[name] = exc

    writer_a = threading.Thread(target=write, args=("a", a, {"by": "a"}))
    writer_a.start()
    assert a_checked.wait(30)
    for lock_file in (tmp_path / "sessions").glob("*.lock"):
        lock_file.unlink()
    writer_b = threading.Thread(target=write, args=("b", b, {"by": "b"}))
    writer_b.start()
    writer_b.join(30)  # B is done (acknowledged or refused) before A writes: the race, pinned
    release_a.set()
    writer_a.join(30)

    assert not writer_a.is_alive() and not writer_b.is_alive()
    assert acknowledged.get("a") == {"by": "a"}, outcome
    assert "b" not in acknowledged and isinstance(outcome["b"], StoreError)
    events = list(JsonlStore(tmp_path).read("s"))
    assert [e.seq for e in events] == [0, 1, 2]
    for data in acknowledged.values():
        assert any(e.seq == 2 and e.data == data for e in events)


def test_a_waiting_writer_gets_a_conflict_after_the_holder_commits(tmp_path):
    a, b = JsonlStore(tmp_path), JsonlStore(tmp_path)
    a.create(header("s"))
    with a._locked("s"):
        b.lock_timeout = 0.05
        with pytest.raises(StoreError, match="held the session's lock"):
            b.append("s", [event(0)], 0)
    assert list(b.read("s")) == []  # nothing was written
    b.lock_timeout = 60
    a.append("s", [event(0)], 0)
    with pytest.raises(ConflictError):
        b.append("s", [event(0)], 0)


def test_a_log_replaced_while_waiting_is_refused(tmp_path, monkeypatch):
    store = JsonlStore(tmp_path)
    store.create(header("s"))
    store.append("s", [event(0)], 0)
    path = store.path("s")
    data = path.read_bytes()
    from ctxkernel.store import jsonl

    real_flock = jsonl.fcntl.flock

    def replace_then_lock(fd, operation):
        # while this writer waited, the file it opened was deleted and a copy put at the path
        path.unlink()
        path.write_bytes(data)
        monkeypatch.setattr(jsonl.fcntl, "flock", real_flock)
        return real_flock(fd, operation)

    monkeypatch.setattr(jsonl.fcntl, "flock", replace_then_lock)
    with pytest.raises(CorruptionError, match="deleted or replaced"):
        store.append("s", [event(1)], 1)
    assert path.read_bytes() == data


def _log_with_three_batches(tmp_path):
    store = JsonlStore(tmp_path)
    store.create(header("s"))
    for seq in range(3):
        store.append("s", [event(seq)], seq)
    return store.path("s")


def _flip_in_line(path, line_index):
    lines = path.read_bytes().split(b"\n")
    line = bytearray(lines[line_index])
    line[line.index(b'"seq"') + 1] ^= 0x20  # "seq" -> "Seq": one bit, still JSON, an unknown key
    lines[line_index] = bytes(line)
    path.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("line_index", [-2, -3], ids=["last line", "line before it"])
def test_a_damaged_complete_line_is_corruption_wherever_it_is(tmp_path, line_index):
    path = _log_with_three_batches(tmp_path)
    _flip_in_line(path, line_index)  # index -1 is the empty string after the final newline
    before = path.read_bytes()
    with pytest.raises(CorruptionError, match="corrupt, not torn"):
        JsonlStore(tmp_path).repair("s")
    with pytest.raises(CorruptionError):
        list(JsonlStore(tmp_path).read("s"))
    assert path.read_bytes() == before  # refused: nothing rewritten


def test_a_damaged_last_line_that_is_not_json_is_corruption_too(tmp_path):
    path = _log_with_three_batches(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-5] + b"\xff" + data[-4:])
    with pytest.raises(CorruptionError):
        JsonlStore(tmp_path).repair("s")


def test_an_unterminated_tail_is_still_a_torn_write(tmp_path):
    path = _log_with_three_batches(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # the last line lost its end and its newline
    report = JsonlStore(tmp_path).repair("s")
    assert report.repaired and "torn" in report.reason
    assert [e.seq for e in JsonlStore(tmp_path).read("s")] == [0, 1]


def test_a_header_line_naming_another_session_is_corruption(tmp_path):
    """Session a's log with b's header line opened, and appended to, session b."""
    from ctxkernel import Kernel
    from ctxkernel.testing import make_profile

    store = JsonlStore(tmp_path / "home")
    for session_id in ("a", "b"):
        store.create(header(session_id))
        store.append(session_id, [event(0)], 0)
    path = store.path("a")
    path.write_bytes(store.path("b").read_bytes().partition(b"\n")[0] + b"\n" + path.read_bytes().partition(b"\n")[2])
    before = path.read_bytes(), store.path("b").read_bytes()
    fresh = JsonlStore(tmp_path / "home")
    with pytest.raises(CorruptionError, match=r"a\.jsonl:1: the header of session 'a' names session 'b'"):
        fresh.header("a")
    with pytest.raises(CorruptionError, match="names session 'b'"):
        list(JsonlStore(tmp_path / "home").read("a"))
    kernel = Kernel(make_profile(), store=JsonlStore(tmp_path / "home"), home=tmp_path, entry_points=False)
    with pytest.raises(CorruptionError, match="names session 'b'"):
        kernel.open_session("a")
    assert (path.read_bytes(), store.path("b").read_bytes()) == before


@pytest.mark.parametrize("what", ["create", "kv_put", "blob_put", "lease"])
def test_a_link_planted_at_a_temporary_name_is_not_written_through(tmp_path, monkeypatch, what):
    # a temporary file's name was the process and thread id: a link planted there redirected
    # the bytes to wherever it pointed
    from export_support import plant_temporary_links

    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    home = tmp_path / "home"
    store = JsonlStore(home)
    if what == "create":
        plant_temporary_links(home / "sessions", "s.jsonl", victim, monkeypatch)
        store.create(header("s"))
        assert store.header("s").id == "s"
    elif what == "kv_put":
        plant_temporary_links(home / "kv" / "ns", "k.json", victim, monkeypatch)
        store.kv_put("ns", "k", {"v": 1})
        assert store.kv_get("ns", "k") == {"v": 1}
    elif what == "blob_put":
        plant_temporary_links(home / "blobs", "b", victim, monkeypatch)
        store.blob_put("b", b"blob bytes")
        assert store.blob_get("b") == b"blob bytes"
    else:
        plant_temporary_links(home / "leases", "l.json", victim, monkeypatch)
        assert store.lease_acquire("l", {"token": "t1"}, 30).acquired
    assert victim.read_bytes() == b"keep me"


def test_a_link_planted_at_a_snapshot_is_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    store = JsonlStore(tmp_path / "home")
    store.create(header("s"))
    store.append("s", [event(0), event(1)], 0)
    store.snapshot_path("s").parent.mkdir(parents=True, exist_ok=True)
    store.snapshot_path("s").symlink_to(victim)
    with pytest.raises(StoreError, match="cannot write the snapshot"):
        store.snapshot_put("s", 2, b"snapshot bytes")
    assert victim.read_bytes() == b"keep me"


@pytest.mark.parametrize("value", [b'"no"', b"false", b"0   "])
def test_a_more_other_than_true_is_corruption_naming_the_line(tmp_path, value):
    # "more": "no" was taken as true (the batch ran on), false or 0 ended a batch silently
    store = JsonlStore(tmp_path)
    store.create(header("s"))
    store.append("s", [event(0), event(1)], 0)
    store.append("s", [event(2)], 2)
    path = store.path("s")
    path.write_bytes(path.read_bytes().replace(b'"more":true', b'"more":' + value))
    before = path.read_bytes()
    for call in (lambda s: s.repair("s"), lambda s: list(s.read("s")), lambda s: s.next_seq("s")):
        with pytest.raises(CorruptionError, match=r's\.jsonl:2: "more" is .*; accepted: true'):
            call(JsonlStore(tmp_path))
    assert path.read_bytes() == before


def test_a_more_changed_under_a_reader_is_corruption(tmp_path):
    # a store that scanned the log reads its lines again by offset: the same check applies there
    store = JsonlStore(tmp_path)
    store.create(header("s"))
    store.append("s", [event(0), event(1)], 0)
    assert store.next_seq("s") == 2
    path = store.path("s")
    path.write_bytes(path.read_bytes().replace(b'"more":true', b'"more":"no"'))
    with pytest.raises(CorruptionError, match=r's\.jsonl:2: "more" is \'no\''):
        list(store.read("s"))


#: header fields of another type than a store writes, each taken as it was (true as version 1)
BAD_HEADER_FIELDS = [
    ("created", 5, "a string"),
    ("extra", [1], "an object or null"),
    ("parent", 7, "a session id string or null"),
    ("origin", {"o": 1}, "a string or null"),
    ("profile", 2.5, "a profile name string or null"),
    ("format_version", True, "unsupported session format_version True"),
]


@pytest.mark.parametrize(("field", "value", "accepted"), BAD_HEADER_FIELDS)
def test_a_header_field_of_another_type_is_corruption(tmp_path, field, value, accepted):
    import orjson

    store = JsonlStore(tmp_path)
    store.create(header("s", parent="p", origin="o", profile="basic", extra={"k": 1}))
    store.append("s", [event(0)], 0)
    path = store.path("s")
    first, _, rest = path.read_bytes().partition(b"\n")
    path.write_bytes(orjson.dumps({**orjson.loads(first), field: value}) + b"\n" + rest)
    for call in (lambda s: s.header("s"), lambda s: list(s.read("s"))):
        with pytest.raises(CorruptionError, match=rf"s\.jsonl:1: .*{accepted}"):
            call(JsonlStore(tmp_path))


def test_a_folder_in_place_of_a_log_or_kv_entry_is_corruption_naming_it(tmp_path):
    # each raised a bare IsADirectoryError
    store = JsonlStore(tmp_path)
    store.create(header("s"))
    store.path("s").unlink()
    store.path("s").mkdir()
    calls = {
        "header": lambda s: s.header("s"),
        "read": lambda s: list(s.read("s")),
        "next_seq": lambda s: s.next_seq("s"),
        "append": lambda s: s.append("s", [event(0)], 0),
        "repair": lambda s: s.repair("s"),
    }
    for name, call in calls.items():
        with pytest.raises(CorruptionError, match=r"s\.jsonl: the log of session s is a folder.*accepted: a regular"):
            call(JsonlStore(tmp_path))
        assert store.path("s").is_dir(), name
    store.kv_put("ns", "k", 1)
    store.kv_put("ns", "a/" * 99 + "a", 2)  # kept under a digest: kv_list reads its file itself
    for path in (tmp_path / "kv" / "ns").iterdir():
        path.unlink()
        path.mkdir()
        key = "k" if path.name == "k.json" else "a/" * 99 + "a"
        for call in (lambda s: s.kv_list("ns"), lambda s, key=key: s.kv_get("ns", key)):
            with pytest.raises(CorruptionError, match=rf"{path.name}: a folder where a key-value entry should be"):
                call(JsonlStore(tmp_path))
        path.rmdir()


def test_a_log_turned_into_a_folder_after_a_scan_is_corruption(tmp_path):
    store = JsonlStore(tmp_path)
    store.create(header("s"))
    store.append("s", [event(0)], 0)
    assert store.next_seq("s") == 1
    path = store.path("s")
    path.unlink()
    path.mkdir()
    (path / "filler").write_bytes(b"x" * 100)
    with pytest.raises(CorruptionError, match="is a folder"):
        list(store.read("s"))


def test_a_log_or_kv_entry_linked_outside_the_store_is_refused(tmp_path):
    # a log linked to a file outside was read and appended to; kv_get read a linked file or
    # namespace folder outside kv/ (and kv_put, kv_delete wrote and removed files there)
    elsewhere = JsonlStore(tmp_path / "elsewhere")
    elsewhere.create(header("s"))
    elsewhere.append("s", [event(0)], 0)
    elsewhere.kv_put("ns", "k", {"secret": 1})
    outside = elsewhere.path("s").read_bytes(), (tmp_path / "elsewhere" / "kv" / "ns" / "k.json").read_bytes()
    home = tmp_path / "home"
    store = JsonlStore(home)
    store.create(header("t"))
    (home / "sessions" / "s.jsonl").symlink_to(elsewhere.path("s"))
    for call in (
        lambda s: s.header("s"),
        lambda s: list(s.read("s")),
        lambda s: s.append("s", [event(1)], 1),
        lambda s: s.repair("s"),
    ):
        with pytest.raises(StoreError, match=r"session s: .*s\.jsonl resolves outside the store's sessions folder"):
            call(JsonlStore(home))
    (home / "kv" / "mine").mkdir(parents=True)
    (home / "kv" / "mine" / "k.json").symlink_to(tmp_path / "elsewhere" / "kv" / "ns" / "k.json")
    (home / "kv" / "ns").symlink_to(tmp_path / "elsewhere" / "kv" / "ns")
    for call in (
        lambda s: s.kv_get("mine", "k"),
        lambda s: s.kv_list("mine"),
        lambda s: s.kv_get("ns", "k"),
        lambda s: s.kv_list("ns"),
        lambda s: s.kv_put("ns", "new", 1),
        lambda s: s.kv_delete("ns", "k"),
    ):
        with pytest.raises(StoreError, match="resolves outside the store's kv folder"):
            call(JsonlStore(home))
    assert (elsewhere.path("s").read_bytes(), (tmp_path / "elsewhere" / "kv" / "ns" / "k.json").read_bytes()) == outside
    assert sorted(p.name for p in (tmp_path / "elsewhere" / "kv" / "ns").iterdir()) == ["k.json"]
    assert [e.seq for e in store.read("t")] == []  # the store's own sessions still work


def test_a_long_name_entry_holding_another_name_is_corruption(tmp_path):
    # a long name is kept under its digest with the name inside; an entry whose name is another
    # (copied over, or edited) answered kv_get with the other name's value
    store = JsonlStore(tmp_path)
    mine, other = "a/" * 99 + "a", "b/" * 99 + "b"
    store.kv_put("ns", mine, 1)
    store.kv_put("ns", other, 2)
    (entry,) = [p for p in (tmp_path / "kv" / "ns").glob("a*.json")]
    (theirs,) = [p for p in (tmp_path / "kv" / "ns").glob("b*.json")]
    entry.write_bytes(theirs.read_bytes())
    with pytest.raises(CorruptionError, match=r"holds the entry of another name"):
        store.kv_get("ns", mine)
    with pytest.raises(CorruptionError, match=r"holds the entry of another name"):
        store.kv_list("ns")
    assert store.kv_get("ns", other) == 2
