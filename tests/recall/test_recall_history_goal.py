"""The session's goal is folded with the history index's windows (issue 21): finding it reads no
event before a snapshot, and it is the goal the scan of the user's instructions found before
(kept here as the reference): the harness's ``session/task`` goal, else the first substantive
user-written message among the first ``GOAL_SCAN``, else the first one."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, Source
from ctxkernel.events import append_op
from ctxkernel.recall import history as H
from ctxkernel.recall.history import History
from ctxkernel.session import EventSpec
from ctxkernel.task import substantive
from ctxkernel.testing import build_kernel

TEXTS = st.sampled_from(["hi", "ok", "", "  ", "fix the parser in src/parse.py", "go on please now", "thanks"])
SOURCES = st.sampled_from(["user", "user", "notice"])
MESSAGES = st.lists(st.tuples(TEXTS, SOURCES), max_size=70)


def reference_goal(session) -> int | None:
    """The scan goal() made before the goal was folded."""
    texts = []
    for event in session.events:
        if event.type == "user/message" and (event.data["message"].get("source") or {}).get("kind", "user") == "user":
            texts.append((event.seq, Message.from_dict(event.data["message"]).text))
    for seq, text in texts[: H.GOAL_SCAN]:
        if substantive(text):
            return seq
    return texts[0][0] if texts else None


def append_users(session, messages) -> None:
    specs = []
    for text, kind in messages:
        message = Message.user(text) if kind == "user" else Message.user(text, Source.plugin_form("t", "notice"))
        specs.append(EventSpec("user/message", {"message": message.to_dict()}, append_op()))
    if specs:
        session.append(specs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=MESSAGES, cut=st.integers(0, 70))
def test_folded_goal_is_the_scanned_goal_with_and_without_a_snapshot(messages, cut):
    with tempfile.TemporaryDirectory() as home:
        session = build_kernel(Path(home), fsync=False).open_session()
        session.emit("t", "start", {})  # a snapshot covers at least one event
        append_users(session, messages[:cut])
        folded = History.for_session(session).folded()
        append_users(session, messages[cut:])
        expected = reference_goal(session)
        full = History.for_session(session).goal()
        assert (None if full is None else full.seq) == expected
        # an index restored from a snapshot taken at the cut, then folded on over the tail
        restored = History(session)
        restored._restore(folded)
        restored.sync()
        goal = restored.goal()
        assert (None if goal is None else goal.seq) == expected
        assert restored._head == folded["cursor"], "goal() read the events before the snapshot"
        # a snapshot written before the goal was folded: goal() scans the instructions, as before
        older = History(session)
        older._restore({k: v for k, v in folded.items() if k != "goal_instruction"})
        older.sync()
        goal = older.goal()
        assert (None if goal is None else goal.seq) == expected


def test_a_task_goal_wins_and_a_cleared_one_gives_the_instruction_back(tmp_path):
    session = build_kernel(tmp_path, fsync=False).open_session()
    append_users(session, [("hi", "user"), ("refactor the store layer", "user")])
    session.set_task(goal="ship the release")
    history = History.for_session(session)
    assert history.goal_text() == "ship the release"
    session.set_task(goal="")
    assert History.for_session(session).goal_text() == "refactor the store layer"


def test_a_malformed_folded_goal_sets_the_snapshot_part_aside(tmp_path):
    session = build_kernel(tmp_path, fsync=False).open_session()
    append_users(session, [("hi", "user"), ("refactor the store layer", "user")])
    folded = History.for_session(session).folded()
    restored = History(session)
    restored._restore({**folded, "goal_instruction": ["3", 1]})
    assert restored.cursor == 0  # set aside: folded from the first event
    restored.sync()
    assert restored.goal_text() == "refactor the store layer"
