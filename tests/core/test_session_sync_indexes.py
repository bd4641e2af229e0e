"""At each step's end the session syncs the ``session.state`` entries whose class is a
:class:`ctxkernel.snapshot.SnapshotIndex` with a ``sync()``, deciding once per class (the
runtime Protocol check costs ~10 us an entry), with the same decision as the Protocol's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxkernel import Message
from ctxkernel.session import snapshots as session_module
from ctxkernel.snapshot import SnapshotIndex
from ctxkernel.testing import build_kernel


class Index:
    def __init__(self) -> None:
        self.synced = 0

    def folded(self) -> dict[str, Any]:
        return {"version": 1, "cursor": 1}

    def sync(self) -> None:
        self.synced += 1


class FoldedOnly:
    def folded(self) -> dict[str, Any]:
        return {}


class SyncOnly:
    def __init__(self) -> None:
        self.synced = 0

    def sync(self) -> None:
        self.synced += 1


class SyncNotCallable:
    sync = 3

    def folded(self) -> dict[str, Any]:
        return {}


def one_step(session: Any) -> None:
    session.user("do it")
    session.prepare_request()
    session.commit_reply(Message.assistant("done"))  # ends the step: the indexes are synced


def test_index_entries_are_synced_at_each_step_end_and_others_are_left_alone(tmp_path: Path) -> None:
    session = build_kernel(tmp_path).open_session()
    index, sync_only = Index(), SyncOnly()
    session.state.update(index=index, sync_only=sync_only, folded_only=FoldedOnly(), plain={"a": 1})
    session.state["odd"] = SyncNotCallable()
    one_step(session)
    one_step(session)
    assert index.synced == 2
    assert sync_only.synced == 0  # not a SnapshotIndex: no folded()


@pytest.mark.parametrize("cls", [Index, FoldedOnly, SyncOnly, SyncNotCallable, dict, list, int])
def test_the_class_decision_is_the_protocol_s_and_is_taken_once(cls: type, monkeypatch) -> None:
    monkeypatch.setattr(session_module, "_INDEX_CLASSES", {})
    value = cls()
    expected = isinstance(value, SnapshotIndex) and callable(getattr(value, "sync", None))
    assert session_module._syncs_as_index(value) is expected
    assert session_module._INDEX_CLASSES == {cls: expected}
    calls = 0
    real = type(SnapshotIndex).__subclasscheck__

    def counting(proto: Any, other: type) -> bool:
        nonlocal calls
        calls += 1
        return real(proto, other)

    monkeypatch.setattr(type(SnapshotIndex), "__subclasscheck__", counting)
    for _ in range(3):
        assert session_module._syncs_as_index(cls()) is expected
    assert calls == 0  # decided from the kept answer


def test_the_kept_decisions_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(session_module, "_INDEX_CLASSES", {})
    for n in range(2 * session_module._INDEX_CLASSES_MAX + 5):
        session_module._syncs_as_index(type(f"Made{n}", (), {})())
        assert len(session_module._INDEX_CLASSES) <= session_module._INDEX_CLASSES_MAX
