"""Every validating pattern matches the whole value: a trailing newline (which ``$`` lets through)
is refused, and ids holding digits take ASCII digits only, never more than int() reads."""

from __future__ import annotations

import pytest

from ctxkernel import Message
from ctxkernel.errors import StoreError
from ctxkernel.events import append_op
from ctxkernel.recall.history import History, HistoryError, _decode_cursor, _encode_cursor
from ctxkernel.session import EventSpec
from ctxkernel.store.base import SessionHeader, check_kv_name, check_session_id
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import build_kernel


@pytest.mark.parametrize("session_id", ["abc\n", "abc\r\n", "abc\n\n", "\nabc"])
def test_session_id_with_a_newline_is_refused_and_creates_no_file(tmp_path, session_id):
    with pytest.raises(StoreError, match="invalid session id"):
        check_session_id(session_id)
    store = JsonlStore(tmp_path)
    with pytest.raises(StoreError, match="invalid session id"):
        store.create(SessionHeader(id=session_id, created=""))
    assert not any((tmp_path / "sessions").glob("*")) if (tmp_path / "sessions").exists() else True


@pytest.mark.parametrize("kind", ["namespace", "key"])
def test_key_value_name_with_a_trailing_newline_is_refused(tmp_path, kind):
    with pytest.raises(StoreError, match=f"invalid key-value {kind}"):
        check_kv_name(kind, "notes\n")
    store = JsonlStore(tmp_path)
    namespace, key = ("ns\n", "k") if kind == "namespace" else ("ns", "k\n")
    with pytest.raises(StoreError, match=f"invalid key-value {kind}"):
        store.kv_put(namespace, key, 1)
    assert not (tmp_path / "kv").exists()


def test_valid_names_still_pass():
    assert check_session_id("abc") == "abc"
    assert check_kv_name("key", "a/b.c") == "a/b.c"


@pytest.fixture
def history(tmp_path):
    session = build_kernel(tmp_path).open_session()
    session.append([EventSpec("user/message", {"message": Message.user("hello").to_dict()}, append_op())])
    return History.for_session(session)


@pytest.mark.parametrize(
    "ref", ["item_٠", "item_0x", "item_" + "9" * 5000, "win_" + "9" * 5000, "todo_0_" + "9" * 5000]
)
def test_history_ids_are_matched_whole(history, ref):
    # surrounding whitespace is stripped on purpose (a model pads ids); what remains must match whole
    assert history.read_item(" item_0\n")["content"] == "hello"
    with pytest.raises(HistoryError):
        history.read_item(ref)


@pytest.mark.parametrize("pattern", ["_ITEM_ID", "_WIN_ID", "_TODO_ID", "_CURSOR"])
def test_history_patterns_refuse_a_trailing_newline(pattern):
    from ctxkernel.recall import history as module

    sample = {"_ITEM_ID": "item_1", "_WIN_ID": "win_1", "_TODO_ID": "todo_1_2", "_CURSOR": "c1.0123abcd"}[pattern]
    compiled = getattr(module, pattern)
    assert compiled.fullmatch(sample)
    assert not compiled.fullmatch(sample + "\n")


@pytest.mark.parametrize("ref", ["²", "1²", "9" * 5000])
def test_window_number_takes_ascii_digits_within_int_limits(history, ref):
    with pytest.raises(HistoryError, match="no window"):
        history.window(ref)


def test_cursor_with_a_trailing_newline_is_refused():
    cursor = _encode_cursor(5, "0123abcd")
    assert _decode_cursor(cursor, "0123abcd") == 5
    with pytest.raises(HistoryError, match="is not one this history returned"):
        _decode_cursor(cursor + "\n", "0123abcd")


def test_artifact_handle_with_a_trailing_newline_is_refused(tmp_path):
    artifacts = pytest.importorskip("ctxkernel_chapters.artifacts")
    from ctxkernel import StrategyBlobs
    from ctxkernel_chapters.storage import Archive

    archive = Archive(StrategyBlobs(JsonlStore(tmp_path), "chapters"))
    handle, _ = artifacts.store(archive, "root", "content")
    assert artifacts.load(archive, handle) == "content"
    with pytest.raises(artifacts.ArchiveError):
        artifacts.load(archive, handle + "\n")


def test_decay_anchor_argument_is_matched_whole():
    anchors = pytest.importorskip("ctxkernel_decay.anchors")
    assert anchors.parse_anchor("p12") == 12
    # surrounding whitespace is stripped on purpose; anything else after the number is refused
    assert anchors.parse_anchor("p12x") is None
    assert anchors.parse_anchor("p١٢") is None
    assert anchors.parse_anchor("p" + "9" * 5000) is None


def test_chapters_steward_setting_is_matched_whole():
    settings = pytest.importorskip("ctxkernel_chapters.settings")
    from pydantic import ValidationError

    model = next(
        v for v in vars(settings).values() if isinstance(v, type) and "steward" in getattr(v, "model_fields", {})
    )
    assert model(steward="compact").steward == "compact"
    with pytest.raises(ValidationError):
        model(steward="compact\n")
